"""The agent SDK: create runs, propose (signed), wait for outcomes, read snapshots.

    client = RunstateClient(KafkaSettings("127.0.0.1:9092"), TopicNames.with_prefix(),
                            signing_key=load_signing_key(Path("agent.key.json")))
    client.create("run-7", "task_lifecycle", max_retries=3)
    outcome = client.propose_and_wait("run-7", "start", timeout=10)
    if isinstance(outcome, Rejection): ...

`AsyncRunstateClient` has the same methods for asyncio. Everything an agent needs is
importable from here: the clients, the messages (`Transition`, `Rejection`, `Heartbeat`,
`RunSnapshot`, `RejectionCode`), the key and connection settings, the errors.

An approver decides a run's approval wait with `decide(run_id, grant=...)`: the decision
names the pause it answers (the snapshot's `pause.revision`) and when it expires
(`approval_payload` builds that payload for a plain `propose`).

Proposals are produced with an idempotent producer, keyed by run_id with Kafka's
default (murmur2) partitioner, and signed (Ed25519 or HMAC-SHA256) over the topic, the
key, the value, the key id and the time of sending (docs/wire.md).
An outcome is a `Transition`, a `Rejection`, or for a heartbeat a `Heartbeat`. A
proposal sent again with a proposal id the run already committed (a safe retry) is
answered with the original transition, however long ago it was committed. Reads
(`snapshot`, `history`) ask the workers' HTTP API at `worker_urls`, sending `http_token`
(or RUNSTATE_HTTP_TOKEN) when the workers ask for one.
"""

from processor.kafka.config import KafkaSettings
from processor.kafka.topics import TopicNames
from processor.trust.keyring import SigningKey, load_signing_key
from schemas.codes import RejectionCode
from schemas.messages import Heartbeat, Rejection, RunSnapshot, Transition

from .aio import AsyncRunstateClient
from .core import DECISION_TTL_MS, MAX_UNCLAIMED, Outcome, OutcomeBook, approval_payload
from .errors import (
    InvalidArgument,
    NotAwaited,
    NotFound,
    NotServed,
    OutcomeTimeout,
    Rejected,
    Timeout,
    Unavailable,
)
from .reader import RunReader
from .steps import AsyncStep, Step
from .sync import RunstateClient
from .waiter import AsyncOutcomeWaiter, OutcomeWaiter
from .watch import AsyncWatch, Position, Watch

__all__ = [
    "DECISION_TTL_MS",
    "MAX_UNCLAIMED",
    "AsyncOutcomeWaiter",
    "AsyncRunstateClient",
    "AsyncStep",
    "AsyncWatch",
    "Heartbeat",
    "InvalidArgument",
    "KafkaSettings",
    "NotAwaited",
    "NotFound",
    "NotServed",
    "Outcome",
    "OutcomeBook",
    "OutcomeTimeout",
    "OutcomeWaiter",
    "Position",
    "Rejected",
    "Rejection",
    "RejectionCode",
    "RunReader",
    "RunSnapshot",
    "RunstateClient",
    "SigningKey",
    "Step",
    "Timeout",
    "TopicNames",
    "Transition",
    "Unavailable",
    "Watch",
    "approval_payload",
    "load_signing_key",
]
