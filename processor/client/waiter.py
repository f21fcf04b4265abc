"""The outcome waiters: the blocking one (one consumer thread hands each outcome to
whoever waits for its proposal id) and the asyncio one (a
`confluent_kafka.aio.AIOConsumer` read in one task; a proposal's outcome resolves the
future its `wait()` awaits).

A client's waiter is scoped: it reads only the output partitions of the runs the client
proposes for, each assigned when a run of it is first proposed for, at an offset read
from the broker *before* the proposal is produced (`expect`), so an answer that comes
before anyone calls `wait()` is still read. It keeps only the outcomes of proposal ids
that were registered, and forgets each once taken. `follow_all=True` (the default when
constructed directly, as tools and the demo do) reads every partition from the moment
it starts and keeps every outcome, at most `max_unclaimed` of them.
"""

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition
from confluent_kafka.aio import AIOConsumer

from processor.kafka.config import KafkaSettings
from processor.kafka.readback import watermarks
from processor.kafka.topics import TopicNames

from .core import (
    MAX_UNCLAIMED,
    Deadline,
    Outcome,
    OutcomeBook,
    answering_partitions,
    consumer_config,
    output_topics,
    parse_outcome,
    raw_proposal_id,
    timeout_message,
    unavailable,
)
from .errors import NotAwaited, NotFound, Timeout


class Pins:
    """Where each followed output partition starts: its high watermark when first
    asked for. One blocking consumer of its own, so pinning never waits on the reading
    thread's consumer."""

    def __init__(self, settings: KafkaSettings, topics: TopicNames) -> None:
        self.settings = settings
        self.topics = topics
        self._consumer: Consumer | None = None
        self._partitions: int | None = None
        self._lock = threading.Lock()

    @property
    def known_partitions(self) -> int | None:
        """The partition count once read (no lock: an event loop may ask)."""
        return self._partitions

    def partitions(self, deadline: Deadline) -> int:
        """The proposals topic's partition count (every output topic has the same)."""
        with self._lock:
            return self._partition_count(deadline)

    def _partition_count(self, deadline: Deadline) -> int:
        if self._partitions is None:
            topic = self.topics.proposals
            try:
                meta = self._client().list_topics(topic, timeout=deadline.left())
            except KafkaException as exc:
                raise unavailable(
                    self.settings, "reading topic metadata", deadline.timeout, exc
                ) from exc
            found = meta.topics.get(topic)
            if found is None or found.error is not None or not found.partitions:
                error = None if found is None else found.error
                if error is not None and error.code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                    raise unavailable(
                        self.settings, "reading topic metadata", deadline.timeout, error
                    )
                raise NotFound(
                    f"topic '{topic}' does not exist: create the topics (runstate topics "
                    "create), or give the prefix they were created with"
                )
            self._partitions = len(found.partitions)
        return self._partitions

    def pin(
        self, key: bytes, followed: dict[tuple[str, int], int], deadline: Deadline
    ) -> list[TopicPartition]:
        """The output partitions answering proposals keyed `key` not followed yet, each
        at its high watermark now; recorded in `followed` before the lock is let go, so a
        second caller for the same partition never produces before the first one's pin
        exists."""
        with self._lock:
            n = self._partition_count(deadline)
            new = []
            for topic, p in answering_partitions(self.topics, key, n):
                if (topic, p) in followed:
                    continue
                tp = TopicPartition(topic, p)
                try:
                    _, high = watermarks(self._client(), tp, timeout=max(0.1, deadline.left()))
                except KafkaException as exc:
                    raise unavailable(
                        self.settings, f"reading {topic}[{p}]'s end", deadline.timeout, exc
                    ) from exc
                followed[(topic, p)] = high
                new.append(TopicPartition(topic, p, high))
            return new

    def _client(self) -> Consumer:
        if self._consumer is None:
            self._consumer = Consumer(consumer_config(self.settings))
        return self._consumer

    def close(self) -> None:
        with self._lock:
            if self._consumer is not None:
                self._consumer.close()
                self._consumer = None


