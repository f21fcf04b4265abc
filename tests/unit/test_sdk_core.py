"""The SDK's core without a broker: the outcome book, proposal records, duplicates, the
errors; and that a strictly typed agent type-checks against the SDK alone."""

import json
import re
import subprocess
import sys
import time
import tomllib
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from processor.client import (
    Heartbeat,
    OutcomeBook,
    OutcomeTimeout,
    Rejected,
    Rejection,
    RejectionCode,
    SigningKey,
    Timeout,
    TopicNames,
    Transition,
)
from processor.client.core import (
    answering_partitions,
    approval_payload,
    create_payload,
    decision_event,
    duplicate_of,
    proposal_record,
    raw_proposal_id,
)
from processor.kafka.partitioning import partition_for
from processor.machines import builtin_machines
from schemas.messages import ApprovalPayload, Principal, Proposal
from tests.examples import examples

ROOT = Path(__file__).resolve().parents[2]
TOPICS = TopicNames.with_prefix("t.")


def _transition(pid: str, run_id: str = "r1", revision: int = 0) -> Transition:
    return Transition(
        transition_id=f"{run_id}:{revision}",
        run_id=run_id,
        machine="task_lifecycle",
        revision=revision,
        from_state=None,
        to_state="planned",
        event="create",
        proposal_id=pid,
        principal=Principal(source="runtime", authority="runtime"),
        at_ms=1,
    )


def _rejection(pid: str, code: RejectionCode, original: str | None = None) -> Rejection:
    return Rejection(
        code=code,
        detail="why",
        proposal_id=pid,
        run_id="r1",
        original_transition_id=original,
        at_ms=1,
    )


def test_the_book_keeps_registered_outcomes_only_and_hands_each_over_once() -> None:
    book = OutcomeBook()
    assert not book.offer(_transition("someone-else"))
    assert book.dropped == 1 and len(book) == 0
    book.expect("mine")
    assert book.take("mine") is None  # registered, nothing arrived yet
    first = _transition("mine")
    assert book.offer(first)
    assert book.offer(_rejection("mine", RejectionCode.DUPLICATE, "r1:0"))  # first one wins
    assert book.take("mine") == first
    assert book.take("mine") is None and not book.expecting("mine") and len(book) == 0


def test_the_book_forgets_the_oldest_past_its_capacity() -> None:
    book = OutcomeBook(capacity=3)
    for n in range(5):
        book.expect(f"p{n}")
    assert len(book) == 3 and book.forgotten == 2
    assert not book.expecting("p0") and book.expecting("p4")
    everything = OutcomeBook(capacity=2, keep_all=True)  # a waiter of every partition
    for n in range(4):
        assert everything.offer(_transition(f"q{n}"))
    assert len(everything) == 2 and everything.take("q3") is not None


def test_a_proposal_record_is_keyed_by_run_and_signed_over_what_is_sent() -> None:
    key = SigningKey.hmac("runtime", "a-shared-secret-of-32-characters")
    record = proposal_record(
        TOPICS, key, "run-1", "start", reason="because", proposal_id="p-1", now_ms=1_000
    )
    assert record.key == b"run-1" and record.proposal_id == "p-1"
    proposal = Proposal.model_validate_json(record.value)
    assert (proposal.run_id, proposal.event, proposal.reason) == ("run-1", "start", "because")
    assert record.headers == key.headers(TOPICS.proposals, b"run-1", record.value, 1_000)
    assert proposal_record(TOPICS, key, "run-1", "start").proposal_id != "p-1"  # a fresh id
    assert create_payload("m", max_retries=2) == {"machine": "m", "options": {"max_retries": 2}}


def test_a_run_is_answered_in_its_partition_of_every_output_topic() -> None:
    p = partition_for("run-1", 6)
    assert answering_partitions(TOPICS, b"run-1", 6) == [
        (TOPICS.transitions, p),
        (TOPICS.rejections, p),
        (TOPICS.heartbeats, p),
    ]


def test_a_raw_record_names_its_proposal_id_when_it_has_one() -> None:
    assert raw_proposal_id(b'{"proposal_id": "p-1", "run_id": "r"}') == "p-1"
    for junk in (b"\x00\xff", b"[1]", b'{"proposal_id": 7}', b"{"):
        assert raw_proposal_id(junk) is None


