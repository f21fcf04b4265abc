"""Recovery figures of the fault harness, from arrival times alone."""

import math

from tests.faults.arrivals import first_answers_after, recovery_seconds


def test_recovery_from_the_fault_and_from_the_brokers_return() -> None:
    times = {0: [1.0, 2.0, 14.0, 15.0], 1: [1.5, 12.5, 13.0], 2: [1.2]}
    # A fault at 3.0: partition 0 waited to 14.0, partition 1 to 12.5, and partition 2
    # never answered again before the feed ended at 20.0.
    assert recovery_seconds([3.0], times, 20.0) == [17.0]
    # The broker was back at 12.0: partition 0 answered 2.0 s later, partition 1 0.5 s.
    assert first_answers_after([12.0], times) == [2.0]
    (none,) = first_answers_after([30.0], times)
    assert math.isnan(none)
