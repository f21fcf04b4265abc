"""The agent SDK: create runs, propose (signed), wait for outcomes, read snapshots.

    client = RunstateClient(KafkaSettings("127.0.0.1:9092"), TopicNames.with_prefix(),
                            signing_key=load_signing_key(Path("agent.key.json")))
    client.create("run-7", "task_lifecycle", max_retries=3)
    outcome = client.propose_and_wait("run-7", "start", timeout=10)
    if isinstance(outcome, Rejection): ...

Proposals are produced with an idempotent producer, keyed by run_id with Kafka's
default (murmur2) partitioner, and signed (Ed25519 or HMAC-SHA256) over the topic, the
key, the value, the key id and the time of sending (docs/wire.md).
An outcome is a `Transition`, a `Rejection`, or for a heartbeat a `Heartbeat`. A
proposal sent again with a proposal id the run already committed (a safe retry) is
answered with the original transition, however long ago it was committed. Reads
(`snapshot`, `history`) ask the workers' HTTP API at `worker_urls`, sending `http_token`
(or RUNSTATE_HTTP_TOKEN) when the workers ask for one.
"""

import json
import os
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from processor.config import KafkaSettings
from processor.http_auth import CLIENT_TOKEN_ENV, bearer
from processor.keyring import SigningKey
from processor.partitioning import partition_for
from processor.readback import read_partition, watermarks
from processor.topics import TopicNames
from schemas.codes import RejectionCode
from schemas.messages import Heartbeat, Proposal, Rejection, RunSnapshot, Transition

Outcome = Transition | Heartbeat | Rejection


class OutcomeTimeout(TimeoutError):
    """No outcome arrived in time; the proposal may still be decided later."""


class OutcomeWaiter:
    """Follows the transitions, rejections and heartbeats topics (read_committed) from
    the moment it starts and hands each outcome to whoever waits for its proposal id."""

    def __init__(
        self,
        settings: KafkaSettings,
        topics: TopicNames,
        *,
        from_beginning: bool = False,
        on_outcome: Callable[[Outcome], None] | None = None,
    ) -> None:
        self._consumer = Consumer(
            settings.client(
                {
                    "group.id": f"runstate-client-{uuid.uuid4().hex}",
                    "enable.auto.commit": False,
                    "isolation.level": "read_committed",
                }
            )
        )
        self._topics = topics
        self._on_outcome = on_outcome
        self._outcomes: dict[str, Outcome] = {}
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._error: Exception | None = None
        # Pin the start positions now, before anything is proposed: no outcome of a
        # later proposal can slip past.
        assignment = []
        for topic in (topics.transitions, topics.rejections, topics.heartbeats):
            meta = self._consumer.list_topics(topic, timeout=30).topics[topic]
            if meta.error is not None:
                raise KafkaException(meta.error)
            for p in meta.partitions:
                low, high = watermarks(self._consumer, TopicPartition(topic, p))
                assignment.append(TopicPartition(topic, p, low if from_beginning else high))
        self._consumer.assign(assignment)
        self._thread = threading.Thread(target=self._loop, name="runstate-outcomes", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                batch = self._consumer.consume(num_messages=1_000, timeout=0.2)
                parsed: list[Outcome] = []
                for msg in batch:
                    if msg.error() is not None:
                        continue
                    value = msg.value() or b""
                    outcome: Outcome
                    if msg.topic() == self._topics.transitions:
                        outcome = Transition.model_validate_json(value)
                    elif msg.topic() == self._topics.heartbeats:
                        outcome = Heartbeat.model_validate_json(value)
                    else:
                        outcome = Rejection.model_validate_json(value)
                    parsed.append(outcome)
                if parsed:
                    with self._cond:
                        for outcome in parsed:
                            if outcome.proposal_id is not None:
                                self._outcomes.setdefault(outcome.proposal_id, outcome)
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
        deadline = time.monotonic() + timeout
        with self._cond:
            while proposal_id not in self._outcomes:
                if self._error is not None:
                    raise self._error
                left = deadline - time.monotonic()
                if left <= 0:
                    raise OutcomeTimeout(
                        f"no outcome for proposal '{proposal_id}' within {timeout:.1f}s; is a "
                        "worker running (runstate worker) and consuming the proposals topic?"
                    )
                self._cond.wait(left)
            return self._outcomes[proposal_id]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)


