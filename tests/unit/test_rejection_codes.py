"""One test per rejection code: each is reachable, and carries what a client needs."""

import json
import zlib

import pytest

from processor.engine import Commit, decide
from processor.kafka.partitioning import partition_for
from processor.machines import builtin_machines
from processor.records.intake import (
    Credential,
    Undecodable,
    Unproven,
    authenticate,
    decode_proposal,
    reject_unproven,
)
from processor.records.pipeline import DeadLetterReason, Placement, decide_record
from processor.trust.keyring import Keyring, SigningKey
from schemas import Principal, Proposal, Rejection, RejectionCode, RunSnapshot
from tests.unit.driver import APPROVER, MODEL, OPERATOR, RUNTIME, TOOL, Driver

NOW = 1_700_000_000_000
KEYRING = Keyring.model_validate(
    {"keys": {"rt": {"secret": "s" * 32, "source": "runtime", "authority": "runtime"}}}
)


TOPIC = "runstate.proposals"
RT = SigningKey.hmac("rt", "s" * 32)


def _signed(value: bytes, signer: SigningKey = RT, at_ms: int = NOW, key: bytes = b"r1") -> object:
    return signer.headers(TOPIC, key, value, at_ms)


def _value(**fields: object) -> bytes:
    base = {"proposal_id": "p1", "run_id": "r1", "event": "start"}
    return json.dumps({**base, **fields}).encode()


def test_every_code_has_a_test_here() -> None:
    tested = {name[len("test_") :] for name in globals() if name.startswith("test_")}
    assert {code.value for code in RejectionCode} <= tested


def test_schema_invalid() -> None:
    wrong_type = decode_proposal(_value(expected_revision="3"), NOW)
    assert isinstance(wrong_type, Rejection) and wrong_type.code is RejectionCode.SCHEMA_INVALID
    assert "expected_revision" in wrong_type.detail and wrong_type.run_id == "r1"

    unknown_field = decode_proposal(_value(authority="runtime"), NOW)
    assert isinstance(unknown_field, Rejection)
    assert "authority" in unknown_field.detail and "Extra inputs" in unknown_field.detail

    big = decode_proposal(_value(payload={"blob": "x" * 70_000}), NOW)
    assert isinstance(big, Rejection) and "limit is 65536" in big.detail
    small_limit = decode_proposal(_value(), NOW, max_bytes=10)
    assert isinstance(small_limit, Rejection) and "limit is 10" in small_limit.detail

    newer = decode_proposal(_value(schema_version=9), NOW)
    assert isinstance(newer, Rejection) and "9 is newer" in newer.detail

    # event payloads are typed too
    run = Driver()
    bad_create = run.refuse("create", payload={"machine": 5})
    assert bad_create.code is RejectionCode.SCHEMA_INVALID and "machine" in bad_create.detail
    run.create("owned_run")
    run.commit("run_started")
    bad_fact = run.refuse("tool_result", TOOL, payload={"value": "build=green"})
    assert bad_fact.code is RejectionCode.SCHEMA_INVALID and "fact" in bad_fact.detail


def test_undecodable_goes_to_dlq_not_rejection() -> None:
    for value in (b"\xff\xfe", b"not json", b"[1, 2]", None):
        assert isinstance(decode_proposal(value, NOW), Undecodable)


def test_wrong_partition() -> None:
    """A record whose partition is not murmur2(key) mod the count is refused before it
    is authenticated or decided: here keys a CRC32 partitioner (librdkafka's default in
    Go, .NET and JavaScript clients) puts elsewhere, over several partition counts."""
    checked = 0
    for partitions in (2, 3, 6, 12):
        for n in range(60):
            run_id = f"doc-{n}"
            crc32 = zlib.crc32(run_id.encode()) % partitions
            home = partition_for(run_id, partitions)
            value = _value(run_id=run_id, event="create", payload={"machine": "run_state"})
            for partition in {crc32, home}:
                outcome = decide_record(
                    run_id.encode(),
                    value,
                    _signed(value, key=run_id.encode()),
                    NOW,
                    topic="runstate.proposals",
                    keyring=KEYRING,
                    machines=builtin_machines(),
                    lookup=lambda _: None,
                    seen=lambda _run, _proposal: None,
                    placement=Placement(partition, partitions),
                )
                if partition == home:
                    assert isinstance(outcome, Commit), outcome
                    continue
                checked += 1
                assert isinstance(outcome, Rejection), outcome
                assert outcome.code is RejectionCode.WRONG_PARTITION
                assert f"lives in partition {home}" in outcome.detail
                assert "partitioner=murmur2_random" in outcome.detail
                assert outcome.run_id == run_id
    assert checked > 100  # CRC32 and murmur2 disagree on most keys
    assert partition_for("doc-42", 2) == 1 and zlib.crc32(b"doc-42") % 2 == 0


