"""Runs outlive a deploy: each is decided by the machine version that created it, and
moves to another version only by an explicit `migrate`."""

import hashlib

import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from processor.engine import Commit
from processor.engine.machine import Catalog, Machine, version_of
from processor.engine.parse import parse_machine
from processor.engine.scope import Scope
from processor.history.replay import apply_transitions
from processor.machines import builtin_history, builtin_machines, builtin_source, load_catalog
from schemas.codes import RejectionCode
from schemas.messages import Rejection
from tests.examples import examples
from tests.unit.driver import APPROVER, OPERATOR, TOOL, Driver

pytestmark = pytest.mark.unit
V1 = parse_machine(builtin_source("task_lifecycle"))
# The edit of a later deploy: approvals now come from the tool executor, not approvers,
# and the `blocked` state is gone.
V2 = parse_machine(
    builtin_source("task_lifecycle")
    .replace(
        "approval_granted: {authorities: [approver], approval: grant}",
        "approval_granted: {authorities: [tool_executor], approval: grant}",
    )
    .replace("name: task_lifecycle", "name: task_lifecycle\nlabel: tools approve")
)


def _catalog(current: Machine, *older: Machine) -> Catalog:
    """The built-in machines with `current` as task_lifecycle, and `older` versions."""
    others = [m for name, m in builtin_machines().items() if name != "task_lifecycle"]
    return Catalog([*others, current], older)


def test_a_version_is_the_digest_of_the_content() -> None:
    assert V1.version == version_of(V1.spec) and len(V1.version) == 16
    assert V1.version != V2.version
    assert parse_machine(builtin_source("task_lifecycle")).version == V1.version  # stable


def test_a_version_is_the_digest_of_the_specs_rfc8785_json() -> None:
    """As a JCS library in another language writes it: `1`, not `1.0`, and text in
    UTF-8, not escaped (the json.dumps definition before wrote both otherwise)."""
    spec = parse_machine(
        builtin_source("task_lifecycle")
        .replace("jitter: 0.2", "jitter: 1.0")
        .replace("name: task_lifecycle", "name: task_lifecycle\nlabel: décembre ☃")
    ).spec
    content = spec.model_dump(mode="json", by_alias=True)
    # Fields machines gained after versions were first published are left out at their
    # defaults: every version published before keeps its digest.
    for name in ("concurrent_steps", "ceilings"):
        if content[name] is None:
            del content[name]
    for event in content["events"].values():
        if event["approval"] is None:
            del event["approval"]
    for timeout in content["timeouts"]:
        for name in ("remind_before_ms", "grace_ms"):
            if timeout[name] is None:
                del timeout[name]
    canonical = rfc8785.dumps(content)
    assert b'"jitter":1}' in canonical and '"label":"décembre ☃"'.encode() in canonical
    assert version_of(spec) == hashlib.sha256(canonical).hexdigest()[:16]


def test_runs_in_flight_keep_their_version_across_a_deploy() -> None:
    old = Driver(machines=_catalog(V1), run_id="old")
    created = old.create("task_lifecycle")
    assert created.snapshot.machine_version == V1.version
    old.commit("start")
    old.commit("pause_for_approval")
    # the deploy: V2 is current; V1 still held (published) for the runs pinned to it
    old.machines = _catalog(V2, V1)
    new = Driver(machines=old.machines, run_id="new")
    assert new.create("task_lifecycle").snapshot.machine_version == V2.version
    new.commit("start")
    new.commit("pause_for_approval")
    # the old run is decided by V1: approvers approve, tools may not
    assert (
        old.refuse("approval_granted", TOOL, payload=old.decision()).code
        is RejectionCode.UNAUTHORIZED
    )
    assert (
        old.commit("approval_granted", APPROVER, payload=old.decision()).snapshot.machine_version
        == V1.version
    )
    # the new run by V2
    assert (
        new.refuse("approval_granted", APPROVER, payload=new.decision()).code
        is RejectionCode.UNAUTHORIZED
    )
    new.commit("approval_granted", TOOL, payload=new.decision())
    # replay (and get --at) rebuild each run under its own version
    for run in (old, new):
        replayed = apply_transitions(old.machines, [(t, None) for t in run.history])
        assert replayed.problems == [] and replayed.snapshots[run.run_id] == run.snapshot


def test_a_version_the_worker_does_not_hold_is_refused_not_guessed() -> None:
    run = Driver(machines=_catalog(V1), run_id="r")
    run.create("task_lifecycle")
    run.machines = _catalog(V2)  # a worker that never learned V1
    refused = run.refuse("start")
    assert refused.code is RejectionCode.UNKNOWN_MACHINE
    assert V1.version in refused.detail and "machines publish" in refused.detail


def _edited(label: str, *drop: str) -> Machine:
    """task_lifecycle with a label and without the given lines (matched by substring)."""
    lines = [
        line
        for line in builtin_source("task_lifecycle").splitlines()
        if not any(d in line for d in drop)
    ]
    text = "\n".join(lines).replace("name: task_lifecycle", f"name: task_lifecycle\nlabel: {label}")
    if "from: blocked" in drop:
        text = text.replace("paused, blocked, retrying", "paused, retrying")
    return parse_machine(text)


NO_BLOCKED = _edited("no blocked", "to: blocked", "from: blocked", "state: blocked")
NO_APPROVAL_TIMEOUT = _edited(
    "no approval timeout", "{from: paused, event: timeout", "{kind: approval, state: paused"
)