def test_only_a_duplicate_names_an_original_transition() -> None:
    assert duplicate_of(_rejection("p", RejectionCode.DUPLICATE, "r1:0")) == ("r1", "r1:0")
    assert duplicate_of(_rejection("p", RejectionCode.UNKNOWN_EVENT)) is None
    assert duplicate_of(_transition("p")) is None


def test_the_errors() -> None:
    assert issubclass(Timeout, OutcomeTimeout) and issubclass(Timeout, TimeoutError)
    refused = _rejection("p", RejectionCode.UNKNOWN_EVENT)
    with pytest.raises(Rejected) as caught:
        Rejected.raise_for(refused)
    assert caught.value.rejection is refused and caught.value.code is RejectionCode.UNKNOWN_EVENT
    assert caught.value.detail == "why"
    committed = _transition("p")
    assert Rejected.raise_for(committed) is committed
    assert Heartbeat  # re-exported for agents, with the other messages


def test_a_strictly_typed_agent_type_checks_against_the_sdk(tmp_path: Path) -> None:
    """The SDK's own typed agent, the examples a user copies from and the README's
    Python examples: `mypy --strict` (the SDK's own modules are checked by
    test_code_quality; their errors are not the user's)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.DOTALL)
    assert blocks, "the README has a Python example"
    copied = []
    for n, block in enumerate(blocks):
        copied.append(tmp_path / f"readme_{n}.py")
        copied[-1].write_text(block, encoding="utf-8")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--follow-imports=silent",
            # A cache of its own: the project's check uses other flags on the same modules.
            "--cache-dir=.mypy_cache/strict-agent",
            "tests/sdk_agent.py",
            "examples/",
            *map(str, copied),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_typed_agent_runs() -> None:
    from tests.sdk_agent import in_the_test_environment

    assert in_the_test_environment() == "done@4"


def test_the_sdk_ships_its_type_information() -> None:
    """PEP 561: the marker at each top-level package types every package under it."""
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"
    ]
    for package in ("processor", "schemas"):
        assert (ROOT / package / "py.typed").exists()
        assert "py.typed" in package_data[package]


@settings(max_examples=examples(300), deadline=None)
@given(
    value=st.one_of(
        st.binary(max_size=200),
        st.sampled_from(
            [b"[" * 50_000, b"[" * 50_000 + b"]" * 50_000, b'{"a":' * 20_000, b"9" * 5_000]
        ),
        st.builds(
            lambda pid: json.dumps({"proposal_id": pid}).encode(),
            st.one_of(st.text(max_size=20), st.integers(), st.none()),
        ),
    )
)
def test_the_proposal_id_of_any_bytes_is_found_or_none_never_an_error(value: bytes) -> None:
    found = raw_proposal_id(value)
    assert found is None or isinstance(found, str)


@pytest.mark.parametrize("grant", [True, False])
@pytest.mark.parametrize("name", sorted(builtin_machines()))
def test_a_decision_is_the_machines_own_event_of_its_kind(name: str, grant: bool) -> None:
    machine = builtin_machines()[name]
    event = decision_event(machine, grant)
    assert machine.events[event].approval == ("grant" if grant else "deny")
    assert any(src in machine.approval_states for (src, e) in machine.edges if e == event)


def test_a_machine_without_approvals_has_no_decision_event() -> None:
    machine = builtin_machines()["task_lifecycle"]
    bare = replace(machine, events={k: v for k, v in machine.events.items() if v.approval is None})
    with pytest.raises(ValueError, match="no event that decides"):
        decision_event(bare, True)


@given(st.integers(0, 2**40), st.integers(-(10**9), 10**9))
def test_an_approval_payload_names_its_pause_and_expires_from_now(
    pause: int, expires_in_ms: int
) -> None:
    before = int(time.time() * 1000)
    payload = approval_payload(pause, expires_in_ms)
    after = int(time.time() * 1000)
    assert payload["pause"] == pause
    assert before + expires_in_ms <= payload["expires_at_ms"] <= after + expires_in_ms
    if payload["expires_at_ms"] >= 0:
        assert ApprovalPayload.model_validate(payload).pause == pause