def _authenticate(value: bytes, headers: object, topic: str = TOPIC, key: bytes = b"r1") -> object:
    return authenticate(topic, key, value, headers, KEYRING, NOW)  # type: ignore[arg-type]


def test_unauthenticated() -> None:
    value = _value()
    good = _authenticate(value, _signed(value))
    assert good == Credential(RUNTIME, None, NOW)
    signed = _signed(value)
    refused = {
        "unsigned": _authenticate(value, []),
        "forged": _authenticate(value, _signed(value, SigningKey.hmac("rt", "t" * 32))),
        "unknown": _authenticate(value, _signed(value, SigningKey.hmac("nobody", "s" * 32))),
        "tampered": _authenticate(_value(event="complete"), signed),
        "another topic": _authenticate(value, signed, topic="other.proposals"),
        "another run": _authenticate(value, signed, key=b"r2"),
        "no time": _authenticate(value, [h for h in signed if h[0] != "runstate-signed-at"]),  # type: ignore[attr-defined]
        "repeated header": _authenticate(value, [*signed, signed[0]]),  # type: ignore[misc]
        "leading zero": _authenticate(
            value,
            [(k, b"0" + v if k == "runstate-signed-at" else v) for k, v in signed],  # type: ignore[attr-defined]
        ),
        "uppercase hex": _authenticate(
            value,
            [(k, v.upper() if k == "runstate-signature" else v) for k, v in signed],  # type: ignore[attr-defined]
        ),
    }
    for why in refused.values():
        assert isinstance(why, Unproven) and why.code is RejectionCode.UNAUTHENTICATED, why
    proposal = decode_proposal(value, NOW)
    assert isinstance(proposal, Proposal)
    forged = refused["forged"]
    assert isinstance(forged, Unproven)
    rejection = reject_unproven(proposal, forged, NOW)
    assert rejection.code is RejectionCode.UNAUTHENTICATED and "bad signature" in rejection.detail


def test_stale_signature() -> None:
    """A signature is good for one sending: a record appended longer than the keyring's
    max age after it was signed (a captured proposal sent again later), or signed
    further ahead of the broker's clock than the allowed skew, is refused."""
    value = _value()
    max_age, skew = KEYRING.signature_max_age_ms, KEYRING.clock_skew_ms
    for signed_at, fresh in (
        (NOW - max_age, True),
        (NOW - max_age - 1, False),
        (NOW + skew, True),
        (NOW + skew + 1, False),
        (NOW - 30 * 24 * 3600 * 1000, False),
    ):
        outcome = _authenticate(value, _signed(value, at_ms=signed_at))
        if fresh:
            assert isinstance(outcome, Credential), (signed_at, outcome)
        else:
            assert isinstance(outcome, Unproven), (signed_at, outcome)
            assert outcome.code is RejectionCode.STALE_SIGNATURE
            assert "sign again when you send" in outcome.why


def test_unknown_machine() -> None:
    refused = Driver().refuse("create", payload={"machine": "nope"})
    assert refused.code is RejectionCode.UNKNOWN_MACHINE and "task_lifecycle" in refused.detail
    # a stored run whose machine is no longer loaded
    run = Driver()
    run.create("run_state")
    machines = {k: v for k, v in builtin_machines().items() if k != "run_state"}
    assert run.snapshot is not None
    p = Proposal(proposal_id="x", run_id="run-7", event="start")
    decision = decide(machines, run.snapshot, p, RUNTIME, NOW)
    assert isinstance(decision, Rejection) and decision.code is RejectionCode.UNKNOWN_MACHINE


def test_unknown_run() -> None:
    refused = Driver().refuse("start")
    assert refused.code is RejectionCode.UNKNOWN_RUN and "create" in refused.detail


def test_run_exists() -> None:
    run = Driver()
    run.create("run_state")
    refused = run.refuse("create", payload={"machine": "run_state"})
    assert refused.code is RejectionCode.RUN_EXISTS and refused.revision == 0


