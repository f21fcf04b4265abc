"""Property tests: no record can stop a partition (poison records; no broker).

1. The pipeline: any key, value and headers, however hostile (lone surrogates spelled as
   JSON escapes, control characters, invalid UTF-8 in the key, values and states around
   every size limit), end as exactly one outcome whose records the topics take.
2. The store: runs with any valid id (non-ASCII, near 256 bytes, spelling the store's own
   key prefixes) committed through the engine read back from every index, and a store
   restored from the changelog and transitions records reads back the same.
"""

import base64
import hashlib
import json
import shutil
from collections import Counter
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path
from typing import Any

import hypothesis
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from processor.engine import Beat, Commit, Forget
from processor.engine.answers import committed_digest
from processor.engine.parse import parse_machine
from processor.kafka.partitioning import partition_for
from processor.kafka.topics import TopicNames
from processor.machines import builtin_machines, builtin_source
from processor.records.changelog_keys import (
    FIRED_CHANGELOG_PREFIX,
    answer_changelog_key,
    history_changelog_key,
)
from processor.records.intake import Headers
from processor.records.limits import RecordLimits
from processor.records.outputs import MAX_OUTPUT_KEY_BYTES, OutputRecord, Source, outcome_records
from processor.records.pipeline import (
    Admitted,
    DeadLetterReason,
    Outcome,
    Placement,
    Seen,
    admit_record,
    decide_admitted,
    decide_record,
)
from processor.records.punctuator import NOT_FIRED, Fired
from processor.runtimes.native.restore import index_header
from processor.runtimes.native.store.changelog import ChangelogRecord
from processor.runtimes.native.store.changes import PartitionTransaction, PreparedWrite
from processor.runtimes.native.store.indexes import InState
from processor.runtimes.native.store.partition import PartitionStore
from processor.trust.keygen import generate_keyring
from processor.trust.keyring import SigningKey, signing_key_from
from processor.trust.signatures import HEADER_KEY_ID, HEADER_SIGNATURE, HEADER_SIGNED_AT
from schemas.audit import transition_hash
from schemas.codes import RejectionCode
from schemas.identifiers import MAX_RUN_ID_BYTES, is_name, is_proposal_id, is_run_id
from schemas.messages import (
    DeadLetter,
    Heartbeat,
    Rejection,
    RunSnapshot,
    StepStatus,
    Transition,
)
from tests.examples import examples

NOW = 1_800_000_000_000
FAR_FUTURE = 2**62
# Every signature is fresh here, whatever a record's time: freshness has properties of
# its own (test_signatures.py).
KEYRING = generate_keyring().model_copy(
    update={"signature_max_age_ms": 2**53, "clock_skew_ms": 2**53}
)
# task_lifecycle keeps a finished run 1 ms here, so that runs are forgotten in these tests.
MACHINES = {
    **builtin_machines(),
    "task_lifecycle": parse_machine(
        builtin_source("task_lifecycle").replace(
            "name: task_lifecycle", "name: task_lifecycle\nretention_ms: 1"
        )
    ),
}
TOPICS = TopicNames.with_prefix()
SOURCE_TOPIC = TOPICS.proposals
PROPERTY = settings(
    deadline=None,
    database=None,  # nothing written into the working tree
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# -- text ---------------------------------------------------------------------------
#: Every code point: lone surrogates (JSON can spell them as `\udXXX`) and controls too.
ANY_CHAR = st.characters(exclude_categories=())
#: What a run id may hold: no surrogate, no C0/C1 control (category Cc is exactly those).
ID_CHAR = st.characters(exclude_categories=("Cs", "Cc"))
WIDE_CHAR = st.characters(min_codepoint=0x80, exclude_categories=("Cs", "Cc"))
NASTY = [
    "\x00fired\x00x",  # spells the changelog's fired-mark prefix
    "\x00fired\x00",
    "\ud800",
    "a\udfff",
    "\udbff\udc00",  # a pair as escapes: JSON decodes it to U+10FC00
    "r\ufffd",  # what a lossy decode of b"r\xff" gives
    "\ufffd",
    "s/",
    "t/\x00",
    "\x7f",
    "\x9f",
    "a\x85b",
    "x\ny",
    "é" * 128,  # 256 bytes: the longest run id
    "é" * 129,  # 258 bytes
    "😀" * 64,
    "😀" * 65,
    "x" * 256,
    "x" * 257,
    "",
    " ",
    '"',
    "\\",
    "\u2028",
    "\U0010ffff",
]
text_any = st.one_of(
    st.text(ID_CHAR, max_size=12),
    st.text(ANY_CHAR, max_size=12),
    st.sampled_from(NASTY),
)
#: What most fields hold, so that most records get as far as the engine.
clean_text = st.text(ID_CHAR, min_size=1, max_size=12)


def json_values(text: st.SearchStrategy[str]) -> st.SearchStrategy[Any]:
    scalars = st.one_of(
        st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False), text
    )
    return st.recursive(
        scalars,
        lambda inner: st.one_of(
            st.lists(inner, max_size=3), st.dictionaries(text, inner, max_size=3)
        ),
        max_leaves=6,
    )


json_value = json_values(text_any)
clean_json = json_values(clean_text)


@st.composite
def deeply_nested(draw: st.DrawFn) -> Any:
    """Objects and arrays, mixed, nested around the payload's depth limit (64) and around
    the parser's recursion limit (about 200, the depth that once committed and then could
    not be read back from the run's snapshot)."""
    depth = draw(st.one_of(st.integers(60, 68), st.integers(185, 215)))
    rng = draw(st.randoms(use_true_random=False))
    value: Any = rng.choice([None, 1, "x", [], {}])
    for _ in range(depth):
        value = [value] if rng.random() < 0.5 else {"k": value}
    return value


