"""A commit fits one batch of each topic it writes to, or is refused `state_too_large`;
and a producer batch never holds more than a topic takes.

The sizes are checked against Kafka's own record-batch v2 encoding (written out here,
independently of `outputs.record_bytes`): what the broker compares with a topic's
`max.message.bytes` is the whole batch, its 61-byte header and every record's bytes.
"""

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from processor.engine import Commit
from processor.kafka.topics import TopicNames
from processor.records.limits import RecordLimits
from processor.records.outputs import (
    _COMMIT_FRAMING,
    CommitLimits,
    OutputRecord,
    commit_records,
    record_bytes,
)
from processor.records.pipeline import fit_commit
from schemas.codes import RejectionCode
from schemas.identifiers import MAX_RUN_ID_BYTES
from schemas.messages import Principal, Rejection, RunSnapshot, Timer, Transition
from tests.examples import examples

pytestmark = pytest.mark.unit

TOPICS = TopicNames.with_prefix()
#: The record batch v2 header: base offset, length, leader epoch, magic, CRC, attributes,
#: last offset delta, first and max timestamps, producer id and epoch, base sequence,
#: record count.
BATCH_HEADER = 8 + 4 + 4 + 1 + 4 + 2 + 4 + 8 + 8 + 8 + 2 + 4 + 4
PRINCIPAL = Principal(source="runtime", authority="runtime")
NOW = 1_700_000_000_000


def _varint(value: int) -> int:
    """Bytes of a zigzag varint (Kafka's record fields)."""
    raw = (value << 1) ^ (value >> 63)
    size = 1
    while raw >= 0x80:
        raw >>= 7
        size += 1
    return size


def _wire(record: OutputRecord, timestamp_delta: int, offset_delta: int) -> int:
    """The record's bytes in a v2 batch, exactly as Kafka encodes it."""
    key, value = record.key, record.value
    body = 1 + _varint(timestamp_delta) + _varint(offset_delta)
    body += _varint(-1) if key is None else _varint(len(key)) + len(key)
    body += _varint(-1) if value is None else _varint(len(value)) + len(value)
    headers = record.headers or []
    body += _varint(len(headers))
    for name, header in headers:
        raw = header.encode() if isinstance(header, str) else header
        body += _varint(len(name.encode())) + len(name.encode())
        body += _varint(-1) if raw is None else _varint(len(raw)) + len(raw)
    return _varint(body) + body


def _batch(records: list[OutputRecord]) -> int:
    """A batch of `records` as the broker measures it, with deltas as large as a
    transaction's could be (seconds apart, thousands of records in)."""
    return BATCH_HEADER + sum(_wire(r, 10**9, 10**6) for r in records)


def _commit(run_id: str, revision: int, payload_chars: int, facts: int, timers: int) -> Commit:
    snapshot = RunSnapshot(
        run_id=run_id,
        machine="task_lifecycle",
        state="running",
        revision=revision,
        facts=[f"fact-{i}-" + "f" * 40 for i in range(facts)],
        timers=[
            Timer(kind="alert", name=f"t{i}", due_at_ms=NOW + i, revision=revision)
            for i in range(timers)
        ],
        created_at_ms=NOW,
        updated_at_ms=NOW,
        entered_state_at_ms=NOW,
    )
    transition = Transition(
        transition_id=f"{run_id}:{revision}",
        run_id=run_id,
        machine="task_lifecycle",
        revision=revision,
        from_state="running",
        to_state="running",
        event="step_succeeded",
        proposal_id=f"p-{revision}",
        principal=PRINCIPAL,
        payload={"blob": "x" * payload_chars},
        at_ms=NOW,
    )
    return Commit(snapshot, transition)


def _encoded(commit: Commit) -> tuple[bytes, bytes]:
    return commit.transition.model_dump_json().encode(), commit.snapshot.model_dump_json().encode()


record_fields = st.tuples(
    st.one_of(st.none(), st.binary(max_size=300)),
    st.one_of(st.none(), st.binary(max_size=3_000)),
    st.lists(
        st.tuples(st.text(max_size=40), st.one_of(st.none(), st.binary(max_size=200))),
        max_size=3,
    ),
    st.integers(min_value=0, max_value=10**12),  # timestamp delta (ms)
    st.integers(min_value=0, max_value=10**6),  # offset delta
)