def test_duplicate() -> None:
    run = Driver()
    run.create(
        "run_state",
    )
    first = run.commit("start", proposal_id="start-once", expected_revision=0)
    again = run.refuse("start", proposal_id="start-once", expected_revision=0)
    assert again.code is RejectionCode.DUPLICATE
    assert again.original_transition_id == first.transition.transition_id == "run-7:1"
    # a duplicated create names revision 0
    create_again = run.refuse(
        "create", proposal_id="p1", payload={"machine": "run_state", "options": {}}
    )
    assert create_again.original_transition_id == "run-7:0"


def test_proposal_id_reused() -> None:
    """An id answered before, sent with other content (or by another principal), is
    refused without telling what the first answer was beyond its kind; with the same
    content it gets the first answer again, whether that was a commit or a refusal."""
    run = Driver()
    run.create("owned_run")
    run.commit("run_started", proposal_id="go")
    other = run.refuse("run_cancelled", proposal_id="go")
    assert other.code is RejectionCode.PROPOSAL_ID_REUSED and "committed" in other.detail
    assert other.state is None and other.revision is None and other.original_transition_id is None
    by_another = run.refuse("run_started", APPROVER, proposal_id="go")
    assert by_another.code is RejectionCode.PROPOSAL_ID_REUSED
    # a refusal is an answer too: re-sent after the run moved on, it is refused again
    stale = run.refuse(
        "run_waiting", reason="external_callback", expected_revision=0, proposal_id="w"
    )
    assert stale.code is RejectionCode.REVISION_CONFLICT and stale.content_digest is not None
    again = run.refuse(
        "run_waiting", reason="external_callback", expected_revision=1, proposal_id="w"
    )
    assert again == stale  # the first answer, byte for byte
    reused = run.refuse("run_cancelled", proposal_id="w")
    assert reused.code is RejectionCode.PROPOSAL_ID_REUSED and "refused" in reused.detail
    assert run.state == "running"


def test_limit_exceeded() -> None:
    ceilings = builtin_machines()["task_lifecycle"].spec.ceilings
    for options in (
        {"max_retries": ceilings.max_retries + 1},
        {"deadlines": {"approval_timeout_ms": ceilings.max_timeout_ms + 1}},
        {"deadlines": {"heartbeat_timeout_ms": 2**53 - 1}},
        {"success_criteria": [f"c{i}" for i in range(ceilings.max_success_criteria + 1)]},
    ):
        run = Driver()
        refused = run.refuse("create", payload={"machine": "task_lifecycle", "options": options})
        assert refused.code is RejectionCode.LIMIT_EXCEEDED and "ceiling" in refused.detail
    Driver().create("task_lifecycle", max_retries=ceilings.max_retries)


def _paused() -> Driver:
    run = Driver()
    run.create("task_lifecycle")
    run.commit("start")
    run.commit("pause_for_approval")
    return run


def test_approval_wrong_pause() -> None:
    """A decision names the pause it answers: a late grant of an earlier pause does not
    approve the next one."""
    run = _paused()
    first = run.decision()
    run.commit("approval_granted", APPROVER, payload=first)
    run.commit("pause_for_approval")
    late = run.refuse("approval_granted", APPROVER, payload=first)
    assert late.code is RejectionCode.APPROVAL_WRONG_PAUSE
    assert run.state == "paused"


def test_approval_expired() -> None:
    run = _paused()
    expired = run.refuse("approval_granted", APPROVER, payload=run.decision(expires_in_ms=0))
    assert expired.code is RejectionCode.APPROVAL_EXPIRED


def test_self_approval() -> None:
    """Whoever asked for the approval may not decide it, even holding an approver key."""
    alice_runs = Principal(source="alice", authority="runtime")
    alice_approves = Principal(source="alice", authority="approver")
    run = Driver()
    run.create("task_lifecycle")
    run.commit("start")
    run.commit("pause_for_approval", alice_runs)
    refused = run.refuse("approval_granted", alice_approves, payload=run.decision())
    assert refused.code is RejectionCode.SELF_APPROVAL
    run.commit("approval_granted", APPROVER, payload=run.decision())


def test_step_in_progress() -> None:
    """An executing step is not started again under any key until it is settled, and
    (by default) no other step starts meanwhile."""
    run = Driver()
    run.create("task_lifecycle")
    run.commit("start")
    run.commit("step_started", payload={"step": "refund", "idempotency_key": "k1"})
    for payload in (
        {"step": "refund", "idempotency_key": "k1"},
        {"step": "refund", "idempotency_key": "k2"},
        {"step": "email", "idempotency_key": "k3"},
    ):
        refused = run.refuse("step_started", payload=payload)
        assert refused.code is RejectionCode.STEP_IN_PROGRESS
    assert run.refuse("complete").code is RejectionCode.GUARD_FAILED
    run.commit("step_failed", payload={"step": "refund", "error": "crashed; not charged"})
    run.commit("step_started", payload={"step": "refund", "idempotency_key": "k2"})