class RunReader:
    """Reads committed runs from the workers' HTTP API; the owning worker answers. It
    sends `http_token` (default: RUNSTATE_HTTP_TOKEN) to the workers, which ask for one
    when they have tokens configured."""

    def __init__(self, worker_urls: Iterable[str], *, http_token: str | None = None) -> None:
        self._worker_urls = [u.rstrip("/") for u in worker_urls]
        self._headers = bearer(http_token or os.environ.get(CLIENT_TOKEN_ENV))

    def _get(self, path: str) -> Any:
        if not self._worker_urls:
            raise ValueError("no worker URL given (worker_urls=..., RUNSTATE_WORKER_URL)")
        errors = []
        for base in self._worker_urls:
            try:
                request = urllib.request.Request(base + path, headers=self._headers)
                with urllib.request.urlopen(request, timeout=10) as response:
                    return json.loads(response.read())
            except urllib.error.HTTPError as exc:
                if exc.code == 404:
                    return None
                if exc.code == 401:
                    errors.append(f"{base}: 401, {self._unauthorized()}")
                    continue
                errors.append(f"{base}: {exc.code}")  # 421: another worker owns it
            except OSError as exc:
                errors.append(f"{base}: {exc}")
        raise LookupError(f"no worker could answer {path}: {'; '.join(errors)}")

    def _unauthorized(self) -> str:
        if not self._headers:
            return f"the worker wants a token: set {CLIENT_TOKEN_ENV} (http_token=, --http-token)"
        return "the worker does not accept the token sent: is it a current one?"

    def snapshot(self, run_id: str) -> RunSnapshot | None:
        """The run's committed snapshot, from whichever given worker owns it."""
        data = self._get(f"/runs/{urllib.parse.quote(run_id, safe='')}")
        return None if data is None else RunSnapshot.model_validate_json(json.dumps(data))

    def history(self, run_id: str) -> list[Transition]:
        data = self._get(f"/runs/{urllib.parse.quote(run_id, safe='')}/history") or []
        return [Transition.model_validate_json(json.dumps(t)) for t in data]

    def runs_in_state(
        self, state: str, machine: str | None = None, limit: int = 100, after: str | None = None
    ) -> dict[str, Any]:
        """One page of runs in `state` across the cluster, longest there first:
        {"runs": [...], "next": cursor or None, "missing_partitions": [...]}."""
        params = {"state": state, "limit": str(limit)}
        if machine is not None:
            params["machine"] = machine
        if after is not None:
            params["after"] = after
        result: dict[str, Any] = self._get("/runs?" + urllib.parse.urlencode(params))
        return result

    def stats(self) -> dict[str, Any]:
        """Runs per machine and state across the cluster, with the oldest entry in each."""
        result: dict[str, Any] = self._get("/stats")
        return result