@given(record_fields)
def test_record_bytes_bounds_kafkas_encoding(fields: tuple) -> None:  # type: ignore[type-arg]
    key, value, headers, timestamp_delta, offset_delta = fields
    record = OutputRecord(TOPICS.changelog, key, value, headers)
    assert _wire(record, timestamp_delta, offset_delta) <= record_bytes(key, value, headers)


@settings(max_examples=examples(150), deadline=None)
@given(
    topic_limit=st.integers(min_value=6_000, max_value=60_000),
    share=st.floats(min_value=0.05, max_value=0.95),
    slack=st.integers(min_value=-600, max_value=600),
    facts=st.integers(min_value=0, max_value=20),
    timers=st.integers(min_value=0, max_value=6),
    run_id=st.text(
        st.characters(codec="utf-8", exclude_categories=("Cc", "Cs")), min_size=1, max_size=60
    ),
    revision=st.integers(min_value=1, max_value=2**40),
)
def test_a_commit_is_refused_exactly_when_one_batch_of_a_topic_cannot_hold_its_records(
    topic_limit: int,
    share: float,
    slack: int,
    facts: int,
    timers: int,
    run_id: str,
    revision: int,
) -> None:
    """Sizes right around the changelog's limit, split between the history record (the
    transition) and the snapshot in every proportion: accepted iff they fit together."""
    # The history record carries the transition, the snapshot record the snapshot: aim
    # their sum at the changelog's batch, give or take `slack`.
    base = _encoded(_commit(run_id, revision, 0, facts, timers))
    room = topic_limit // 2 + slack - sum(len(part) for part in base) // 2
    payload = max(0, int(room * 2 * share))
    commit = _commit(run_id, revision, payload, facts, timers)
    limits = RecordLimits.learn(
        {TOPICS.changelog: topic_limit, TOPICS.transitions: 10 * topic_limit}, 10**7
    )
    current = commit.snapshot.model_copy(update={"revision": revision - 1})
    outcome = fit_commit(commit, current, 10**7, CommitLimits(TOPICS, limits))
    transition, snapshot = _encoded(commit)
    records = commit_records(TOPICS, commit, transition, snapshot)
    changelog = [r for r in records if r.topic == TOPICS.changelog]
    bound = sum(record_bytes(r.key, r.value, r.headers) for r in changelog)
    if isinstance(outcome, Commit):
        assert outcome.encoded == (transition, snapshot)
        # what the broker checks: the one batch holding both fits the topic
        assert _batch(changelog) <= topic_limit
        assert bound <= limits.batch(TOPICS.changelog)
    else:
        assert isinstance(outcome, Rejection)
        assert outcome.code is RejectionCode.STATE_TOO_LARGE
        assert bound > limits.batch(TOPICS.changelog)
        assert TOPICS.changelog in outcome.detail, outcome.detail
        assert str(limits.batch(TOPICS.changelog)) in outcome.detail, outcome.detail
        assert f"stays at revision {revision - 1}" in outcome.detail
        assert (outcome.run_id, outcome.proposal_id) == (run_id, commit.transition.proposal_id)
    # the framing kept is small: a commit within 1 % of the limit is never refused
    if _batch(changelog) <= topic_limit - 300 - topic_limit // 100:
        assert isinstance(outcome, Commit), outcome


#: Names as long as a name may be, of the characters whose escapes grow the most.
_ANY_TEXT = st.text(
    st.one_of(
        st.sampled_from(["\U0001f600", "\u00e9", "\u4e2d", "\x01", '"', "a"]),
        st.characters(codec="utf-8", exclude_categories=("Cs",)),
    ),
    max_size=128,
)