def test_a_duplicate_is_recognised_for_the_runs_life() -> None:
    """The snapshot keeps the latest 64 proposal ids; the store (here the driver's dict)
    the rest, so a resend long after is still the original's answer."""
    run = Driver()
    run.create("owned_run")
    run.commit("run_started")
    for i in range(200):
        run.commit("tool_result", TOOL, payload={"fact": f"f{i}"}, proposal_id=f"fact-{i}")
    assert run.snapshot is not None and len(run.snapshot.recent_proposals) == 64
    for i in (0, 63, 150, 199):
        again = run.refuse("tool_result", TOOL, payload={"fact": f"f{i}"}, proposal_id=f"fact-{i}")
        assert again.code is RejectionCode.DUPLICATE
        assert again.original_transition_id == f"run-7:{i + 2}"


def test_unknown_event() -> None:
    run = Driver()
    run.create("run_state")
    refused = run.refuse("explode")
    assert refused.code is RejectionCode.UNKNOWN_EVENT and "need_approval" in refused.detail


def test_unauthorized() -> None:
    run = Driver()
    run.create("task_lifecycle")
    run.commit("start")
    run.commit("pause_for_approval")
    refused = run.refuse(
        "approval_granted", MODEL, payload=run.decision()
    )  # the model cannot approve itself
    assert refused.code is RejectionCode.UNAUTHORIZED and "approver" in refused.detail
    assert run.refuse(
        "step_started", MODEL, payload={"step": "s", "idempotency_key": "k"}
    ).code is (RejectionCode.UNAUTHORIZED)
    model_create = Driver(run_id="r2").refuse("create", MODEL, payload={"machine": "run_state"})
    assert model_create.code is RejectionCode.UNAUTHORIZED


def test_revision_conflict() -> None:
    run = Driver()
    run.create("run_state")
    refused = run.refuse("start", expected_revision=5)
    assert refused.code is RejectionCode.REVISION_CONFLICT and refused.revision == 0


def test_terminal_state() -> None:
    run = Driver()
    run.create("run_state")
    run.commit("start")
    run.commit("fail")
    assert run.refuse("start").code is RejectionCode.TERMINAL_STATE
    step = run.refuse("step_started", payload={"step": "s", "idempotency_key": "k"})
    assert step.code is RejectionCode.TERMINAL_STATE


def test_deadline_passed() -> None:
    run = Driver(tick_ms=60_000)
    run.create("task_lifecycle", deadlines={"approval_timeout_ms": 90_000})
    run.commit("start")
    run.commit("pause_for_approval")  # the approval deadline: 90 s from here
    run.now += 30_000  # the approval comes at exactly the due time: too late
    late = run.refuse("approval_granted", APPROVER, payload=run.decision())
    assert late.code is RejectionCode.DEADLINE_PASSED
    assert "'timeout' is decided first" in late.detail and late.state == "paused"
    # the deadline's own proposal is decided, and the run fails by timeout
    timed_out = run.commit("timeout", reason="approval_timeout", expected_revision=2)
    assert timed_out.snapshot.state == "failed"
    assert (
        run.refuse("approval_granted", APPROVER, payload=run.decision()).code
        is RejectionCode.TERMINAL_STATE
    )


