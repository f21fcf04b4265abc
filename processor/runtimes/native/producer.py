"""The worker's transactional producer: one object owns begin, produce, send offsets,
commit and abort, with librdkafka's known hangs bounded, retries under their limits, a
full local queue and fatal errors turned into `ClientBroken` (the worker restarts in
place).

A worker that gives up on its clients keeps them referenced until the process image is
replaced: dropping the last reference runs their destructors, and `rd_kafka_destroy`
blocks for as long as a call of theirs hangs (seen: a broker restart froze the worker
there, never reaching its restart). The worker holds this object until it exits.

A producer replaced while the worker goes on (`retire`) is closed in a thread of its
own once its hung call has returned, never before: kept until the process ended, each
one held its librdkafka handle and buffers, and a worker's RSS rose 5-10 MB at every
broker restart that hung a call (a soak life that grew 12.8 % after its warm-up).
"""

import logging
import threading
import time
from collections.abc import Callable

from confluent_kafka import KafkaError, KafkaException, Message, Producer, TopicPartition

from processor.kafka.config import KafkaSettings
from processor.runtimes.errors import ClientBroken, ClientHung

# How long past its own timeout a transactional call may take before it counts as hung.
HUNG_AFTER_S = 5.0
# send_offsets_to_transaction's own timeout. It takes milliseconds when it works; when
# the group coordinator moved it can block for good (librdkafka #5511), and every second
# of this bound is a second of the failover (the producer is replaced after it).
SEND_OFFSETS_TIMEOUT_S = 2.0
# How long past its own timeout send_offsets_to_transaction may take.
SEND_OFFSETS_HUNG_AFTER_S = 1.0
QUEUE_FULL_LIMIT_S = 60.0

Headers = list[tuple[str, str | bytes | None]]
_PURGED = {KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT}
log = logging.getLogger("runstate.worker")


def bounded(
    what: str, call: Callable[[], object], timeout_s: float, grace_s: float | None = None
) -> None:
    """Run a blocking librdkafka call, raising ClientHung if it outlives its timeout by
    `grace_s` (HUNG_AFTER_S unless given)."""
    grace_s = HUNG_AFTER_S if grace_s is None else grace_s
    done = threading.Event()
    failure: list[BaseException] = []

    def target() -> None:
        try:
            call()
        except BaseException as exc:  # re-raised in the caller's thread
            failure.append(exc)
        finally:
            done.set()

    threading.Thread(target=target, name=f"runstate-{what}", daemon=True).start()
    if not done.wait(timeout_s + grace_s):
        raise ClientHung(f"{what} has not returned after {timeout_s + grace_s:.0f}s", done)
    if failure:
        raise failure[0]


def abort_transaction(producer: Producer, attempts: int = 3, timeout_s: float = 10.0) -> None:
    """Abort the open transaction. An abort that times out says "retry call to resume"
    and stays in progress: it is called again (left in progress, the next
    begin_transaction fails _CONFLICT, as after a broker restart). Still not aborted, or
    fatal: ClientBroken, and the worker restarts in place."""
    for _ in range(attempts):
        try:
            bounded("abort_transaction", lambda: producer.abort_transaction(timeout_s), timeout_s)
            return
        except KafkaException as exc:
            error = exc.args[0]
            if error.fatal():
                raise ClientBroken(f"the producer cannot abort: {exc}") from exc
            if not error.retriable():  # e.g. nothing to abort any more
                log.warning("abort_transaction: %s", exc)
                return
            log.warning("abort_transaction did not finish (%s); calling it again", exc)
    raise ClientBroken(f"the transaction was not aborted after {attempts} attempts")