def step_results(values: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Step results: small, large (around every limit), multi-byte, nested."""
    return st.one_of(
        values,
        deeply_nested(),
        st.integers(0, 7_000).map(lambda n: "r" * n),
        st.integers(0, 2_500).map(lambda n: "é" * n),
        st.integers(0, 400).map(lambda n: {"rows": ["x" * 9] * n}),
    )


run_id_candidates = st.one_of(
    st.sampled_from(NASTY),
    st.text(ANY_CHAR, max_size=20),
    st.text(ID_CHAR, min_size=1, max_size=12),
)

# -- the pipeline ---------------------------------------------------------------------
TASK_EVENTS = [
    "start",
    "pause_for_approval",
    "approval_granted",
    "approval_denied",
    "block_on_dependency",
    "dependency_resolved",
    "transient_error",
    "retry",
    "max_retries_exceeded",
    "complete",
    "fatal_error",
    "timeout",
]
RUNNING_EVENTS = ["step_started", "step_succeeded", "step_failed", "heartbeat"] * 3 + [
    "pause_for_approval",
    "complete",
    "transient_error",
    "tool_result",
]
ALL_EVENTS = sorted({*TASK_EVENTS, *RUNNING_EVENTS, "create", "start", "run_started", "bogus"})
STEP_NAMES = ["a", "b", "c", "d", "e"]
#: The key id each event is signed with when it is signed validly.
SIGNER = {"approval_granted": "approver", "approval_denied": "approver", "tool_result": "tool"}


def _key_for(run_id: str) -> bytes:
    """The record key a producer derives from a run id (surrogates kept as CESU bytes)."""
    return run_id.encode("utf-8", "surrogatepass")


def _as_sent(run_id: object) -> object:
    """The run id the worker will see after JSON decoding (a surrogate pair combines)."""
    return json.loads(json.dumps(run_id)) if isinstance(run_id, str) else run_id


@st.composite
def payloads(draw: st.DrawFn, event: str, hostile: bool, snapshot: RunSnapshot | None) -> object:
    text, values = (text_any, json_value) if hostile else (clean_text, clean_json)
    if event == "create":
        options: dict[str, Any] = {}
        if draw(st.booleans()):
            deadlines = {
                k: draw(st.one_of(st.integers(-5, 3_000_000), st.sampled_from([1, 10**7])))
                for k in ("approval_timeout_ms", "heartbeat_timeout_ms", "retry_backoff_ms")
                if draw(st.booleans())
            }
            options["deadlines"] = deadlines
        if draw(st.booleans()):
            options["max_retries"] = draw(st.integers(-1, 3))
        machine = draw(st.sampled_from([*sorted(MACHINES), "nope", "\ud800"]))
        return {"machine": machine, "options": options}
    step = draw(st.sampled_from(STEP_NAMES))
    # Mostly a step that can take the event, so the ledger (and the snapshot) grows.
    steps = {} if snapshot is None else snapshot.steps
    fresh = [n for n in STEP_NAMES if n not in steps or steps[n].status is not StepStatus.SUCCEEDED]
    executing = [n for n, record in steps.items() if record.status is StepStatus.EXECUTING]
    likely = executing if event in ("step_succeeded", "step_failed") else fresh
    if likely and draw(st.integers(0, 3)) > 0:
        step = draw(st.sampled_from(sorted(likely)))
    if event == "step_started":
        return {"step": step, "idempotency_key": draw(text)}
    if event == "step_succeeded":
        return {"step": step, "result": draw(step_results(values))}
    if event == "step_failed":
        return {"step": step, "error": draw(st.one_of(text, st.just("e" * 5_000)))}
    if event == "tool_result":
        return {"fact": draw(st.one_of(text, st.integers(1, 1_100).map(lambda n: "f" * n)))}
    return draw(st.one_of(st.just({}), st.dictionaries(text, values, max_size=2)))


def _next_event(draw: st.DrawFn, snapshot: RunSnapshot | None) -> str:
    """Mostly an event the run can take, so sequences go deep; sometimes anything."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.one_of(st.sampled_from(ALL_EVENTS), text_any))
    if snapshot is None:
        return "create"
    if snapshot.revision == 0:
        return "run_started" if snapshot.machine == "owned_run" else "start"
    if snapshot.state == "running":
        return draw(st.sampled_from(RUNNING_EVENTS))
    return draw(st.sampled_from(TASK_EVENTS))


def _encode(obj: object, ascii_only: bool) -> bytes:
    if ascii_only:  # lone surrogates and controls become \udXXX / \u0000 escapes
        return json.dumps(obj).encode()
    return json.dumps(obj, ensure_ascii=False).encode("utf-8", "surrogatepass")


@st.composite
def proposal_values(
    draw: st.DrawFn, run_id: str, snapshot: RunSnapshot | None, seq: int, max_bytes: int
) -> tuple[bytes, str]:
    """(value, event): a proposal as JSON, possibly mangled, possibly sized to the limit."""
    # One record in four is hostile all through; the others mostly valid.
    hostile = draw(st.integers(0, 3)) == 0
    text, values = (text_any, json_value) if hostile else (clean_text, clean_json)
    event = _next_event(draw, snapshot)
    proposal_id = f"p{seq}"
    if draw(st.integers(0, 4)) == 0:
        ids = ["p0", "é" * 64, "é" * 65, "q" * 128, "q" * 129]
        proposal_id = draw(st.one_of(text, st.sampled_from(ids)))
    obj: dict[str, Any] = {"run_id": run_id, "proposal_id": proposal_id, "event": event}
    if draw(st.integers(0, 4)) > 0:
        obj["payload"] = draw(payloads(event, hostile, snapshot))
    if draw(st.integers(0, 3)) == 0:
        obj["metadata"] = draw(
            st.dictionaries(text, st.one_of(values, deeply_nested()), max_size=3)
        )
    if draw(st.integers(0, 3)) == 0:
        obj["reason"] = draw(st.one_of(text, st.sampled_from(["why" * 85, "why" * 86])))
    if draw(st.integers(0, 3)) == 0:
        obj["expected_revision"] = draw(st.one_of(st.integers(-1, 4), st.booleans()))
    mangle = draw(st.integers(0, 29)) if hostile else -1
    if mangle == 0:
        del obj[draw(st.sampled_from(sorted(obj)))]
    elif mangle == 1:
        obj[draw(text_any)] = draw(json_value)
    elif mangle == 2:
        obj[draw(st.sampled_from(sorted(obj)))] = draw(json_value)
    elif mangle == 3:
        obj["schema_version"] = draw(st.sampled_from([0, 1, 2, "1", None]))
    ascii_only = not hostile or draw(st.booleans())
    value = _encode(obj, ascii_only)
    if draw(st.integers(0, 3)) == 0:  # exactly around the proposal limit
        want = max_bytes + draw(st.integers(-2, 2))
        found = obj.get("metadata")
        meta: dict[str, Any] = found if isinstance(found, dict) else {}
        base = _encode({**obj, "metadata": {**meta, "pad": ""}}, ascii_only)
        if len(base) <= want:
            padded = {**obj, "metadata": {**meta, "pad": "x" * (want - len(base))}}
            value = _encode(padded, ascii_only)
            assert len(value) == want
    return value, event


@st.composite
def record_keys(draw: st.DrawFn, run_id: object) -> bytes | None:
    exact = _key_for(run_id) if isinstance(run_id, str) else str(run_id).encode()
    kind = draw(st.sampled_from(["exact"] * 12 + ["none", "bytes", "append", "lossy", "long"]))
    if kind == "exact":
        return exact
    if kind == "none":
        return None
    if kind == "bytes":
        return draw(st.binary(max_size=40))
    bad = draw(st.sampled_from([b"\xff", b"\x80", b"\xc3", b"\xe2\x82", b"\xed\xa0\x80"]))
    if kind == "append":
        return exact + bad
    if kind == "lossy":  # differs from the run id only where a lossy decode would hide it
        if "\ufffd".encode() in exact:
            return exact.replace("\ufffd".encode(), bad)
        at = draw(st.integers(0, len(exact)))
        return exact[:at] + bad + exact[at + 1 :]
    return exact + b"k" * (MAX_OUTPUT_KEY_BYTES + 10)


@st.composite
def record_headers(
    draw: st.DrawFn, key: bytes | None, value: bytes | None, event: object
) -> Headers:
    kind = draw(st.sampled_from(["signed"] * 11 + ["none", "junk", "bad", "other", "dict", "dict"]))
    key_id = SIGNER.get(event, "runtime") if isinstance(event, str) else "runtime"
    if draw(st.integers(0, 9)) == 0:
        key_id = draw(st.sampled_from(sorted(KEYRING.keys)))
    signer = signing_key_from(KEYRING, key_id)
    signed = signer.headers(SOURCE_TOPIC, key, value or b"", NOW)
    if kind == "signed":
        return signed
    if kind == "dict":
        return dict(signed)
    if kind == "none":
        return None
    if kind == "bad":
        forger = SigningKey.hmac(
            draw(st.from_regex(r"[A-Za-z0-9.:@-]{1,12}", fullmatch=True)), "x" * 16
        )
        return forger.headers(SOURCE_TOPIC, key, value or b"", NOW)
    if kind == "other":
        return signer.headers(SOURCE_TOPIC, key, (value or b"") + b" ", NOW)
    junk = draw(
        st.lists(
            st.tuples(
                st.one_of(
                    st.sampled_from([HEADER_KEY_ID, HEADER_SIGNATURE, HEADER_SIGNED_AT]), text_any
                ),
                st.one_of(st.none(), st.binary(max_size=80)),
            ),
            max_size=4,
        )
    )
    return [*junk, *signed] if draw(st.booleans()) else junk


@st.composite
def records(
    draw: st.DrawFn, run_id: str, snapshot: RunSnapshot | None, seq: int, max_bytes: int
) -> tuple[bytes | None, bytes | None, Headers, object]:
    """(key, value, headers, run id as sent) of one record for run `run_id`."""
    kind = draw(st.sampled_from(["proposal"] * 16 + ["none", "bytes", "json", "cut", "deep"]))
    event: object = None
    value: bytes | None
    if kind == "none":
        value = None
    elif kind == "bytes":
        value = draw(st.binary(max_size=max_bytes + 10))
    elif kind == "json":
        value = _encode(draw(json_value), draw(st.booleans()))
    elif kind == "deep":
        value = draw(st.sampled_from([b"[" * 5_000, b"[" * 5_000 + b"]" * 5_000]))
    else:
        value, event = draw(proposal_values(run_id, snapshot, seq, max_bytes))
        if kind == "cut":
            value = value[: draw(st.integers(0, max(0, len(value) - 1)))]
    sent = _as_sent(run_id)
    key = draw(record_keys(sent))
    return key, value, draw(record_headers(key, value, event)), sent


def _decide(
    key: bytes | None,
    value: bytes | None,
    headers: Headers,
    at_ms: int,
    lookup: Callable[[str], RunSnapshot | None],
    max_bytes: int,
    max_state_bytes: int,
    seen: Seen = lambda _run, _proposal: None,
    placement: Placement | None = None,
) -> Outcome:
    return decide_record(
        key,
        value,
        headers,
        at_ms,
        topic=SOURCE_TOPIC,
        keyring=KEYRING,
        machines=MACHINES,
        lookup=lookup,
        seen=seen,
        placement=placement,
        max_bytes=max_bytes,
        max_state_bytes=max_state_bytes,
    )


def _records(outcome: Outcome, source: Source, limits: RecordLimits) -> list[OutputRecord]:
    return outcome_records(TOPICS, outcome, source, limits)


def _encoded(commit: Commit) -> tuple[bytes, bytes]:
    assert commit.encoded is not None, "a commit comes back with its records encoded"
    return commit.encoded


def _kind(outcome: Outcome) -> str:
    if isinstance(outcome, Rejection):
        return f"rejected {outcome.code.value}"
    return "committed" if isinstance(outcome, Commit) else "dead-lettered"


def _b64(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text, validate=True)


def _sha(raw: bytes | None) -> str | None:
    return None if raw is None else hashlib.sha256(raw).hexdigest()


def check_dead_letter(record: OutputRecord, source: Source, reason: str) -> None:
    assert record.topic == TOPICS.dlq
    key = source.key
    assert record.key == (key if key is None or len(key) <= MAX_OUTPUT_KEY_BYTES else None)
    letter = DeadLetter.model_validate_json(record.value)
    assert (letter.topic, letter.partition, letter.offset) == (
        source.topic,
        source.partition,
        source.offset,
    )
    assert letter.at_ms == source.timestamp_ms
    assert letter.error[:32] == reason[:32]
    assert letter.value_length == (None if source.value is None else len(source.value))
    assert letter.value_sha256 == _sha(source.value)
    assert letter.key_length == (None if key is None else len(key))
    assert letter.key_sha256 == _sha(key)
    kept_value, kept_key = _b64(letter.value_base64), _b64(letter.key_base64)
    assert (kept_value is None) == (source.value is None)
    assert (kept_key is None) == (key is None)
    if not letter.truncated:
        assert kept_value == source.value, "a DLQ record keeps the exact original bytes"
        assert kept_key == key
    else:
        assert source.value is None or source.value.startswith(kept_value or b"")
        assert key is None or key.startswith(kept_key or b"")


def check_outcome(
    outcome: Outcome,
    source: Source,
    sent_run_id: object,
    limits: RecordLimits,
    max_state_bytes: int,
) -> None:
    kinds = [isinstance(outcome, kind) for kind in (Commit, Beat, Rejection, DeadLetterReason)]
    assert sum(kinds) == 1, f"not exactly one outcome: {outcome!r}"
    out = _records(outcome, source, limits)
    if isinstance(outcome, Beat):
        run_id = outcome.snapshot.run_id
        assert run_id == sent_run_id and source.key == run_id.encode()
        assert [(r.topic, r.key) for r in out] == [
            (TOPICS.heartbeats, source.key),
            (TOPICS.changelog, source.key),
        ]
        assert Heartbeat.model_validate_json(out[0].value) == outcome.heartbeat
        assert RunSnapshot.model_validate_json(out[1].value) == outcome.snapshot
        return
    if isinstance(outcome, Commit):
        run_id = outcome.snapshot.run_id
        assert is_run_id(run_id), f"committed an invalid run id {run_id!r}"
        assert is_proposal_id(outcome.transition.proposal_id)
        assert outcome.transition.run_id == run_id == sent_run_id
        assert source.key == run_id.encode(), (
            f"committed run {run_id!r} from a record keyed {source.key!r}"
        )
        transition, snapshot = _encoded(outcome)
        assert len(transition) <= max_state_bytes and len(snapshot) <= max_state_bytes
        assert Transition.model_validate_json(transition) == outcome.transition
        assert RunSnapshot.model_validate_json(snapshot) == outcome.snapshot
        assert [(r.topic, r.key, r.value) for r in out] == [
            (TOPICS.transitions, source.key, transition),
            (
                TOPICS.changelog,
                history_changelog_key(run_id, outcome.transition.revision),
                transition,
            ),
            (TOPICS.changelog, source.key, snapshot),
        ]
        return
    if isinstance(outcome, Rejection) and outcome.content_digest is not None:
        # A refusal the run remembers: its answer goes to the changelog too, as published.
        assert outcome.run_id is not None and outcome.proposal_id is not None
        answer = out.pop()
        assert answer.topic == TOPICS.changelog and answer.value == out[0].value
        assert answer.key == answer_changelog_key(outcome.run_id, outcome.proposal_id)
    assert len(out) == 1
    (record,) = out
    limit = limits.of(record.topic)
    assert len(record.value) + len(record.key or b"") <= limit, (
        f"{record.topic} record of {len(record.value)} + {len(record.key or b'')} bytes "
        f"is over the topic's {limit}"
    )
    if isinstance(outcome, DeadLetterReason):
        check_dead_letter(record, source, outcome.reason)
        return
    assert outcome.run_id is None or is_run_id(outcome.run_id), outcome.run_id
    assert outcome.proposal_id is None or is_proposal_id(outcome.proposal_id)
    assert outcome.event is None or is_name(outcome.event)
    assert record.topic == TOPICS.rejections
    if outcome.run_id is not None:
        assert record.key == outcome.run_id.encode()
    published = Rejection.model_validate_json(record.value)
    assert (published.code, published.run_id, published.proposal_id, published.at_ms) == (
        outcome.code,
        outcome.run_id,
        outcome.proposal_id,
        outcome.at_ms,
    )


@settings(PROPERTY, max_examples=examples(60))
@given(data=st.data())
def test_no_record_stops_the_pipeline(data: st.DataObject) -> None:
    max_bytes = data.draw(st.sampled_from([600, 2_000, 6_000]), label="max_bytes")
    max_state_bytes = data.draw(st.sampled_from([2_500, 5_000]), label="max_state_bytes")
    small = data.draw(st.integers(2_500, 3_000), label="rejections/dlq limit")
    limits = RecordLimits(by_topic={TOPICS.rejections: small, TOPICS.dlq: small})
    # A run id that is valid takes most records, so its run goes deep; others are hostile.
    main = data.draw(st.text(ID_CHAR, min_size=1, max_size=8), label="main run id")
    others = data.draw(st.lists(run_id_candidates, max_size=3), label="other run ids")
    snapshots: dict[str, RunSnapshot] = {}
    partitions = data.draw(st.sampled_from([1, 2, 3, 7]), label="partitions")
    at_ms = NOW
    decided: list[tuple[tuple[Any, ...], Placement, Outcome]] = []
    for seq in range(data.draw(st.integers(1, 40), label="records")):
        run_id = main
        if others and data.draw(st.integers(0, 2)) == 0:
            run_id = data.draw(st.sampled_from(others))
        sent = _as_sent(run_id)
        current = snapshots.get(sent) if isinstance(sent, str) else None
        key, value, headers, sent = data.draw(records(run_id, current, seq, max_bytes))
        at_ms += data.draw(st.sampled_from([0, 1, 1, 1_000, 1_000, 2_000_000]))
        # Most records where murmur2 of the run id puts them; some where another
        # partitioner (or a grown topic) would.
        home = partition_for(sent, partitions) if is_run_id(sent) else 0
        misplaced = data.draw(st.integers(0, 5), label="misplaced") == 0
        partition = data.draw(st.integers(0, partitions - 1)) if misplaced else home
        placed = Placement(partition, partitions)
        args = (key, value, headers, at_ms, snapshots.get, max_bytes, max_state_bytes)
        outcome = _decide(*args, placement=placed)
        assert _decide(*args, placement=placed) == outcome, (
            "the same record must get the same outcome"
        )
        if isinstance(outcome, Commit | Beat):
            assert partition == home, f"decided in partition {partition}, its home is {home}"
        if isinstance(outcome, Rejection) and outcome.code is RejectionCode.WRONG_PARTITION:
            assert partition != home
        source = Source(SOURCE_TOPIC, 3, seq, key, value, at_ms)
        check_outcome(outcome, source, sent, limits, max_state_bytes)
        hypothesis.event(_kind(outcome))
        if isinstance(outcome, Commit):
            before = snapshots.get(outcome.snapshot.run_id)
            assert outcome.snapshot.revision == (0 if before is None else before.revision + 1)
        if isinstance(outcome, Commit | Beat):
            snapshots[outcome.snapshot.run_id] = outcome.snapshot
        decided.append((args, placed, outcome))
    # The native worker admits a whole batch before it decides any of it: admission
    # reads no state, so the outcomes are the same, record for record.
    admitted = [
        admit_record(
            key,
            value,
            headers,
            at,
            topic=SOURCE_TOPIC,
            keyring=KEYRING,
            placement=placed,
            max_bytes=max_bytes,
        )
        for (key, value, headers, at, *_), placed, _ in decided
    ]
    runs: dict[str, RunSnapshot] = {}
    for admission, ((*_, at, _lookup, _max, max_state), _placed, outcome) in zip(
        admitted, decided, strict=True
    ):
        if isinstance(admission, Admitted):
            again = decide_admitted(
                admission,
                at,
                machines=MACHINES,
                lookup=runs.get,
                seen=lambda _run, _proposal: None,
                max_state_bytes=max_state,
            )
        else:
            again = admission
        assert again == outcome
        if isinstance(again, Commit | Beat):
            runs[again.snapshot.run_id] = again.snapshot


def test_known_poison_records_end_as_outcomes() -> None:
    """The counterexamples that once stopped a partition, pinned down."""
    limits = RecordLimits(by_topic={TOPICS.rejections: 3_000, TOPICS.dlq: 3_000})
    create = {"proposal_id": "p", "event": "create", "payload": {"machine": "task_lifecycle"}}
    cases: list[tuple[bytes | None, dict[str, Any]]] = [
        (b"\xed\xa0\x80", {"run_id": "\ud800", **create}),  # lone surrogate: rejected, keyed
        (b"r\xff", {"run_id": "r\ufffd", **create}),  # same run id after a lossy decode
        (b"\x00fired\x00x", {"run_id": "\x00fired\x00x", **create}),
        ("é".encode() * 129, {"run_id": "é" * 129, **create}),
        (b"r", {"run_id": "r", **create, "proposal_id": "\x00"}),
    ]
    for key, obj in cases:
        value = json.dumps(obj).encode()
        signed = signing_key_from(KEYRING, "runtime").headers(SOURCE_TOPIC, key, value, NOW)
        outcome = _decide(key, value, signed, NOW, lambda _: None, 2_000, 5_000)
        assert isinstance(outcome, Rejection), (obj, outcome)
        assert outcome.code is RejectionCode.SCHEMA_INVALID
        check_outcome(outcome, Source(SOURCE_TOPIC, 0, 0, key, value, NOW), None, limits, 5_000)


CREATE_R = (
    b'{"run_id":"r","proposal_id":"p","event":"create","payload":{"machine":"task_lifecycle"}'
)


@pytest.mark.parametrize("signature", [b"\x80", "é".encode(), b"\xff" * 64], ids=["x80", "e", "ff"])
def test_a_signature_header_that_is_not_ascii_is_refused(signature: bytes) -> None:
    """Any non-ASCII byte in the signature header is refused unauthenticated, never a
    TypeError out of `hmac.compare_digest` (a str that is not ASCII) out of decide_record."""
    value = CREATE_R + b"}"
    headers = [(HEADER_KEY_ID, b"runtime"), (HEADER_SIGNED_AT, b"1"), (HEADER_SIGNATURE, signature)]
    outcome = _decide(b"r", value, headers, NOW, lambda _: None, 2_000, 5_000)
    assert isinstance(outcome, Rejection), outcome
    assert outcome.code is RejectionCode.UNAUTHENTICATED


@pytest.mark.parametrize("number", [b"Infinity", b"-Infinity", b"NaN", b"1e400"])
def test_a_commit_is_published_as_it_was_decided(number: bytes) -> None:
    """JSON numbers that are not finite are never committed into metadata: published as
    null, the transition record read back would have a hash that does not match its
    content (and `verify` would report it)."""
    value = CREATE_R + b',"metadata":{"x":' + number + b"}}"
    headers = signing_key_from(KEYRING, "runtime").headers(SOURCE_TOPIC, b"r", value, NOW)
    outcome = _decide(b"r", value, headers, NOW, lambda _: None, 2_000, 5_000)
    if isinstance(outcome, Rejection):  # refusing it is as good as keeping it
        assert outcome.code is RejectionCode.SCHEMA_INVALID
        return
    assert isinstance(outcome, Commit), outcome
    transition, _ = _encoded(outcome)
    published = Transition.model_validate_json(transition)
    assert transition_hash(published.__dict__) == published.hash == outcome.transition.hash


@pytest.mark.parametrize(
    "number", [b"9007199254740992", b"-9007199254740992", b"1" + b"0" * 300, b"9" * 4301]
)
def test_an_integer_no_hash_could_hold_is_refused(number: bytes) -> None:
    """Integers beyond ±(2**53-1) are not I-JSON, and RFC 8785 (canonical JSON for
    hashing) has no form for them: a proposal with one is refused schema_invalid (one too
    long for Python to read at all goes to the DLQ), never committed."""
    value = CREATE_R + b',"metadata":{"x":[' + number + b"]}}"
    headers = signing_key_from(KEYRING, "runtime").headers(SOURCE_TOPIC, b"r", value, NOW)
    outcome = _decide(b"r", value, headers, NOW, lambda _: None, 10_000, 100_000)
    if len(number) > 4300:
        assert isinstance(outcome, DeadLetterReason), outcome
        assert "integer too long" in outcome.reason
        return
    assert isinstance(outcome, Rejection), outcome
    assert outcome.code is RejectionCode.SCHEMA_INVALID and outcome.run_id == "r"
    assert "beyond ±(2**53-1)" in outcome.detail and " at .x[0] " in outcome.detail


@pytest.mark.parametrize("number", [b"NaN", b"Infinity", b"-Infinity", b"1e400", b"-2E+999"])
@pytest.mark.parametrize("field", ["payload", "metadata"])
def test_a_number_json_has_not_is_refused_never_committed_as_null(
    number: bytes, field: str
) -> None:
    """NaN and the infinities are no JSON numbers, and 1e400 reads as an infinity: a
    parser that takes them would commit the value written back as null, another value
    than the agent sent. Refused schema_invalid, naming where on one line (a key's
    newline escaped)."""
    value = CREATE_R + b',"' + field.encode() + b'":{"a\\nb":{"x":[1,' + number + b"]}}}"
    headers = signing_key_from(KEYRING, "runtime").headers(SOURCE_TOPIC, b"r", value, NOW)
    outcome = _decide(b"r", value, headers, NOW, lambda _: None, 10_000, 100_000)
    assert isinstance(outcome, Rejection), outcome
    assert outcome.code is RejectionCode.SCHEMA_INVALID and outcome.run_id == "r"
    assert "is not finite" in outcome.detail and '."a\\nb".x[1] ' in outcome.detail


@pytest.mark.parametrize("depth", [63, 64, 65, 150, 196, 197, 198, 199, 200, 260, 50_000])
@pytest.mark.parametrize("shape", ["[", '{"k":'])
def test_what_commits_reads_back_however_deep(depth: int, shape: str) -> None:
    """A run's snapshot holds a step's result a few levels deeper than the proposal
    did, and a parser with a recursion limit (ours stops near 200) must read every
    snapshot back, or a worker restarting into its timers would crash on it in a loop.
    Payload and metadata nest at most 64 levels: deeper is refused schema_invalid, far
    deeper goes to the DLQ; whatever commits reads back."""
    close = "]" if shape == "[" else "}"
    inner = (shape * depth + "1" + close * depth).encode()
    body = b'{"run_id":"r","proposal_id":"q","event":"step_succeeded","payload":{"step":"s",'
    for value in (
        body + b'"result":' + inner + b"}}",
        CREATE_R + b',"metadata":{"x":' + inner + b"}}",
    ):
        for snapshot in (None, _executing_step("r", "s")):
            headers = signing_key_from(KEYRING, "runtime").headers(SOURCE_TOPIC, b"r", value, NOW)
            limit = 10**6
            outcome = _decide(b"r", value, headers, NOW, lambda _, s=snapshot: s, limit, limit)
            nesting = depth + 1  # the payload or metadata object itself is a level
            if isinstance(outcome, DeadLetterReason):
                assert nesting > 64 and "nested too deeply" in outcome.reason, outcome
                continue
            if isinstance(outcome, Rejection):
                if outcome.code is RejectionCode.SCHEMA_INVALID:
                    assert nesting > 64, outcome
                continue
            assert nesting <= 64, f"nested {nesting} levels and committed"
            assert isinstance(outcome, Commit), outcome
            transition, encoded = _encoded(outcome)
            assert Transition.model_validate_json(transition) == outcome.transition
            assert RunSnapshot.model_validate_json(encoded) == outcome.snapshot


def _executing_step(run_id: str, step: str) -> RunSnapshot:
    """A task_lifecycle run, running, with `step` executing (a result may commit)."""
    runs: dict[str, RunSnapshot] = {}
    signer = signing_key_from(KEYRING, "runtime")
    for n, (event, payload) in enumerate(
        [
            ("create", {"machine": "task_lifecycle"}),
            ("start", {}),
            ("step_started", {"step": step, "idempotency_key": "k"}),
        ]
    ):
        obj = {"run_id": run_id, "proposal_id": f"e{n}", "event": event, "payload": payload}
        value = json.dumps(obj).encode()
        headers = signer.headers(SOURCE_TOPIC, run_id.encode(), value, NOW)
        outcome = _decide(run_id.encode(), value, headers, NOW, runs.get, 10**6, 10**6)
        assert isinstance(outcome, Commit), outcome
        runs[run_id] = outcome.snapshot
    return runs[run_id]


# -- the store --------------------------------------------------------------------------
#: The store's own namespaces and other prefixes a run id might collide with.
PREFIXES = ["s/", "h/", "o/", "t/", "u/", "f/", "i/", "x/", "j/", "m/", "m/format", "ÿ"]
PREFIXES += ["\u00ff\u00ff", "fired", "timer:", "task_lifecycle", "a", "ab", "/", "\ufffd"]


def _fit(chars: list[str], slack: int) -> str:
    """The longest prefix of `chars` within MAX_RUN_ID_BYTES - slack UTF-8 bytes."""
    out, size = [], 0
    for c in chars:
        size += len(c.encode())
        if size > MAX_RUN_ID_BYTES - slack:
            break
        out.append(c)
    return "".join(out) or "z"


valid_run_ids = st.one_of(
    st.text(ID_CHAR, min_size=1, max_size=16),
    st.builds(
        lambda prefix, rest: prefix + rest, st.sampled_from(PREFIXES), st.text(ID_CHAR, max_size=6)
    ),
    st.builds(_fit, st.lists(WIDE_CHAR, min_size=64, max_size=260), st.integers(0, 3)),
    st.sampled_from(["é" * 128, "😀" * 64, "x" * 256, "\U0010ffff" * 64, "ÿ" * 128]),
).filter(is_run_id)
#: Ids a run must never get: the pipeline refuses them before they reach a store.
INVALID_RUN_IDS = ["\x00fired\x00x", "\x00fired\x00s/a", "t/\x00", "a\x85", "é" * 129]
#: Per state, the events the run can take there (so runs reach every state).
STORE_EVENTS = {
    "planned": ["start"],
    "running": [
        *["step_started", "step_succeeded", "heartbeat"] * 2,
        *["pause_for_approval", "block_on_dependency", "transient_error"] * 2,
        "complete",
        "fatal_error",
    ],
    "paused": ["approval_granted", "approval_denied"],
    "blocked": ["dependency_resolved", "fatal_error"],
    "retrying": ["retry", "retry", "fatal_error", "max_retries_exceeded"],
    "done": ["start"],
    "failed": ["complete"],
}
TASK_STATES = ["planned", "running", "paused", "blocked", "retrying", "done", "failed"]
MACHINE = "task_lifecycle"


class Model:
    """What the store must hold: the runs as committed, their histories, fired marks,
    and the records the worker produced to the changelog and transitions topics."""

    def __init__(self) -> None:
        self.snapshots: dict[str, RunSnapshot] = {}
        self.history: dict[str, list[Transition]] = {}
        self.fired: dict[str, Fired] = {}
        self.committed: dict[tuple[str, str], int] = {}  # (run, proposal id) -> revision
        self.refused: dict[tuple[str, str], Rejection] = {}  # the refusals runs remember
        self.forgotten: dict[str, list[str]] = {}  # run -> proposal ids it had (retention)
        # With the index header each record carries, as restore reads them.
        self.changelog: list[ChangelogRecord] = []

    def offsets(self) -> dict[str, int]:
        return {TOPICS.changelog: len(self.changelog)}

    def dues(self, run_id: str) -> list[int]:
        marks = self.fired.get(run_id, NOT_FIRED)
        timers = self.snapshots[run_id].timers
        return sorted(
            {t.due_at_ms for t in timers if not marks.covers(t.revision, t.name, t.due_at_ms)}
        )

    def due_runs(self, now_ms: int) -> list[str]:
        due = [(d, r.encode(), r) for r in self.snapshots for d in self.dues(r) if d <= now_ms]
        return [r for _, _, r in sorted(due)]

    def in_state(self, state: str) -> list[InState]:
        runs = [s for s in self.snapshots.values() if (s.machine, s.state) == (MACHINE, state)]
        runs.sort(key=lambda s: (s.entered_state_at_ms, s.run_id.encode()))
        return [InState(s.entered_state_at_ms, s.run_id, s.machine, s.state) for s in runs]


def check_store(store: PartitionStore, model: Model, now_ms: int, page: int) -> None:
    for run_id, snapshot in model.snapshots.items():
        assert store.committed_snapshot(run_id) == snapshot, run_id
        assert store.history(run_id) == model.history[run_id], run_id
        assert store.fired(run_id) == model.fired.get(run_id, NOT_FIRED), run_id
        for other in (run_id + "x", run_id[:-1]):
            if other and other not in model.snapshots:
                assert store.committed_snapshot(other) is None
                assert store.history(other) == []
    assert sorted(s.run_id for s in store.runs()) == sorted(model.snapshots)
    for run_id, proposal_ids in model.forgotten.items():
        if run_id not in model.snapshots:  # (not created again since)
            assert store.committed_snapshot(run_id) is None and store.history(run_id) == []
            assert store.fired(run_id) == NOT_FIRED and store.refusals(run_id) == []
        for proposal_id in proposal_ids:
            if (run_id, proposal_id) not in model.committed:
                assert store.seen(run_id, proposal_id) is None, (run_id, proposal_id)
    for (run_id, proposal_id), revision in model.committed.items():
        answer = store.seen(run_id, proposal_id)
        assert answer is not None and answer.revision == revision, (run_id, proposal_id)
        assert answer.digest == committed_digest(model.history[run_id][revision])
        assert store.seen(run_id + "x", proposal_id) is None
    for (run_id, proposal_id), rejection in model.refused.items():
        answer = store.seen(run_id, proposal_id)
        assert answer is not None and answer.rejection == rejection, (run_id, proposal_id)
    assert store.due_runs(FAR_FUTURE) == model.due_runs(FAR_FUTURE)
    assert store.due_runs(now_ms) == model.due_runs(now_ms)
    for state in TASK_STATES:
        expected = model.in_state(state)
        assert store.in_state(MACHINE, state, None, 10_000) == expected, state
        paged: list[InState] = []
        for _ in range(len(expected) + 2):  # bounded: a cursor that goes nowhere fails
            after = None if not paged else (paged[-1].entered_ms, paged[-1].run_id)
            found = store.in_state(MACHINE, state, after, page)
            paged += found
            if len(found) < page:
                break
        assert paged == expected, state
        newest = store.in_state(MACHINE, state, None, 10_000, newest=True)
        assert newest == expected[::-1], state
        paged = []
        for _ in range(len(expected) + 2):  # and from the newest back, a page at a time
            after = None if not paged else (paged[-1].entered_ms, paged[-1].run_id)
            found = store.in_state(MACHINE, state, after, page, newest=True)
            paged += found
            if len(found) < page:
                break
        assert paged == newest, state
    counts = Counter((s.machine, s.state) for s in model.snapshots.values())
    assert store.state_counts() == counts


def _changelog(record: OutputRecord) -> ChangelogRecord:
    return (record.key or b"", record.value, index_header(record.headers))


def _propose(
    store: PartitionTransaction,
    model: Model,
    run_id: str,
    obj: dict[str, Any],
    at_ms: int,
) -> Outcome:
    value = json.dumps(obj).encode()
    key_id = SIGNER.get(obj["event"], "runtime")
    key = run_id.encode("utf-8", "surrogatepass")
    headers = signing_key_from(KEYRING, key_id).headers(SOURCE_TOPIC, key, value, at_ms)
    outcome = _decide(key, value, headers, at_ms, store.snapshot, 4_000, 20_000, store.seen)
    source = Source(SOURCE_TOPIC, 0, len(model.changelog), key, value, at_ms)
    answers = store.answer_keys(run_id) if isinstance(outcome, Forget) else ()
    out = outcome_records(TOPICS, outcome, source, RecordLimits(), answers)
    if isinstance(outcome, Rejection) and outcome.content_digest is not None:
        store.stage_refusal(outcome, out[0].value)
        model.refused[(run_id, outcome.proposal_id or "")] = outcome
        model.changelog.append(_changelog(out[1]))
        hypothesis.event("a refusal remembered")
    if isinstance(outcome, Beat):
        assert outcome.snapshot.revision == model.snapshots[run_id].revision
        store.stage_beat(outcome, out[-1].value)
        model.snapshots[run_id] = outcome.snapshot
        model.changelog.append(_changelog(out[-1]))
        hypothesis.event("a heartbeat")
    if isinstance(outcome, Forget):
        store.stage_forget(run_id)
        del model.snapshots[run_id], model.history[run_id]
        model.fired.pop(run_id, None)
        ids = [p for (r, p) in model.committed if r == run_id]
        model.forgotten.setdefault(run_id, []).extend(ids)
        for proposal_id in ids:
            del model.committed[(run_id, proposal_id)]
        model.refused = {k: v for k, v in model.refused.items() if k[0] != run_id}
        model.changelog += [_changelog(r) for r in out if r.topic == TOPICS.changelog]
        hypothesis.event("a run forgotten")
    if isinstance(outcome, Commit):
        model.committed[(run_id, outcome.transition.proposal_id)] = outcome.transition.revision
        assert is_run_id(outcome.snapshot.run_id) and key == outcome.snapshot.run_id.encode()
        transition, snapshot = _encoded(outcome)
        store.stage(outcome, transition, snapshot)
        model.snapshots[run_id] = outcome.snapshot
        model.history.setdefault(run_id, []).append(outcome.transition)
        model.changelog += [_changelog(r) for r in out if r.topic == TOPICS.changelog]
    return outcome


@settings(PROPERTY, max_examples=examples(40))
@given(
    run_ids=st.lists(valid_run_ids, min_size=1, max_size=6, unique=True),
    invalid=st.lists(st.sampled_from(INVALID_RUN_IDS), max_size=2, unique=True),
    data=st.data(),
)
def test_every_run_reads_back_from_the_store_and_from_a_restore(
    tmp_path_factory: pytest.TempPathFactory,
    run_ids: list[str],
    invalid: list[str],
    data: st.DataObject,
) -> None:
    root = tmp_path_factory.mktemp("poison-store")
    opened: list[PartitionStore] = []
    try:
        _store_round_trip(root, run_ids, invalid, data, opened)
    finally:
        # Closed whatever ended the example: a store left open keeps its RocksDB lock in
        # this process, and the next example's directory may have the same name (the
        # numbered directory is free again once removed). Hypothesis ends an example
        # inside a draw when its data runs out, which is not a failure.
        for store in opened:
            store.close()
        shutil.rmtree(root, ignore_errors=True)


def _create(
    store: PartitionTransaction, model: Model, run_id: str, seq: int, data: st.DataObject
) -> Outcome:
    options: dict[str, Any] = {}
    deadlines = {
        name: data.draw(st.integers(1_000, 10_000_000), label=name)
        for name in ("approval_timeout_ms", "heartbeat_timeout_ms", "retry_backoff_ms")
        if data.draw(st.booleans(), label=f"has {name}")
    }
    if deadlines:
        options["deadlines"] = deadlines
    if data.draw(st.booleans(), label="has max_retries"):
        options["max_retries"] = data.draw(st.integers(0, 2), label="max_retries")
    payload = {"machine": MACHINE, "options": options}
    obj = {"run_id": run_id, "proposal_id": f"c{seq}", "event": "create", "payload": payload}
    return _propose(store, model, run_id, obj, NOW)


def _store_round_trip(
    root: Path,
    run_ids: list[str],
    invalid: list[str],
    data: st.DataObject,
    opened: list[PartitionStore],
) -> None:
    model = Model()
    store = PartitionStore(root / "live")
    opened.append(store)
    txn = store.begin()  # one Kafka transaction's changes, until flushed
    at_ms = NOW
    seq = 0
    for run_id in [*invalid, *run_ids]:
        outcome = _create(txn, model, run_id, seq, data)
        seq += 1
        if run_id in invalid:
            assert isinstance(outcome, Rejection), f"run id {run_id!r} was accepted"
            assert outcome.code is RejectionCode.SCHEMA_INVALID
        else:
            assert isinstance(outcome, Commit), outcome
    actions = ["propose"] * 8 + ["fire", "flush", "counts", "resend", "forget"]
    actions += ["pipeline", "finish_commit"]
    # The worker's pipelined commit: a transaction prepared while its commit travels, the
    # next one deciding over it; written once the commit is over ("finish_commit").
    pending: tuple[PreparedWrite, dict[str, int]] | None = None

    def finish_commit() -> None:
        nonlocal pending
        if pending is not None:
            prepared, offsets = pending
            prepared.apply(offsets)
            txn.base_committed()
            pending = None
            hypothesis.event("a pipelined commit")

    for _ in range(data.draw(st.integers(0, 40), label="actions")):
        kind = data.draw(st.sampled_from(actions))
        run_id = data.draw(st.sampled_from(run_ids))
        at_ms += data.draw(st.integers(1, 3))
        if kind in ("pipeline", "finish_commit", "flush", "counts"):
            finish_commit()
        if kind == "pipeline":
            pending = (txn.prepare(), model.offsets())
            txn = store.begin(base=txn)
            continue
        if kind == "finish_commit":
            continue
        if run_id not in model.snapshots:  # forgotten: the run id is free again
            assert isinstance(_create(txn, model, run_id, seq, data), Commit)
            seq += 1
            continue
        snapshot = model.snapshots[run_id]
        if kind == "forget":  # as the retention timer proposes it
            obj = {"run_id": run_id, "proposal_id": f"f{seq}", "event": "forget"}
            seq += 1
            outcome = _propose(
                txn, model, run_id, {**obj, "expected_revision": snapshot.revision}, at_ms
            )
            finished = snapshot.state in ("done", "failed")
            assert isinstance(outcome, Forget) == finished, outcome
        elif kind == "flush":
            txn.flush(model.offsets())
            txn = store.begin()
        elif kind == "counts":  # counted now, kept up to date by later flushes
            txn.flush(model.offsets())
            txn = store.begin()
            store.state_counts()
        elif kind == "resend":  # a committed proposal id again, however long ago
            sent = sorted(p for (r, p) in model.committed if r == run_id)
            if not sent:
                continue
            proposal_id = data.draw(st.sampled_from(sent))
            revision = model.committed[(run_id, proposal_id)]
            t = model.history[run_id][revision]
            same = {"run_id": run_id, "proposal_id": proposal_id, "event": t.event}
            same |= {"payload": t.payload, "metadata": t.metadata, "reason": t.reason}
            again = _propose(txn, model, run_id, same, at_ms)
            assert isinstance(again, Rejection) and again.code is RejectionCode.DUPLICATE
            assert again.original_transition_id == f"{run_id}:{revision}"
            other = {**same, "metadata": {"other": True}}
            reused = _propose(txn, model, run_id, other, at_ms)
            assert isinstance(reused, Rejection)
            assert reused.code is RejectionCode.PROPOSAL_ID_REUSED
        elif kind == "fire":
            if snapshot.timers:
                timer = data.draw(st.sampled_from(snapshot.timers))
                marks = txn.stage_fired(run_id, timer.revision, timer.name, timer.due_at_ms)
                expected = model.fired.get(run_id, NOT_FIRED).with_name(
                    timer.revision, timer.name, timer.due_at_ms
                )
                assert marks == expected
                model.fired[run_id] = marks
                model.changelog.append((FIRED_CHANGELOG_PREFIX + run_id.encode(), marks.encode()))
        else:
            name = data.draw(st.sampled_from(STORE_EVENTS[snapshot.state]))
            step = data.draw(st.sampled_from(STEP_NAMES[:3]))
            payload = {
                "step_started": {"step": step, "idempotency_key": run_id},
                "step_succeeded": {"step": step, "result": {"by": run_id, "at": at_ms}},
            }.get(name, {})
            obj = {"run_id": run_id, "proposal_id": f"p{seq}", "event": name, "payload": payload}
            seq += 1
            _propose(txn, model, run_id, obj, at_ms)
    finish_commit()
    txn.flush(model.offsets())
    page = data.draw(st.integers(1, 3), label="page")
    now_ms = data.draw(st.integers(NOW, NOW + 10_000_000), label="now")
    check_store(store, model, now_ms, page)
    assert store.offset(TOPICS.changelog) == len(model.changelog)
    for state in sorted({s.state for s in model.snapshots.values()}):
        hypothesis.event(f"a run {state}")
    hypothesis.event(f"runs with due timers: {min(3, len(set(model.due_runs(FAR_FUTURE))))}")
    if model.fired:
        hypothesis.event("fired marks")
    store.close()

    # Restore a second store from the records the worker produced, in chunks as the
    # restorer reads them, optionally from a compacted changelog (latest per key).
    changelog = list(model.changelog)
    if not data.draw(st.booleans(), label="with index headers"):  # as older runstates wrote
        changelog = [(record[0], record[1]) for record in changelog]
    if data.draw(st.booleans(), label="compacted"):
        last = {record[0]: i for i, record in enumerate(changelog)}
        changelog = [record for i, record in enumerate(changelog) if last[record[0]] == i]
    cuts = data.draw(st.lists(st.integers(0, len(changelog)), max_size=2), label="cuts")
    bounds = sorted({0, *cuts, len(changelog)})
    chunks = [changelog[a:b] for a, b in pairwise(bounds)]
    restored = PartitionStore(root / "restored")
    opened.append(restored)
    try:
        for i, chunk in enumerate(chunks):
            offsets = model.offsets() if i == len(chunks) - 1 else {}
            restored.restore(chunk, offsets)
        assert getattr(restored, "unreadable", 0) == 0
        check_store(restored, model, now_ms, page)
        assert restored.offset(TOPICS.changelog) == len(model.changelog)
    finally:
        restored.close()
