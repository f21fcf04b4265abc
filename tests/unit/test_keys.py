"""Keys over a keyring's life: add, rotate, revoke, list; a worker reading the file again;
a key's scope checked by the engine."""

import json
import os
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from processor.cli.keys import keys
from processor.engine import Scope, decide
from processor.engine.scope import SEPARATORS
from processor.machines import builtin_machines
from processor.records.intake import Credential, Unproven, authenticate
from processor.trust.keyring import KeyringWatch, load_keyring, load_signing_key
from schemas import Principal, Proposal, Rejection, RejectionCode
from schemas.messages import Transition

pytestmark = pytest.mark.unit
TOPIC = "runstate.proposals"


def _run(*args: str) -> dict[str, object]:
    result = CliRunner().invoke(keys, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def _check(ring: Path, key_file: Path, at_ms: int, signed_at: int | None = None) -> object:
    signer = load_signing_key(key_file)
    value = b'{"run_id":"r1","proposal_id":"p1","event":"start"}'
    headers = signer.headers(TOPIC, b"r1", value, at_ms if signed_at is None else signed_at)
    return authenticate(TOPIC, b"r1", value, headers, load_keyring(ring, None), at_ms)


def test_add_rotate_revoke_list(tmp_path: Path) -> None:
    ring = tmp_path / "ring.json"
    first = tmp_path / "a.key.json"
    added = _run(
        "add", "approver", "--keyring-file", str(ring), "--source", "approver:x",
        "--authority", "approver", "--private-key-out", str(first), "--run-prefix", "team-a/",
    )  # fmt: skip
    starts = int(added["not_before_ms"])  # type: ignore[call-overload]
    assert oct(first.stat().st_mode & 0o777) == "0o600"
    assert "private_key" not in ring.read_text() and "secret" not in ring.read_text()
    # Before it takes effect (every worker reads it first), then valid.
    early = _check(ring, first, starts - 1)
    assert isinstance(early, Unproven) and "valid from" in early.why
    ok = _check(ring, first, starts)
    assert isinstance(ok, Credential) and ok.principal.authority == "approver"
    assert ok.scope == Scope("approver", None, ("team-a/",))

    second = tmp_path / "b.key.json"
    rotated = _run(
        "rotate", "approver", "--keyring-file", str(ring), "--private-key-out", str(second),
        "--overlap-ms", "1000",
    )  # fmt: skip
    assert rotated["new_key_id"] == "approver.2"
    old_ends = int(rotated["old_not_after_ms"])  # type: ignore[call-overload]
    assert isinstance(_check(ring, first, old_ends - 1), Credential)
    expired = _check(ring, first, old_ends)
    assert isinstance(expired, Unproven) and "expired" in expired.why
    fresh = _check(ring, second, old_ends)
    assert isinstance(fresh, Credential) and fresh.scope is not None  # scope carried over

    revoked = _run(
        "revoke", "approver.2", "--keyring-file", str(ring), "--effective-in-ms", "20000"
    )
    at = int(revoked["revoked_at_ms"])  # type: ignore[call-overload]
    assert isinstance(_check(ring, second, at - 1), Credential)  # its past stays valid
    gone = _check(ring, second, at)
    assert isinstance(gone, Unproven) and gone.code is RejectionCode.UNAUTHENTICATED
    assert "revoked" in gone.why

    listed = _run("list", "--keyring-file", str(ring))
    shown = {k["key_id"]: k for k in listed["keys"]}  # type: ignore[attr-defined]
    assert set(shown) == {"approver", "approver.2"}
    assert shown["approver.2"]["valid_now"] is False


def test_a_hmac_keyring_from_generate_signs_and_verifies(tmp_path: Path) -> None:
    ring = tmp_path / "ring.json"
    out = _run("generate", str(ring), "--algorithm", "hmac-sha256")
    files = out["signing_keys"]
    assert isinstance(files, dict)
    assert set(files) == {"runtime", "tool", "model", "approver", "operator", "worker"}
    now = int(time.time() * 1000)
    assert isinstance(_check(ring, Path(files["tool"]), now), Credential)
    stale = _check(ring, Path(files["tool"]), now, signed_at=now - 300_001)
    assert isinstance(stale, Unproven) and stale.code is RejectionCode.STALE_SIGNATURE


def test_a_worker_reads_the_keyring_again_and_keeps_it_when_the_file_is_broken(
    tmp_path: Path,
) -> None:
    ring = tmp_path / "ring.json"
    _run("generate", str(ring))
    watch = KeyringWatch(load_keyring(ring, None), ring, interval_s=0.0)
    assert set(watch.current().keys) == {
        "runtime",
        "tool",
        "model",
        "approver",
        "operator",
        "worker",
    }
    _run(
        "add", "extra", "--keyring-file", str(ring), "--source", "s", "--authority", "a",
        "--private-key-out", str(tmp_path / "x.json"),
    )  # fmt: skip
    assert "extra" in watch.current().keys
    ring.write_text('{"keys": ')  # half-written by hand
    os.utime(ring, ns=(time.time_ns(), time.time_ns() + 10**9))
    assert "extra" in watch.current().keys


def test_scope_is_authority_checked_by_the_engine() -> None:
    machines = builtin_machines()
    runtime = Principal(source="runtime", authority="runtime")
    create = Proposal(
        proposal_id="c", run_id="team-b/1", event="create", payload={"machine": "run_state"}
    )
    team_a = Scope("k", frozenset({"run_state"}), ("team-a/",))
    refused = decide(machines, None, create, runtime, 1, None, team_a)
    assert isinstance(refused, Rejection) and refused.code is RejectionCode.UNAUTHORIZED
    other_machine = Scope("k", frozenset({"task_lifecycle"}), None)
    refused = decide(machines, None, create, runtime, 1, None, other_machine)
    assert isinstance(refused, Rejection) and "limited to machines" in refused.detail
    made = decide(machines, None, create, runtime, 1, None, Scope("k", None, ("team-b/",)))
    assert hasattr(made, "transition") and isinstance(made.transition, Transition)  # type: ignore[union-attr]
    start = Proposal(proposal_id="s", run_id="team-b/1", event="start")
    later = decide(machines, made.snapshot, start, runtime, 2, None, team_a)  # type: ignore[union-attr]
    assert isinstance(later, Rejection) and later.code is RejectionCode.UNAUTHORIZED


@pytest.mark.parametrize(
    ("prefix", "run_id", "reached"),
    [
        ("team-a", "team-a", True),
        ("team-a", "team-a-7", True),
        ("team-a", "team-a/7", True),
        ("team-a", "team-a:7", True),
        ("team-a", "team-ab-7", False),
        ("team-a", "team-a7", False),
        ("team-a-", "team-a-7", True),
        ("team-a/", "team-ab/7", False),
        ("team-a", "team-", False),
    ],
)
def test_scope_prefixes_match_on_a_separator_boundary(
    prefix: str, run_id: str, reached: bool
) -> None:
    assert (Scope("k", None, (prefix,)).refuses_run(run_id) is None) is reached


@given(
    prefix=st.text(alphabet="ab-/", min_size=1, max_size=6),
    rest=st.text(alphabet="ab-/", max_size=6),
)
def test_a_scope_prefix_never_reaches_a_longer_word(prefix: str, rest: str) -> None:
    """Whatever the prefix, a run id it reaches is the prefix itself or goes on past a
    separator: never a longer word that merely starts the same."""
    run_id = prefix + rest
    reached = Scope("k", None, (prefix,)).refuses_run(run_id) is None
    boundary = rest == "" or prefix[-1] in SEPARATORS or rest[0] in SEPARATORS
    assert reached is boundary


def test_a_refusal_out_of_scope_tells_nothing_of_the_run() -> None:
    """A key out of a run's scope learns neither the run's state, revision nor machine,
    nor whether it exists at all (for a key limited by run prefix)."""
    machines = builtin_machines()
    runtime = Principal(source="runtime", authority="runtime")
    create = Proposal(
        proposal_id="c", run_id="team-b/1", event="create", payload={"machine": "owned_run"}
    )
    made = decide(machines, None, create, runtime, 1)
    assert hasattr(made, "snapshot")
    team_a = Scope("k", None, ("team-a",))
    for snapshot in (made.snapshot, None):  # type: ignore[union-attr]
        for event in ("run_started", "create", "run_cancelled"):
            probe = Proposal(proposal_id="x", run_id="team-b/1", event=event)
            refused = decide(machines, snapshot, probe, runtime, 2, None, team_a)
            assert isinstance(refused, Rejection) and refused.code is RejectionCode.UNAUTHORIZED
            assert refused.state is None and refused.revision is None
            assert "owned_run" not in refused.detail
    machine_scoped = Scope("k", frozenset({"run_state"}), None)
    probe = Proposal(proposal_id="x", run_id="team-b/1", event="run_started")
    refused = decide(machines, made.snapshot, probe, runtime, 2, None, machine_scoped)  # type: ignore[union-attr]
    assert isinstance(refused, Rejection) and refused.state is None and refused.revision is None
    assert "owned_run" not in refused.detail and "queued" not in refused.detail