class RunstateClient:
    def __init__(
        self,
        settings: KafkaSettings,
        topics: TopicNames,
        *,
        signing_key: SigningKey | None = None,
        key_id: str | None = None,
        secret: str | None = None,
        worker_urls: Iterable[str] = (),
        http_token: str | None = None,
    ) -> None:
        """Sign with `signing_key` (an Ed25519 or HMAC key, `runstate keys add` writes
        one), or with the HMAC key `key_id` whose shared secret is `secret`."""
        self.settings = settings
        self.topics = topics
        if signing_key is None:
            if key_id is None or secret is None:
                raise ValueError("give signing_key, or key_id and secret (an HMAC key)")
            signing_key = SigningKey.hmac(key_id, secret)
        self.signing_key = signing_key
        # Sent to worker_urls only (default: RUNSTATE_HTTP_TOKEN); Kafka never sees it.
        self.reader = RunReader(worker_urls, http_token=http_token)
        self._producer = Producer(
            settings.client(
                {
                    "enable.idempotence": True,
                    # The Java client's default for keyed records: every producer of a
                    # run must choose the same partition.
                    "partitioner": "murmur2_random",
                    "linger.ms": 5,
                }
            )
        )
        self._waiter: OutcomeWaiter | None = None
        self._delivery_error: Exception | None = None

    # -- proposing -------------------------------------------------------------
    def propose(
        self,
        run_id: str,
        event: str,
        *,
        payload: dict[str, Any] | None = None,
        reason: str | None = None,
        expected_revision: int | None = None,
        metadata: dict[str, Any] | None = None,
        proposal_id: str | None = None,
    ) -> str:
        """Send a signed proposal; returns its proposal id (give one to retry safely)."""
        proposal = Proposal(
            proposal_id=proposal_id or uuid.uuid4().hex,
            run_id=run_id,
            event=event,
            reason=reason,
            expected_revision=expected_revision,
            payload=payload or {},
            metadata=metadata or {},
        )
        self.send_raw(run_id.encode(), proposal.model_dump_json(exclude_none=True).encode())
        return proposal.proposal_id

    def send_raw(
        self,
        key: bytes | None,
        value: bytes,
        headers: list[tuple[str, str | bytes | None]] | None = None,
    ) -> None:
        """Produce bytes to the proposals topic, signed unless `headers` are given."""
        if headers is None:
            headers = self.signing_key.headers(
                self.topics.proposals, key, value, int(time.time() * 1000)
            )
        while True:
            try:
                self._producer.produce(
                    self.topics.proposals,
                    key=key,
                    value=value,
                    headers=headers,
                    on_delivery=self._on_delivery,
                )
                break
            except BufferError:
                self._producer.poll(0.05)
        self._producer.poll(0)

    def _on_delivery(self, err: Any, msg: Any) -> None:
        if err is not None:
            self._delivery_error = KafkaException(err)

    def create(
        self,
        run_id: str,
        machine: str,
        *,
        max_retries: int | None = None,
        success_criteria: list[str] | None = None,
        deadlines: dict[str, int] | None = None,
        proposal_id: str | None = None,
    ) -> str:
        options: dict[str, Any] = {}
        if max_retries is not None:
            options["max_retries"] = max_retries
        if success_criteria is not None:
            options["success_criteria"] = success_criteria
        if deadlines is not None:
            options["deadlines"] = deadlines
        return self.propose(
            run_id,
            "create",
            payload={"machine": machine, "options": options},
            proposal_id=proposal_id,
        )

    def heartbeat(self, run_id: str) -> str:
        """A sign of life for a running run: pushes its heartbeat deadline back. Not a
        transition: the run's revision stays; its answer is a `Heartbeat`."""
        return self.propose(run_id, "heartbeat")

    def flush(self, timeout: float = 30.0) -> None:
        left = self._producer.flush(timeout)
        if self._delivery_error is not None:
            error, self._delivery_error = self._delivery_error, None
            raise error
        if left:
            raise KafkaException(f"{left} proposals not delivered within {timeout}s")

    # -- outcomes --------------------------------------------------------------
    def waiter(self) -> OutcomeWaiter:
        if self._waiter is None:
            self._waiter = OutcomeWaiter(self.settings, self.topics)
        return self._waiter

    def wait(self, proposal_id: str, timeout: float = 30.0) -> Outcome:
        """The proposal's outcome; for a proposal id the run committed before (a retry),
        the transition it committed then."""
        return self._resolved(self.waiter().wait(proposal_id, timeout), timeout)

    def propose_and_wait(
        self, run_id: str, event: str, *, timeout: float = 30.0, **kw: Any
    ) -> Outcome:
        self.waiter()  # started before producing, so the outcome cannot be missed
        proposal_id = self.propose(run_id, event, **kw)
        self.flush()
        return self.wait(proposal_id, timeout)

    def create_and_wait(
        self, run_id: str, machine: str, *, timeout: float = 30.0, **kw: Any
    ) -> Outcome:
        self.waiter()
        proposal_id = self.create(run_id, machine, **kw)
        self.flush()
        return self.wait(proposal_id, timeout)

    def _resolved(self, outcome: Outcome, timeout: float) -> Outcome:
        """A `duplicate` (the proposal id was committed before) as the transition it
        names, so a retry gets the answer the first attempt got."""
        if not (
            isinstance(outcome, Rejection)
            and outcome.code is RejectionCode.DUPLICATE
            and outcome.original_transition_id is not None
            and outcome.run_id is not None
        ):
            return outcome
        original = self.transition(outcome.run_id, outcome.original_transition_id, timeout)
        return outcome if original is None else original

    def transition(
        self, run_id: str, transition_id: str, timeout: float = 30.0
    ) -> Transition | None:
        """A committed transition of the run, by id: from a worker's API when given
        worker URLs, else from the run's partition of the transitions topic."""
        try:
            return next(t for t in self.reader.history(run_id) if t.transition_id == transition_id)
        except (ValueError, LookupError, StopIteration):
            pass
        meta = self._producer.list_topics(self.topics.transitions, timeout=timeout)
        partitions = len(meta.topics[self.topics.transitions].partitions)
        key = run_id.encode()
        for record in read_partition(
            self.settings,
            self.topics.transitions,
            partition_for(run_id, partitions),
            timeout=timeout,
        ):
            if record.key == key and record.value is not None:
                found = Transition.model_validate_json(record.value)
                if found.transition_id == transition_id:
                    return found
        return None

    # -- reads -----------------------------------------------------------------
    def snapshot(self, run_id: str) -> RunSnapshot | None:
        return self.reader.snapshot(run_id)

    def history(self, run_id: str) -> list[Transition]:
        return self.reader.history(run_id)

    def close(self) -> None:
        self._producer.flush(30)
        if self._waiter is not None:
            self._waiter.close()
            self._waiter = None