class TransactionalProducer:
    """A transactional producer and what its open transaction delivered."""

    def __init__(
        self,
        settings: KafkaSettings,
        transactional_id: str,
        transaction_timeout_ms: int,
        batch_size: int | None = None,
    ) -> None:
        # `batch_size`: at most what one batch of the topics written takes (the broker
        # refuses a larger batch whole); None: the client's.
        batching = {} if batch_size is None else {"batch.size": batch_size}
        self.client = Producer(
            settings.client(
                {
                    "transactional.id": transactional_id,
                    "on_delivery": self._on_delivery,
                    **batching,
                },
                defaults={
                    # A dead worker's open transaction holds back read_committed
                    # consumers until it times out: keep that short (as Kafka Streams).
                    "transaction.timeout.ms": transaction_timeout_ms,
                    "linger.ms": 5,
                    "compression.type": "lz4",
                },
            )
        )
        self.open = False
        self.committing = False  # a commit travels (start_commit): no produce until over
        self.began_at = 0.0
        self._delivered: dict[tuple[str, int], int] = {}
        self._delivery_error: KafkaError | None = None

    def init(self) -> None:
        """Fence (abort) whatever a previous run of this transactional id left open.
        ClientBroken when it cannot, ClientHung when the call outlives its timeout."""
        client = self.client
        try:
            bounded("init_transactions", lambda: client.init_transactions(60), 60)
        except KafkaException as exc:
            raise ClientBroken(f"the producer could not start its transactions: {exc}") from exc

    def begin(self) -> None:
        if not self.open:
            self.client.begin_transaction()
            self.open = True
            self.began_at = time.monotonic()

    def produce(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        partition: int,
        headers: Headers | None = None,
    ) -> None:
        """Into the open transaction (begun if need be), to an explicit partition; a value
        of None is a tombstone."""
        assert not self.committing, "produced while the previous transaction commits"
        self.begin()
        full_since: float | None = None
        while True:
            try:
                self.client.produce(
                    topic, value=value, key=key, partition=partition, headers=headers
                )
                return
            except BufferError:
                # Local queue full: let deliveries drain. One that never drains (a producer
                # that lost its broker for good) must not hold the loop, deaf to SIGTERM.
                full_since = full_since or time.monotonic()
                if time.monotonic() - full_since > QUEUE_FULL_LIMIT_S:
                    raise ClientHung(
                        f"the producer's queue stayed full for {QUEUE_FULL_LIMIT_S:.0f}s"
                    ) from None
                self.client.poll(0.05)

    def start_commit(
        self, offsets: list[TopicPartition], group_metadata: object
    ) -> "CommitInFlight":
        """`commit_here`, in another thread: a commit is mostly round trips to the brokers, and
        the worker's loop only waited for them (4 % of its time in a profile of a drain
        on a quiet machine, 13-22 % on a loaded one). Nothing may be produced until it
        is over (`wait`)."""
        self.committing = True
        return CommitInFlight(self, offsets, group_metadata)

    def commit_here(self, offsets: list[TopicPartition], group_metadata: object) -> None:
        """Flush, add the consumed `offsets` (EOS v2: with the group's metadata) and commit,
        on the calling thread. Raises KafkaException when the transaction cannot commit;
        abort it then."""
        if self.client.flush(30) > 0:
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "flush timed out"))
        if self._delivery_error is not None:
            raise KafkaException(self._delivery_error)
        if offsets:  # a transaction of fired timers alone consumed nothing
            client = self.client
            bounded(
                "send_offsets_to_transaction",
                lambda: client.send_offsets_to_transaction(
                    offsets, group_metadata, SEND_OFFSETS_TIMEOUT_S
                ),
                SEND_OFFSETS_TIMEOUT_S,
                SEND_OFFSETS_HUNG_AFTER_S,
            )
        commit = self.client.commit_transaction
        for attempt in range(5):
            try:
                bounded("commit_transaction", lambda: commit(30), 30)
                break
            except KafkaException as exc:
                if exc.args[0].retriable() and attempt < 4:
                    continue
                raise
        self.open = False

    def next_offset(self, topic: str, partition: int) -> int | None:
        """After a commit: the offset after the last record delivered there, if any."""
        last = self._delivered.get((topic, partition))
        return None if last is None else last + 1

    def abort(self) -> None:
        abort_transaction(self.client)
        self.open = False
        self.forget()

    def forget(self) -> None:
        """Drop what the last transaction delivered (the next one starts clean)."""
        self._delivered.clear()
        self._delivery_error = None

    def poll(self, timeout: float = 0) -> None:
        self.client.poll(timeout)

    def close(self) -> None:
        if self.open:
            self.abort()
        self.client.flush(10)

    def retire(self, hung: threading.Event | None) -> threading.Thread:
        """Given up on (replaced by a producer that fenced it): closed in a thread of its
        own once `hung`, its call still running, has returned (None: none is). Its
        transaction is over, so what it still queues is purged, not delivered. A call that
        never returns keeps its handle, and that thread, until the process ends."""

        def close() -> None:
            since, client = time.monotonic(), self.client
            try:
                # What it still queues goes at once (purge and poll are thread-safe, a
                # running call or not): the reports of purged messages hold them until
                # served. Only the handle waits for the call.
                client.purge(blocking=False)
                while hung is not None and not hung.wait(1.0):
                    client.poll(0)
                client.poll(0)
                client.close()
            except (KafkaException, RuntimeError) as exc:  # fenced, or closed already
                log.debug("closing a retired producer: %s", exc)
            log.info(
                "a replaced producer closed, %.1f s after it was given up on",
                time.monotonic() - since,
            )

        closing = threading.Thread(target=close, name="runstate-retired-producer", daemon=True)
        closing.start()
        return closing

    def _on_delivery(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            # Purged by an abort: reports of the transaction that is over, which arrive
            # late; they made the next transaction's commit fail for nothing.
            if err.code() not in _PURGED:
                self._delivery_error = err
            return
        key = (msg.topic() or "", msg.partition() or 0)
        offset = msg.offset() or 0
        if offset >= self._delivered.get(key, -1):
            self._delivered[key] = offset


class CommitInFlight:
    """A transaction's commit travelling in a thread of its own (every call in it is
    bounded); `wait` joins it and raises what it raised."""

    def __init__(
        self, producer: TransactionalProducer, offsets: list[TopicPartition], metadata: object
    ) -> None:
        self._producer = producer
        self._failure: BaseException | None = None
        self._thread = threading.Thread(
            target=self._travel, args=(offsets, metadata), name="runstate-commit", daemon=True
        )
        self._thread.start()

    def _travel(self, offsets: list[TopicPartition], metadata: object) -> None:
        try:
            self._producer.commit_here(offsets, metadata)
        except BaseException as exc:  # re-raised by wait(), in the loop's thread
            self._failure = exc

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()

    def wait(self) -> None:
        self._thread.join()
        self._producer.committing = False
        if self._failure is not None:
            raise self._failure
