"""The Faust runtime's decoded snapshots: a lookup answers what decoding the bytes read
would, whatever wrote them and in whatever order."""

from functools import cache

from hypothesis import given, settings
from hypothesis import strategies as st

from processor.records.changelog_keys import INDEX_HEADER
from processor.runtimes.faust.snapshots import DecodedSnapshots
from schemas.messages import RunSnapshot
from tests.examples import examples
from tests.unit.test_faust_batches import TOPICS, messages, run


@cache
def snapshots() -> list[bytes]:
    """Snapshots the runtime wrote for lives of the built-in machines (several per run)."""
    _, sent, _ = run([messages(5, runs=4, proposals=60, resent=0.0)])
    return [  # a snapshot's changelog record names its index entry
        value
        for topic, _, _, value, headers in sent
        if topic == TOPICS.changelog and any(name == INDEX_HEADER for name, _ in headers or ())
    ]


def test_the_snapshots_are_several_per_run() -> None:
    runs = {RunSnapshot.model_validate_json(raw).run_id for raw in snapshots()}
    assert len(runs) == 4 and len(snapshots()) > 3 * len(runs)


@settings(max_examples=examples(200), deadline=None)
@given(
    steps=st.lists(
        st.tuples(st.sampled_from(["read", "commit", "drop"]), st.integers(0, 2), st.integers()),
        max_size=60,
    ),
    capacity=st.integers(1, 8),
)
def test_a_lookup_decodes_what_the_bytes_read_hold(
    steps: list[tuple[str, int, int]], capacity: int
) -> None:
    """Reads of any bytes (a restore wrote them), commits that put a snapshot and drops,
    in any order, past the capacity: every read gives what decoding its bytes gives."""
    decoded = DecodedSnapshots(capacity)
    written = snapshots()
    for action, partition, pick in steps:
        raw = written[pick % len(written)]
        snapshot = RunSnapshot.model_validate_json(raw)
        if action == "read":
            assert decoded.decode(partition, snapshot.run_id, raw) == snapshot
        elif action == "commit":
            decoded.put(partition, raw, snapshot)
        else:
            decoded.drop(partition, snapshot.run_id)
        assert len(decoded) <= capacity


def test_bytes_read_again_are_not_decoded_again() -> None:
    decoded = DecodedSnapshots()
    raw = snapshots()[0]
    first = decoded.decode(0, RunSnapshot.model_validate_json(raw).run_id, raw)
    again = decoded.decode(0, first.run_id, bytes(bytearray(raw)))  # equal, not the same
    assert again is first
    other = decoded.decode(1, first.run_id, raw)  # another partition's store
    assert other is not first and other == first