def test_state_too_large() -> None:
    keyring = Keyring.model_validate(
        {"keys": {"rt": {"secret": "s" * 32, "source": "runtime", "authority": "runtime"}}}
    )
    snapshots: dict[str, RunSnapshot] = {}

    def propose(n: int, event: str, payload: dict[str, object]) -> Commit | Rejection:
        value = json.dumps(
            {"proposal_id": f"p{n}", "run_id": "r1", "event": event, "payload": payload}
        ).encode()
        outcome = decide_record(
            b"r1",
            value,
            _signed(value, at_ms=NOW + n),
            NOW + n,
            topic="runstate.proposals",
            keyring=keyring,
            machines=builtin_machines(),
            lookup=snapshots.get,
            seen=lambda _run, _proposal: None,
            placement=None,
            max_state_bytes=20_000,
        )
        assert not isinstance(outcome, DeadLetterReason)
        if isinstance(outcome, Commit):
            assert outcome.encoded is not None and len(outcome.encoded[1]) <= 20_000
            snapshots["r1"] = outcome.snapshot
        return outcome

    assert isinstance(propose(0, "create", {"machine": "task_lifecycle"}), Commit)
    assert isinstance(propose(1, "start", {}), Commit)
    n = 2
    while True:  # each step's result is kept in the run's ledger: the snapshot grows
        step = f"s{n}"
        propose(n, "step_started", {"step": step, "idempotency_key": step})
        outcome = propose(n + 1, "step_succeeded", {"step": step, "result": "x" * 4_000})
        n += 2
        if isinstance(outcome, Rejection):
            break
    assert outcome.code is RejectionCode.STATE_TOO_LARGE
    assert "limit is 20000" in outcome.detail and outcome.revision == snapshots["r1"].revision
    assert snapshots["r1"].steps[f"s{n - 2}"].status == "executing"  # the run stayed as it was
    # the run still takes what fits
    assert isinstance(propose(n, "step_failed", {"step": f"s{n - 2}", "error": "too big"}), Commit)
    assert isinstance(propose(n + 1, "complete", {}), Commit)


def test_invalid_transition() -> None:
    run = Driver()
    run.create("task_lifecycle")
    refused = run.refuse("complete")
    assert refused.code is RejectionCode.INVALID_TRANSITION and "planned" in refused.detail
    # steps only while running
    step = run.refuse("step_started", payload={"step": "s", "idempotency_key": "k"})
    assert step.code is RejectionCode.INVALID_TRANSITION
    run.commit("start")
    never = run.refuse("step_succeeded", payload={"step": "s", "result": 1})
    assert never.code is RejectionCode.INVALID_TRANSITION and "never started" in never.detail
    run.commit("step_started", payload={"step": "s", "idempotency_key": "k"})
    run.commit("step_failed", payload={"step": "s", "error": "boom"})
    failed = run.refuse("step_failed", payload={"step": "s", "error": "boom"})
    assert failed.code is RejectionCode.INVALID_TRANSITION and "(failed)" in failed.detail


def test_reason_required() -> None:
    run = Driver()
    run.create("owned_run")
    run.commit("run_started")
    refused = run.refuse("run_failed")
    assert refused.code is RejectionCode.REASON_REQUIRED
    assert "timeout" in refused.detail and "tool_error" in refused.detail


def test_guard_failed() -> None:
    run = Driver()
    run.create("owned_run", success_criteria=["tests=pass", "build=green"])
    run.commit("run_started")
    run.commit("tool_result", TOOL, payload={"fact": "build=green"})
    refused = run.refuse("run_completed")
    assert refused.code is RejectionCode.GUARD_FAILED and "tests=pass" in refused.detail
    run.commit("tool_result", TOOL, payload={"fact": "tests=pass"})
    assert isinstance(run.propose("run_completed"), Commit)


def test_retries_exhausted() -> None:
    run = Driver()
    run.create("task_lifecycle", max_retries=0)
    run.commit("start")
    run.commit("transient_error")
    refused = run.refuse("retry")
    assert refused.code is RejectionCode.RETRIES_EXHAUSTED
    assert run.snapshot is not None and run.snapshot.retry_count == 0


def test_duplicate_step() -> None:
    run = Driver()
    run.create("run_state")
    run.commit("start")
    run.commit("step_started", payload={"step": "refund", "idempotency_key": "k"})
    run.commit("step_succeeded", payload={"step": "refund", "result": {"refund_id": 9}})
    for event, payload in (
        ("step_started", {"step": "refund", "idempotency_key": "k"}),
        ("step_succeeded", {"step": "refund", "result": 2}),
        ("step_failed", {"step": "refund", "error": "late"}),
    ):
        refused = run.refuse(event, payload=payload)
        assert refused.code is RejectionCode.DUPLICATE_STEP
        assert refused.step_result == {"refund_id": 9}