def test_migrate_moves_one_run_and_refuses_another() -> None:
    moving = Driver(machines=_catalog(V1), run_id="m")
    moving.create("task_lifecycle")
    moving.commit("start")
    moving.machines = _catalog(V2, V1)
    assert moving.refuse("migrate", TOOL, payload={"version": V2.version}, scope=OPERATOR).code is (
        RejectionCode.UNAUTHORIZED
    )
    assert moving.refuse("migrate", payload={"version": "0" * 16}, scope=OPERATOR).code is (
        RejectionCode.UNKNOWN_MACHINE
    )
    assert moving.refuse("migrate", payload={}).code is RejectionCode.SCHEMA_INVALID
    migrated = moving.commit("migrate", payload={"version": V2.version}, scope=OPERATOR)
    assert migrated.snapshot.machine_version == V2.version
    assert migrated.transition.from_state == migrated.transition.to_state == "running"
    moving.commit("pause_for_approval")
    assert (
        moving.refuse("approval_granted", APPROVER, payload=moving.decision()).code
        is RejectionCode.UNAUTHORIZED
    )
    moving.commit("approval_granted", TOOL, payload=moving.decision())  # decided by V2 now
    replayed = apply_transitions(moving.machines, [(t, None) for t in moving.history])
    assert replayed.problems == [] and replayed.snapshots["m"] == moving.snapshot

    stuck = Driver(machines=_catalog(V1), run_id="s")
    stuck.create("task_lifecycle")
    stuck.commit("start")
    stuck.commit("block_on_dependency")
    stuck.machines = _catalog(V1, NO_BLOCKED)
    refused = stuck.refuse("migrate", payload={"version": NO_BLOCKED.version}, scope=OPERATOR)
    assert refused.code is RejectionCode.INCOMPATIBLE_VERSION
    assert "state 'blocked' does not exist" in refused.detail
    assert stuck.snapshot is not None and stuck.snapshot.machine_version == V1.version


def test_migrate_refuses_a_target_where_a_pending_deadline_could_not_be_decided() -> None:
    run = Driver(machines=_catalog(V1), run_id="p")
    run.create("task_lifecycle", deadlines={"approval_timeout_ms": 60_000})
    run.commit("start")
    run.commit("pause_for_approval")
    run.machines = _catalog(V1, NO_APPROVAL_TIMEOUT)
    refused = run.refuse(
        "migrate", payload={"version": NO_APPROVAL_TIMEOUT.version}, scope=OPERATOR
    )
    assert refused.code is RejectionCode.INCOMPATIBLE_VERSION
    assert "approval deadline proposes 'timeout'" in refused.detail
    running = Driver(machines=run.machines, run_id="q")  # no deadline pending: it may move
    running.machines = _catalog(V1)
    running.create("task_lifecycle")
    running.commit("start")
    running.machines = _catalog(V1, NO_APPROVAL_TIMEOUT)
    assert isinstance(
        running.commit("migrate", payload={"version": NO_APPROVAL_TIMEOUT.version}, scope=OPERATOR),
        Commit,
    )


_prefixes = st.none() | st.lists(st.sampled_from(["", "m", "mig", "x-"]), max_size=3).map(tuple)
_machines = st.none() | st.lists(st.sampled_from(["task_lifecycle", "run_state"]), max_size=2)


@settings(max_examples=examples(60), deadline=None)
@given(
    key_id=st.sampled_from(["runtime", "operator", "ops-1"]),
    machines=_machines,
    prefixes=_prefixes,
    operator=st.booleans(),
    unscoped=st.booleans(),
)
def test_only_an_operators_key_migrates_a_run(
    key_id: str,
    machines: list[str] | None,
    prefixes: tuple[str, ...] | None,
    operator: bool,
    unscoped: bool,
) -> None:
    """Whatever the key's name, limits and principal (runtime: in migrate_authorities),
    `migrate` commits only with an operator's scope that reaches the run; an unscoped
    key (scope None) is no operator's."""
    scope = None if unscoped else Scope(key_id, _frozen(machines), prefixes, operator)
    run = Driver(machines=_catalog(V1), run_id="mig-1")
    run.create("task_lifecycle")
    run.commit("start")
    run.machines = _catalog(V2, V1)
    decision = run.propose("migrate", payload={"version": V2.version}, scope=scope)
    reaches = scope is not None and scope.refuses("task_lifecycle", "mig-1") is None
    if scope is not None and scope.operator and reaches:
        assert isinstance(decision, Commit), decision
        assert decision.snapshot.machine_version == V2.version
    else:
        assert isinstance(decision, Rejection) and decision.code is RejectionCode.UNAUTHORIZED
        assert run.snapshot is not None and run.snapshot.machine_version == V1.version


def _frozen(machines: list[str] | None) -> frozenset[str] | None:
    return None if machines is None else frozenset(machines)


def test_logs_written_by_earlier_builtin_versions_still_replay() -> None:
    """A run pinned to a built-in version shipped before the contract's later rules is
    decided as it always was (no approval payload, steps restarted while executing or
    run side by side, no ceilings), and its transitions replay under today's catalog,
    which holds that version among the built-ins' history."""
    catalog = load_catalog()
    old = next(
        m
        for m in builtin_history()
        if m.name == "task_lifecycle" and m.spec.concurrent_steps is None
    )
    run = Driver(machines=Catalog([old]), run_id="old-1")
    run.create("task_lifecycle", max_retries=10**6)
    run.commit("start")
    run.commit("step_started", payload={"step": "refund", "idempotency_key": "k1"})
    run.commit("step_started", payload={"step": "refund", "idempotency_key": "k2"})
    run.commit("step_started", payload={"step": "email", "idempotency_key": "k3"})
    run.commit("pause_for_approval")
    run.commit("approval_granted", APPROVER)
    run.commit("complete")
    replayed = apply_transitions(catalog, [(t, None) for t in run.history])
    assert replayed.problems == [] and replayed.snapshots["old-1"] == run.snapshot
