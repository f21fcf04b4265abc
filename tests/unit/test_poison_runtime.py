"""Poison in the worker: a batch the broker keeps refusing is isolated, the record that
causes it is found and set aside, and cluster trouble never counts against a record;
deadline proposal ids fit whatever the run id."""

from confluent_kafka import KafkaError

from processor.runtimes.native.poison import Quarantine, is_record_error


def test_only_record_errors_count() -> None:
    assert is_record_error(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE))
    assert is_record_error(KafkaError(KafkaError.INVALID_RECORD))
    for cluster_trouble in (
        KafkaError._TRANSPORT,
        KafkaError._TIMED_OUT,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError._STATE,
    ):
        assert not is_record_error(KafkaError(cluster_trouble))
    assert not is_record_error(None)


def test_a_refused_batch_is_isolated_then_its_culprit_poisoned() -> None:
    q = Quarantine(attempts=2)
    batch = {0: (10, 20), 1: (5, 8)}
    q.refused(batch, "MSG_SIZE_TOO_LARGE")
    assert not q.active and not q.isolating(0, 10)  # once may be bad luck
    q.refused({0: (10, 25), 1: (5, 9)}, "MSG_SIZE_TOO_LARGE")  # same start, reached further
    assert q.active
    assert q.isolating(0, 10) and q.isolating(0, 24) and not q.isolating(0, 25)
    assert q.isolating(1, 8) and not q.isolating(1, 9) and not q.isolating(2, 0)

    # one record per transaction: the innocent commit, the culprit is refused twice
    q.committed(1, 9)
    assert not q.isolating(1, 8)
    for offset in range(10, 13):
        q.committed(0, offset + 1)
    q.refused({0: (13, 14)}, "MSG_SIZE_TOO_LARGE")
    assert q.poisoned(0, 13) is None
    q.refused({0: (13, 14)}, "MSG_SIZE_TOO_LARGE")
    assert q.poisoned(0, 13) == "MSG_SIZE_TOO_LARGE"
    # set aside (its DLQ record committed), the rest of the range is isolated still
    q.committed(0, 14)
    assert q.poisoned(0, 13) is None and q.isolating(0, 14)
    q.committed(0, 25)
    assert not q.active


def test_different_batches_do_not_add_up() -> None:
    q = Quarantine(attempts=2)
    q.refused({0: (10, 20)}, "x")
    q.refused({0: (11, 20)}, "x")  # another start: another batch
    assert not q.active
    q.committed(0, 12)  # what is behind is forgotten
    q.refused({0: (10, 20)}, "x")
    assert not q.active


def test_deadline_proposal_ids_fit_and_stay_unique() -> None:
    from processor.engine.timers import timer_proposal_id
    from schemas.identifiers import is_proposal_id
    from schemas.messages import Timer

    timer = Timer(kind="deadline", name="heartbeat", due_at_ms=1, event="x", revision=12)
    assert timer_proposal_id("r-1", timer.revision, timer.name) == "timer:r-1:12:heartbeat"
    long_ids = ["é" * 128, "é" * 127 + "e", "a" * 256]  # 256 bytes, each
    made = {timer_proposal_id(run_id, timer.revision, timer.name) for run_id in long_ids}
    assert len(made) == 3 and all(is_proposal_id(i) for i in made)
