"""The process's snapshot cache keeps decoded snapshots small: cached snapshots of the
same fields share one set of field names, and nothing a reader can see changes."""

import json
import random
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from processor.runtimes.native.snapshot_cache import SnapshotCache
from schemas.messages import RunSnapshot
from tests.examples import examples
from tests.unit.driver import APPROVER, MODEL, RUNTIME, TOOL, Driver

pytestmark = pytest.mark.unit

_PRINCIPALS = [RUNTIME, TOOL, MODEL, APPROVER]


def _snapshots(seed: int, runs: int) -> list[RunSnapshot]:
    """Runs of the built-in machines driven by random legal and illegal events: the
    snapshots their last commits left, as a worker's loop and its reads hold them."""
    rng = random.Random(seed)
    found = []
    for r in range(runs):
        driver = Driver(run_id=f"run-{seed}-{r}")
        machine = rng.choice(sorted(driver.machines))
        driver.propose("create", payload={"machine": machine})
        spec = driver.machines[machine]
        events = sorted(spec.events)
        for _ in range(rng.randint(0, 8)):
            event = rng.choice(events)
            driver.propose(
                event,
                rng.choice(_PRINCIPALS),
                reason=rng.choice([None, "because"]),
                payload=rng.choice([{}, {"step": "charge"}, {"fact": "build=green"}]),
            )
        if driver.snapshot is not None:
            found.append(driver.snapshot)
    return found


_SNAPSHOTS = [s for s in _snapshots(17, 12)][:8]


@settings(max_examples=examples(25), deadline=None)
@given(seed=st.integers(0, 2**32 - 1), read_back=st.booleans())
def test_a_cached_snapshot_reads_as_it_was_put(seed: int, read_back: bool) -> None:
    cache = SnapshotCache(1_000)
    owner = cache.owner()
    originals = _snapshots(seed, 12)
    put = [
        RunSnapshot.model_validate_json(s.model_dump_json()) if read_back else s for s in originals
    ]
    expected = [(s.model_dump(), set(s.model_fields_set)) for s in put]
    for i, snapshot in enumerate(put):
        if i % 2:
            cache.put(owner, [snapshot])
        else:
            cache.put_read(owner, snapshot, cache.generation(owner))
    for snapshot, (dump, fields) in zip(put, expected, strict=True):
        cached = cache.get(owner, snapshot.run_id)
        assert cached is not None
        assert cached.model_dump() == dump
        assert cached.model_fields_set == fields
        assert cached.model_dump_json(exclude_unset=True) == snapshot.model_dump_json(
            exclude_unset=True
        )
    # All of them, with every field, hold one set of the names...
    cached_all = [cache.get(owner, s.run_id) for s in put]
    assert len({id(c.__pydantic_fields_set__) for c in cached_all if c is not None}) == 1
    # ...and a copy changed from one leaves every other's as it was.
    first = cache.get(owner, put[0].run_id)
    assert first is not None
    changed = first.model_copy(update={"last_reason": "changed"})
    assert "last_reason" in changed.model_fields_set
    for snapshot, (_, fields) in zip(put, expected, strict=True):
        cached = cache.get(owner, snapshot.run_id)
        assert cached is not None and cached.model_fields_set == fields


def test_a_snapshot_given_fewer_fields_keeps_its_own_set() -> None:
    """One decoded from JSON that left out fields with defaults (an older writer's):
    what it was given still reads as given."""
    cache = SnapshotCache(10)
    owner = cache.owner()
    full = _snapshots(5, 1)[0]
    data = full.model_dump(mode="json")
    for name in ("facts", "steps", "timers", "continues"):
        del data[name]
    partial = RunSnapshot.model_validate_json(json.dumps(data))
    cache.put_read(owner, partial, cache.generation(owner))
    cached = cache.get(owner, full.run_id)
    assert cached is not None
    assert cached.model_fields_set == set(RunSnapshot.model_fields) - {
        "facts",
        "steps",
        "timers",
        "continues",
    }
    assert json.loads(cached.model_dump_json(exclude_unset=True)) == data