@settings(max_examples=examples(200), deadline=None)
@given(
    run_id=st.text(
        st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=64
    ),
    proposal_id=st.text(
        st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=32
    ),
    names=st.tuples(_ANY_TEXT, _ANY_TEXT, st.lists(_ANY_TEXT, max_size=20)),
    revision=st.integers(min_value=0, max_value=2**63 - 1),
    entered=st.integers(min_value=0, max_value=2**63 - 1),
)
@example(  # the index at its largest against the snapshot: astral names, escaped
    run_id="r" * MAX_RUN_ID_BYTES,
    proposal_id="p" * 128,
    names=("m", "\U0001f600" * 128, ["\U0001f600" * 128] * 20),
    revision=2**63 - 1,
    entered=2**63 - 1,
)
def test_the_quick_fit_bounds_a_commits_records_whatever_they_hold(
    run_id: str, proposal_id: str, names: tuple[str, str, list[str]], revision: int, entered: int
) -> None:
    """`overflow` settles a commit by an upper bound before building its records: that
    bound holds for any run id, proposal id and names up to their limits (astral
    characters, controls, quotes), so a commit it lets through always fits."""
    machine, state, timer_names = names
    if len(run_id.encode()) > MAX_RUN_ID_BYTES or len(proposal_id.encode()) > 128:
        return
    base = _commit("r", 1, 10, 2, 0)
    snapshot = base.snapshot.model_construct(
        **{
            **base.snapshot.__dict__,
            "run_id": run_id,
            "machine": machine,
            "state": state,
            "revision": revision,
            "entered_state_at_ms": entered,
            "timers": [
                Timer.model_construct(kind="alert", name=name, due_at_ms=entered, revision=revision)
                for name in timer_names
            ],
        }
    )
    transition = base.transition.model_construct(
        **{
            **base.transition.__dict__,
            "run_id": run_id,
            "proposal_id": proposal_id,
            "revision": revision,
        }
    )
    commit = Commit(snapshot, transition)
    t, s = _encoded(commit)
    exact = sum(
        record_bytes(r.key, r.value, r.headers) for r in commit_records(TOPICS, commit, t, s)
    )
    assert exact <= 2 * len(t) + 4 * len(s) + _COMMIT_FRAMING


@settings(max_examples=examples(100), deadline=None)
@given(
    payload=st.integers(min_value=0, max_value=30_000),
    max_state=st.integers(min_value=4_096, max_value=30_000),
)
def test_the_max_state_rule_names_the_record_and_its_limit(payload: int, max_state: int) -> None:
    commit = _commit("r", 3, payload, 0, 0)
    outcome = fit_commit(commit, None, max_state, None)
    transition, snapshot = _encoded(commit)
    if max(len(transition), len(snapshot)) <= max_state:
        assert isinstance(outcome, Commit)
    else:
        assert isinstance(outcome, Rejection) and outcome.code is RejectionCode.STATE_TOO_LARGE
        assert "transition" in outcome.detail and str(max_state) in outcome.detail
        assert "nothing changes" in outcome.detail


@settings(max_examples=examples(200), deadline=None)
@given(
    topic_limits=st.dictionaries(
        st.sampled_from(
            [TOPICS.transitions, TOPICS.changelog, TOPICS.rejections, TOPICS.dlq, TOPICS.alerts]
        ),
        st.integers(min_value=3_000, max_value=2_000_000),
        min_size=1,
    ),
    producer_max=st.integers(min_value=3_000, max_value=2_000_000),
    configured=st.integers(min_value=1, max_value=4_000_000),
    data=st.data(),
)
def test_no_producer_batch_exceeds_a_topic_many_small_records_or_one_big(
    topic_limits: dict[str, int],
    producer_max: int,
    configured: int,
    data: st.DataObject,
) -> None:
    """librdkafka packs one partition's records into a batch while it stays within
    min(message.max.bytes, batch.size), a first record always (alone when it is larger):
    with `batch_size`, every batch fits every topic, whatever the records' sizes, as long
    as each record fits its topic (`of`)."""
    limits = RecordLimits.learn(topic_limits, producer_max)
    batch_size = limits.batch_size(configured)
    assert batch_size <= configured
    topic = data.draw(st.sampled_from(sorted(topic_limits)), label="topic")
    largest = limits.of(topic)
    assert largest > 0
    sizes = data.draw(
        st.one_of(
            st.lists(st.integers(min_value=0, max_value=min(largest, 400)), max_size=200),
            st.lists(st.integers(min_value=largest // 2, max_value=largest), max_size=6),
            st.lists(st.integers(min_value=0, max_value=largest), max_size=30),
        ),
        label="value sizes",
    )
    records = [OutputRecord(topic, None, b"v" * size, None) for size in sizes]
    batches: list[list[OutputRecord]] = []
    length = 0
    for record in records:
        size = _wire(record, 10**9, 10**6)
        # the client's count starts past the batch header (it counts the request's too)
        if not batches or length + size > min(producer_max, batch_size):
            batches.append([])
            length = BATCH_HEADER
        batches[-1].append(record)
        length += size
    for batch in batches:
        assert _batch(batch) <= min(topic_limits[topic], producer_max), [
            len(r.value or b"") for r in batch
        ]