class OutcomeWaiter:
    """Follows the transitions, rejections and heartbeats topics (read_committed) and
    hands each outcome to whoever waits for its proposal id."""

    def __init__(
        self,
        settings: KafkaSettings,
        topics: TopicNames,
        *,
        from_beginning: bool = False,
        on_outcome: Callable[[Outcome], None] | None = None,
        follow_all: bool = True,
        max_unclaimed: int = MAX_UNCLAIMED,
        timeout: float = 30.0,
    ) -> None:
        self._settings = settings
        self._topics = topics
        self._on_outcome = on_outcome
        self._book = OutcomeBook(max_unclaimed, keep_all=follow_all)
        self._pins = Pins(settings, topics)
        self._followed: dict[tuple[str, int], int] = {}
        self._to_assign: list[TopicPartition] = []
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._error: Exception | None = None
        self.follow_all = follow_all
        self.read = 0  # outcome records read, kept or not
        self._consumer = Consumer(consumer_config(settings))
        if follow_all:
            # Pin the start positions now, before anything is proposed: no outcome of a
            # later proposal can slip past.
            deadline = Deadline(timeout)
            n = self._pins.partitions(deadline)
            for topic in output_topics(topics):
                for p in range(n):
                    tp = TopicPartition(topic, p)
                    try:
                        low, high = watermarks(
                            self._consumer, tp, timeout=max(0.1, deadline.left())
                        )
                    except KafkaException as exc:
                        raise unavailable(
                            settings, "reading the output topics' ends", timeout, exc
                        ) from exc
                    self._followed[(topic, p)] = low if from_beginning else high
                    self._to_assign.append(TopicPartition(topic, p, self._followed[(topic, p)]))
        self._thread = threading.Thread(target=self._loop, name="runstate-outcomes", daemon=True)
        self._thread.start()

    # -- registering -----------------------------------------------------------
    def expect(self, run_id: str | bytes, proposal_id: str, timeout: float = 30.0) -> None:
        """Register interest in a proposal of `run_id` (or keyed by these bytes) before it
        is produced: its outcome will be kept for `wait()`, however soon it comes."""
        with self._cond:
            self._book.expect(proposal_id)
        if self.follow_all:
            return
        key = run_id.encode() if isinstance(run_id, str) else run_id
        new = self._pins.pin(key, self._followed, Deadline(timeout))
        if new:
            with self._cond:
                self._to_assign.extend(new)

    def expect_if_followed(self, key: bytes, proposal_id: str) -> bool:
        """Register interest without a word to the broker: only when the partition
        answering `key` is followed already (True then)."""
        n = self._pins.known_partitions
        if not self.follow_all and (
            n is None
            or not all(tp in self._followed for tp in answering_partitions(self._topics, key, n))
        ):
            return False
        with self._cond:
            self._book.expect(proposal_id)
        return True

    def expecting(self, proposal_id: str) -> bool:
        with self._cond:
            return self._book.expecting(proposal_id)

    def partitions(self, timeout: float = 30.0) -> int:
        return self._pins.partitions(Deadline(timeout))

    # -- reading ---------------------------------------------------------------
    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                with self._cond:
                    assign, self._to_assign = self._to_assign, []
                if assign:
                    self._consumer.incremental_assign(assign)
                batch = self._consumer.consume(num_messages=1_000, timeout=0.05)
                records = [(m.topic() or "", m.value() or b"") for m in batch if m.error() is None]
                if not records:
                    continue
                every = self.follow_all or self._on_outcome is not None
                with self._cond:
                    self.read += len(records)
                    if not every:  # what nobody registered is dropped unparsed (cheaper)
                        wanted = [r for r in records if self._book.wanted(raw_proposal_id(r[1]))]
                        self._book.dropped += len(records) - len(wanted)
                        records = wanted
                parsed = [parse_outcome(self._topics, topic, value) for topic, value in records]
                if parsed:
                    with self._cond:
                        for outcome in parsed:
                            self._book.offer(outcome)
                        self._cond.notify_all()
                    if self._on_outcome is not None:
                        for outcome in parsed:
                            self._on_outcome(outcome)
        except Exception as exc:  # surfaced to waiters rather than lost in a thread
            with self._cond:
                self._error = exc
                self._cond.notify_all()
        finally:
            self._consumer.close()

    def wait(self, proposal_id: str, timeout: float) -> Outcome:
        """The proposal's outcome, handed over once: in a scoped waiter a second wait
        for it is NotAwaited, like a wait for a proposal id never registered."""
        deadline = time.monotonic() + timeout
        with self._cond:
            if not self.follow_all and not self._book.expecting(proposal_id):
                raise NotAwaited(
                    f"proposal '{proposal_id}' is not awaited here: it was not proposed "
                    "through this client, its outcome was already handed over, or more "
                    f"than {self._book.capacity} proposals went unclaimed since "
                    "(max_unclaimed=); for proposals others send, follow every partition "
                    "with client.waiter() before they are sent"
                )
            while (outcome := self._book.take(proposal_id)) is None:
                if self._error is not None:
                    raise self._error
                left = deadline - time.monotonic()
                if left <= 0:
                    raise Timeout(timeout_message(proposal_id, timeout))
                self._cond.wait(left)
            return outcome

    # -- what it holds (for tests and benchmarks) -------------------------------
    def kept(self) -> int:
        """Proposal ids held: registered and not handed over yet."""
        with self._cond:
            return len(self._book)

    def dropped(self) -> int:
        """Outcomes read and dropped at once: nobody here had registered them."""
        with self._cond:
            return self._book.dropped

    def followed(self) -> list[tuple[str, int]]:
        return sorted(self._followed)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._pins.close()