def test_a_frozen_snapshot_refuses_an_assignment_before_it_touches_the_shared_set() -> None:
    cache = SnapshotCache(10)
    owner = cache.owner()
    a, b = (RunSnapshot.model_validate_json(s.model_dump_json()) for s in _snapshots(3, 2))
    cache.put(owner, [a, b])
    fields = set(a.model_fields_set)
    with pytest.raises(ValueError, match="frozen"):
        a.state = "somewhere"
    assert b.model_fields_set == fields == a.model_fields_set


def test_a_cached_snapshot_read_back_takes_under_two_thirds_of_its_own_memory() -> None:
    """What the sharing is for: measured against the same snapshots decoded and held
    without the cache, in the same process."""
    raws = [s.model_dump_json() for s in _snapshots(11, 200)]

    def held(cached: bool) -> float:
        cache = SnapshotCache(10_000)
        owner = cache.owner()
        kept: list[RunSnapshot] = []
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for raw in raws:
                snapshot = RunSnapshot.model_validate_json(raw)
                if cached:
                    cache.put_read(owner, snapshot, cache.generation(owner))
                else:
                    kept.append(snapshot)
            return (tracemalloc.get_traced_memory()[0] - before) / len(raws)
        finally:
            tracemalloc.stop()

    alone, cached = held(False), held(True)
    assert cached < alone * 2 / 3, (alone, cached)


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@settings(max_examples=examples(400), deadline=None)
@given(
    capacity=st.integers(1, 6),
    ops=st.lists(
        st.tuples(st.sampled_from(["put", "put_read", "get", "wait", "drop"]), st.integers(0, 7)),
        max_size=60,
    ),
)
def test_a_run_is_cached_while_among_the_latest_used_and_used_within_the_idle_time(
    capacity: int, ops: list[tuple[str, int]]
) -> None:
    """Against a model: a run is found iff it is among the `capacity` most recently used
    and was used within `idle_s`; anything else reads as a miss, never a wrong snapshot."""
    clock = _Clock()
    cache = SnapshotCache(capacity, idle_s=10.0, clock=clock)
    owner = cache.owner()
    snapshots = _SNAPSHOTS
    model: dict[str, float] = {}  # run id -> last use, least recently used first

    def keep(run_id: str) -> None:
        model.pop(run_id, None)
        model[run_id] = clock.now  # used last: at the end
        # The bound, then the idle time, from the least recently used end (the first).
        while model and (
            len(model) > capacity or clock.now - next(iter(model.values())) > cache.idle_s
        ):
            del model[next(iter(model))]

    for op, n in ops:
        snapshot = snapshots[n % len(snapshots)]
        run_id = snapshot.run_id
        if op == "wait":
            clock.now += n * 2.5
        elif op == "put":
            cache.put(owner, [snapshot])
            keep(run_id)
        elif op == "put_read":
            cache.put_read(owner, snapshot, cache.generation(owner))
            fresh = run_id in model and clock.now - model[run_id] <= cache.idle_s
            if run_id not in model or not fresh:
                model.pop(run_id, None)
                keep(run_id)
        elif op == "drop":
            cache.drop(owner, [run_id])
            model.pop(run_id, None)
        else:
            found = cache.get(owner, run_id)
            if run_id in model and clock.now - model[run_id] <= cache.idle_s:
                assert found is snapshot.compact() or found == snapshot
                model.pop(run_id)
                model[run_id] = clock.now
            else:
                assert found is None
                model.pop(run_id, None)
        assert len(cache) <= capacity


def test_under_a_steady_stream_of_new_runs_the_cache_levels_off_at_the_runs_used_lately() -> None:
    """Runs that are never used again (parked for an approval that does not come) leave
    after `idle_s`: the cache holds about rate x idle_s runs, far below its bound."""
    clock = _Clock()
    cache = SnapshotCache(100_000, idle_s=60.0, clock=clock)
    owner = cache.owner()
    template = _SNAPSHOTS[0]
    sizes = []
    for second in range(600):
        clock.now = float(second)
        cache.put(
            owner,
            [template.model_copy(update={"run_id": f"run-{second}-{i}"}) for i in range(7)],
        )
        sizes.append(len(cache))
    assert max(sizes[120:]) <= 7 * 61
    assert min(sizes[120:]) >= 7 * 60