def test_checkpoint_too_large() -> None:
    """Checkpoint data over CHECKPOINT_MAX_BYTES of canonical JSON is refused, in a
    `checkpoint` event and in a continuation's `create`; the run keeps the one it had."""
    from processor.engine.checkpoint import CHECKPOINT_MAX_BYTES, checkpoint_size

    run = Driver()
    run.create("task_lifecycle")
    run.commit("start")
    run.commit("checkpoint", TOOL, payload={"data": {"cursor": 3}})
    # JSON spacing does not count: the size is the canonical form's.
    just_fits = {"blob": "x" * (CHECKPOINT_MAX_BYTES - len('{"blob":""}'))}
    assert checkpoint_size(just_fits) == CHECKPOINT_MAX_BYTES
    run.commit("checkpoint", payload={"data": just_fits})
    over = {"blob": "x" * (CHECKPOINT_MAX_BYTES - len('{"blob":""}') + 1)}
    refused = run.refuse("checkpoint", payload={"data": over})
    assert refused.code is RejectionCode.CHECKPOINT_TOO_LARGE
    assert f"{CHECKPOINT_MAX_BYTES + 1} bytes" in refused.detail
    assert run.snapshot is not None and run.snapshot.checkpoint == just_fits

    successor = Driver(run_id="run-8")
    link = {"run_id": "run-7", "revision": 3, "hash": "a" * 64}
    too_large = successor.refuse(
        "create",
        payload={"machine": "task_lifecycle", "continues": link, "checkpoint": over},
    )
    assert too_large.code is RejectionCode.CHECKPOINT_TOO_LARGE and successor.snapshot is None


@pytest.mark.parametrize("machine", ["run_state", "owned_run", "task_lifecycle"])
def test_rejections_never_change_the_run(machine: str) -> None:
    run = Driver()
    run.create(machine)
    before = run.snapshot
    run.refuse("no_such_event")
    run.refuse("create", payload={"machine": machine})
    assert run.snapshot is before


def test_incompatible_version() -> None:
    """`migrate` to a version without the run's state (more in test_machine_versions)."""
    from processor.engine.machine import Catalog
    from processor.engine.parse import parse_machine
    from processor.machines import builtin_source

    text = builtin_source("run_state")
    v1 = parse_machine(text)
    without = "\n".join(line for line in text.splitlines() if "from: waiting_approval" not in line)
    v2 = parse_machine(
        without.replace("running, waiting_approval, completed", "running, completed").replace(
            "  - {from: running, event: need_approval, to: waiting_approval}\n", ""
        )
    )
    run = Driver(machines=Catalog([v1]))
    run.create("run_state")
    run.commit("start")
    run.commit("need_approval")
    run.machines = Catalog([v1], [v2])
    refused = run.refuse("migrate", payload={"version": v2.version}, scope=OPERATOR)
    assert refused.code is RejectionCode.INCOMPATIBLE_VERSION
    assert "state 'waiting_approval' does not exist" in refused.detail


def test_a_creation_refused_is_no_runs_answer() -> None:
    """A `create` refused for its size leaves nothing behind: the run does not exist, so
    its proposal id is no one's yet (else a key could take a run's ids before it is)."""
    snapshots: dict[str, RunSnapshot] = {}

    def send(proposal_id: str, event: str, **fields: object) -> object:
        body = {"proposal_id": proposal_id, "run_id": "r1", "event": event, **fields}
        value = json.dumps(body).encode()
        outcome = decide_record(
            b"r1",
            value,
            _signed(value),
            NOW,
            topic=TOPIC,
            keyring=KEYRING,
            machines=builtin_machines(),
            lookup=snapshots.get,
            seen=lambda _run, _proposal: None,
            placement=None,
            max_state_bytes=2_000,
        )
        if isinstance(outcome, Commit):
            snapshots["r1"] = outcome.snapshot
        return outcome

    big = send("x", "create", payload={"machine": "run_state"}, metadata={"blob": "x" * 3_000})
    assert isinstance(big, Rejection) and big.code is RejectionCode.STATE_TOO_LARGE
    assert big.content_digest is None
    assert isinstance(send("y", "create", payload={"machine": "run_state"}), Commit)
    stale = send("z", "start", expected_revision=5)
    assert isinstance(stale, Rejection) and stale.content_digest is not None


def test_continuation_refused() -> None:
    """The original run refuses to be carried on: not finished, or the claim is not its
    own; the refusal comes back as the create's, naming why."""
    original = Driver(run_id="orig-1")
    original.create("task_lifecycle")
    original.commit("start")
    assert original.snapshot is not None
    link = {"run_id": "orig-1", "revision": 1, "hash": original.snapshot.last_hash}
    live = Driver(run_id="next-1").refuse(
        "create", payload={"machine": "task_lifecycle", "continues": link}
    )
    assert live.code is RejectionCode.CONTINUATION_REFUSED and "not finished" in live.detail
    assert live.run_id == "next-1" and live.proposal_id == "p1" and live.principal == RUNTIME