class AsyncOutcomeWaiter:
    """The scoped waiter for one event loop: reads the output partitions of the runs
    registered through `expect`, keeps the outcomes of registered proposal ids only,
    hands each over once."""

    def __init__(
        self, settings: KafkaSettings, topics: TopicNames, *, max_unclaimed: int = MAX_UNCLAIMED
    ) -> None:
        self._settings = settings
        self._topics = topics
        self._book = OutcomeBook(max_unclaimed)
        self._pins = Pins(settings, topics)
        self._followed: dict[tuple[str, int], int] = {}
        self._to_assign: list[TopicPartition] = []
        self._waiting: dict[str, asyncio.Future[Outcome]] = {}
        self._consumer = AIOConsumer(consumer_config(settings), max_workers=2)
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="runstate-outcomes")
        self._error: BaseException | None = None
        self._partitions: int | None = None
        self.read = 0

    async def expect(self, run_id: str, proposal_id: str, timeout: float) -> None:
        """Register interest in a proposal of `run_id` before it is produced."""
        self._book.expect(proposal_id)
        if self._partitions is not None and all(
            tp in self._followed
            for tp in answering_partitions(self._topics, run_id.encode(), self._partitions)
        ):
            return  # already pinned: no thread needed
        new = await asyncio.to_thread(
            self._pins.pin, run_id.encode(), self._followed, Deadline(timeout)
        )
        self._partitions = self._pins.known_partitions  # read by pin(), never None here
        self._to_assign.extend(new)

    def expecting(self, proposal_id: str) -> bool:
        return self._book.expecting(proposal_id)

    async def partitions(self, timeout: float) -> int:
        if self._partitions is None:
            self._partitions = await asyncio.to_thread(self._pins.partitions, Deadline(timeout))
        return self._partitions

    async def _loop(self) -> None:
        try:
            while True:
                assign, self._to_assign = self._to_assign, []
                if assign:
                    await self._consumer.incremental_assign(assign)
                batch: list[Message] = await self._consumer.consume(
                    num_messages=1_000, timeout=0.05
                )
                for msg in batch:
                    if msg.error() is not None:
                        continue
                    self.read += 1
                    value = msg.value() or b""
                    if not self._book.wanted(raw_proposal_id(value)):
                        self._book.dropped += 1  # nobody registered it: dropped unparsed
                        continue
                    outcome = parse_outcome(self._topics, msg.topic() or "", value)
                    if self._book.offer(outcome) and outcome.proposal_id in self._waiting:
                        self._hand_over(outcome.proposal_id)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # surfaced to waiters rather than lost in a task
            self._error = exc
            for future in self._waiting.values():
                if not future.done():
                    future.set_exception(exc)

    def _hand_over(self, proposal_id: str) -> None:
        future = self._waiting.pop(proposal_id)
        outcome = self._book.take(proposal_id)
        if outcome is not None and not future.done():
            future.set_result(outcome)

    async def wait(self, proposal_id: str, timeout: float) -> Outcome:
        """The proposal's outcome, handed over once."""
        if self._error is not None:
            raise self._error
        outcome = self._book.take(proposal_id)
        if outcome is not None:
            return outcome
        if not self._book.expecting(proposal_id):
            raise LookupError(
                f"proposal '{proposal_id}' is not awaited here: it was not proposed through "
                "this client, its outcome was already handed over, or more than "
                f"{self._book.capacity} proposals went unclaimed since (max_unclaimed=)"
            )
        future = self._waiting.setdefault(proposal_id, asyncio.get_running_loop().create_future())
        try:
            return await asyncio.wait_for(asyncio.shield(future), timeout)
        except TimeoutError:
            raise Timeout(timeout_message(proposal_id, timeout)) from None
        finally:
            if future.done() or self._waiting.get(proposal_id) is future:
                self._waiting.pop(proposal_id, None)

    def kept(self) -> int:
        return len(self._book)

    def dropped(self) -> int:
        return self._book.dropped

    def followed(self) -> list[tuple[str, int]]:
        return sorted(self._followed)

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        await self._consumer.close()
        await asyncio.to_thread(self._pins.close)
