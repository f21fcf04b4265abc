"""Only the broker's time decides: a proposal whose timestamp its producer set
(CreateTime) or that has none goes to the DLQ with what to fix, whatever the record is,
before anything of it is read; a LogAppendTime record is decided as it always is."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from processor.history.audit import Record, verify_partition
from processor.machines import builtin_machines
from processor.records.intake import TimestampType, untrusted_time
from processor.records.pipeline import Admitted, DeadLetterReason, admit_record, decide_record
from processor.trust.keygen import generate_keyring
from processor.trust.keyring import signing_keys
from tests.examples import examples

pytestmark = pytest.mark.unit

TOPIC = "runstate.proposals"
KEYRING = generate_keyring()
SIGNERS = signing_keys(KEYRING)
MACHINES = builtin_machines()
NOW = 1_800_000_000_000


def _create(
    run_id: str, signed_at_ms: int
) -> tuple[bytes, bytes, list[tuple[str, str | bytes | None]]]:
    value = json.dumps(
        {
            "run_id": run_id,
            "proposal_id": f"c-{run_id}",
            "event": "create",
            "payload": {"machine": "run_state"},
        }
    ).encode()
    key = run_id.encode()
    headers = list(SIGNERS["runtime"].headers(TOPIC, key, value, signed_at_ms))
    return key, value, headers


def test_each_clients_numbering_maps_to_who_set_the_time() -> None:
    # confluent-kafka: TIMESTAMP_NOT_AVAILABLE 0, CREATE_TIME 1, LOG_APPEND_TIME 2
    from confluent_kafka import (
        TIMESTAMP_CREATE_TIME,
        TIMESTAMP_LOG_APPEND_TIME,
        TIMESTAMP_NOT_AVAILABLE,
    )

    assert TimestampType.of_librdkafka(TIMESTAMP_LOG_APPEND_TIME) is TimestampType.LOG_APPEND_TIME
    assert TimestampType.of_librdkafka(TIMESTAMP_CREATE_TIME) is TimestampType.CREATE_TIME
    assert TimestampType.of_librdkafka(TIMESTAMP_NOT_AVAILABLE) is TimestampType.NOT_AVAILABLE
    # aiokafka (Faust): Kafka's numbering
    from aiokafka.record.default_records import DefaultRecordBase

    assert (
        TimestampType.of_kafka(DefaultRecordBase.LOG_APPEND_TIME) is TimestampType.LOG_APPEND_TIME
    )
    assert TimestampType.of_kafka(DefaultRecordBase.CREATE_TIME) is TimestampType.CREATE_TIME
    for absent in (None, -1):
        assert TimestampType.of_kafka(absent) is TimestampType.NOT_AVAILABLE


@settings(max_examples=examples(300), deadline=None)
@given(code=st.one_of(st.none(), st.integers(-(2**31), 2**31)))
def test_an_unknown_code_is_never_taken_for_the_brokers_time(code: int | None) -> None:
    """Fail closed: only the one code each client uses for LogAppendTime is trusted."""
    assert (TimestampType.of_librdkafka(code) is TimestampType.LOG_APPEND_TIME) == (code == 2)
    assert (TimestampType.of_kafka(code) is TimestampType.LOG_APPEND_TIME) == (code == 1)


@settings(max_examples=examples(300), deadline=None)
@given(
    timestamp_type=st.sampled_from([TimestampType.CREATE_TIME, TimestampType.NOT_AVAILABLE]),
    age_ms=st.integers(-(10**12), 10**12),  # a replayed signature, or one from the future
    appended_ms=st.integers(0, 2**45),
    record=st.sampled_from(["signed", "garbage", "tombstone", "unsigned"]),
    run_id=st.from_regex(r"[a-z][a-z0-9-]{0,20}", fullmatch=True),
)
def test_a_record_not_stamped_by_the_broker_is_dead_lettered_with_what_to_fix(
    timestamp_type: TimestampType, age_ms: int, appended_ms: int, record: str, run_id: str
) -> None:
    key, value, headers = _create(run_id, appended_ms - age_ms)
    value_or_none: bytes | None = {
        "signed": value,
        "garbage": b"\xff not json",
        "tombstone": None,
        "unsigned": value,
    }[record]
    if record == "unsigned":
        headers = []
    outcome = decide_record(
        key,
        value_or_none,
        headers,
        appended_ms,
        topic=TOPIC,
        keyring=KEYRING,
        machines=MACHINES,
        lookup=lambda _: None,
        seen=lambda _run, _proposal: None,
        placement=None,
        timestamp_type=timestamp_type,
    )
    assert isinstance(outcome, DeadLetterReason), outcome
    assert outcome.reason == untrusted_time(timestamp_type, TOPIC)
    for said in (timestamp_type.value, "message.timestamp.type=LogAppendTime", TOPIC):
        assert said in outcome.reason
    admitted = admit_record(
        key,
        value_or_none,
        headers,
        appended_ms,
        topic=TOPIC,
        keyring=KEYRING,
        placement=None,
        timestamp_type=timestamp_type,
    )
    assert admitted == outcome


@settings(max_examples=examples(100), deadline=None)
@given(
    age_ms=st.integers(-10_000, 10**9),
    run_id=st.from_regex(r"[a-z][a-z0-9-]{0,20}", fullmatch=True),
)
def test_the_brokers_time_is_decided_as_without_a_type(age_ms: int, run_id: str) -> None:
    """LogAppendTime is what a call without `timestamp_type` means: the same outcome,
    fresh or stale."""
    key, value, headers = _create(run_id, NOW - age_ms)

    def decide(timestamp_type: TimestampType | None = None) -> object:
        if timestamp_type is None:  # as callers that do not say
            return decide_record(
                key,
                value,
                headers,
                NOW,
                topic=TOPIC,
                keyring=KEYRING,
                machines=MACHINES,
                lookup=lambda _: None,
                seen=lambda _run, _proposal: None,
                placement=None,
            )
        return decide_record(
            key,
            value,
            headers,
            NOW,
            topic=TOPIC,
            keyring=KEYRING,
            machines=MACHINES,
            lookup=lambda _: None,
            seen=lambda _run, _proposal: None,
            placement=None,
            timestamp_type=timestamp_type,
        )

    stated = decide(timestamp_type=TimestampType.LOG_APPEND_TIME)
    assert not isinstance(stated, DeadLetterReason)
    assert type(stated) is type(decide())
    admitted = admit_record(key, value, headers, NOW, topic=TOPIC, keyring=KEYRING, placement=None)
    fresh = age_ms <= KEYRING.signature_max_age_ms and -age_ms <= KEYRING.clock_skew_ms
    assert isinstance(admitted, Admitted) == fresh


def test_a_replay_decides_a_create_time_record_as_the_worker_did() -> None:
    """verify reproduces the DLQ outcome: the proposal made no transition."""
    key, value, headers = _create("r1", NOW - 1)
    records = [
        Record(0, 0, key, value, headers, NOW, TimestampType.CREATE_TIME),
    ]
    assert verify_partition(0, records, [], topic=TOPIC, machines=MACHINES, keyring=KEYRING) == []
    # and the same record at broker time: a transition the (empty) topic lacks
    found = verify_partition(
        0,
        [Record(0, 0, key, value, headers, NOW)],
        [],
        topic=TOPIC,
        machines=MACHINES,
        keyring=KEYRING,
    )
    assert found, "a LogAppendTime create must be expected as a transition"
