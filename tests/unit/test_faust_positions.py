"""The Faust runtime's own bookkeeping of proposal positions (no broker, no Faust)."""

from processor.runtimes.faust.positions import RESEEK_AFTER, Positions, Verdict


def started_at(offset: int) -> Positions:
    positions = Positions()
    positions.learn(0, offset)
    return positions


def test_in_order_records_are_decided_and_repeats_skipped() -> None:
    positions = started_at(10)
    assert positions.classify(0, 10, generation=1) is Verdict.DECIDE
    positions.decided(0, 10)
    assert positions.classify(0, 11, generation=1) is Verdict.DECIDE
    positions.decided(0, 11)
    assert positions.classify(0, 10, generation=1) is Verdict.SKIP
    assert positions.next[0] == 12


def test_floors_only_ever_raise() -> None:
    positions = started_at(10)
    positions.learn(0, 4)
    assert positions.next[0] == 10
    positions.learn(0, 20)
    assert positions.next[0] == 20
    assert not positions.known(1)


def test_a_gap_asks_for_a_seek_then_waits_for_the_records_read_anew() -> None:
    positions = started_at(0)
    assert positions.classify(0, 350, generation=3) is Verdict.SEEK
    # records still in flight from before the seek are ignored
    assert positions.classify(0, 351, generation=3) is Verdict.WAIT
    assert positions.classify(0, 352, generation=3) is Verdict.WAIT
    # the seek took effect: offset 0 comes again
    assert positions.classify(0, 0, generation=3) is Verdict.DECIDE
    positions.decided(0, 0)
    assert positions.classify(0, 1, generation=3) is Verdict.DECIDE


def test_offsets_without_records_are_accepted_once_read_again() -> None:
    # offset 5 is a transaction marker: after the seek the first record is 6 again
    positions = started_at(5)
    assert positions.classify(0, 6, generation=1) is Verdict.SEEK
    assert positions.classify(0, 6, generation=1) is Verdict.DECIDE
    assert positions.next[0] == 6


def test_a_new_generation_seeks_again_rather_than_trusting_the_old_seek() -> None:
    positions = started_at(5)
    assert positions.classify(0, 9, generation=1) is Verdict.SEEK
    assert positions.classify(0, 9, generation=2) is Verdict.SEEK


def test_a_lost_seek_is_asked_for_again() -> None:
    positions = started_at(0)
    assert positions.classify(0, 100, generation=1) is Verdict.SEEK
    verdicts = [positions.classify(0, 101 + i, generation=1) for i in range(RESEEK_AFTER)]
    assert verdicts[:-1] == [Verdict.WAIT] * (RESEEK_AFTER - 1)
    assert verdicts[-1] is Verdict.SEEK


def test_a_batch_takes_records_in_order_before_any_is_delivered() -> None:
    positions = started_at(10)
    for offset in (10, 11, 12):
        assert positions.classify(0, offset, generation=1) is Verdict.DECIDE
        positions.take(0, offset)
    # taken again (Faust read it twice) is not decided twice in one batch
    assert positions.classify(0, 11, generation=1) is Verdict.SKIP
    # a record past the batch's end is a gap, as ever
    assert positions.classify(0, 14, generation=1) is Verdict.SEEK
    assert positions.next[0] == 10  # nothing delivered yet
    positions.decided(0, 12)
    positions.release()
    assert positions.classify(0, 13, generation=1) is Verdict.DECIDE


def test_a_batch_given_up_is_decided_again() -> None:
    positions = started_at(10)
    for offset in (10, 11):
        assert positions.classify(0, offset, generation=1) is Verdict.DECIDE
        positions.take(0, offset)
    positions.release()  # its delivery failed: nothing was delivered
    assert positions.classify(0, 10, generation=1) is Verdict.DECIDE


def test_the_offsets_committed_never_fall_below_the_partitions_start() -> None:
    """A partition that moved away and came back: another worker raised its committed
    offset meanwhile, and the agent's own `next` is older. What the agent commits is
    never below where the partition started at its latest assignment."""
    from types import SimpleNamespace

    from faust.types import TP

    from processor.runtimes.faust.app import FaustWorker

    came_back, stayed = TP("t.proposals", 0), TP("t.proposals", 1)
    positions = Positions()
    positions.learn(0, 10)  # answered before it moved away
    positions.learn(1, 30)
    consumer = SimpleNamespace(floors={came_back: 25, stayed: 20})
    worker = SimpleNamespace(
        positions=positions,
        topics=SimpleNamespace(proposals="t.proposals"),
        consumer=lambda: consumer,
        app=SimpleNamespace(
            assignor=SimpleNamespace(
                assigned_actives=lambda: {came_back, stayed, TP("t.runs-changelog", 0)}
            )
        ),
    )
    assert FaustWorker.answered_offsets(worker) == {came_back: 25, stayed: 30}  # type: ignore[arg-type]
