"""The fault harness, short: every scenario on a real broker, every invariant exact.
The full version is `make faults` (python -m tests.faults)."""

from pathlib import Path

import pytest

from tests.faults.check import Row
from tests.faults.scenarios import SCENARIOS, SHORT, broker_restart


def assert_clean(row: Row) -> None:
    assert row.lost == 0 and row.duplicated == 0 and row.mismatched == 0, row.describe()
    assert row.crashes == 0, row.describe()
    assert row.lag_zero, row.describe()


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_scenario_loses_repeats_and_mismatches_nothing(
    name: str, kafka_bootstrap: str, tmp_path: Path
) -> None:
    row = SCENARIOS[name](kafka_bootstrap, tmp_path, "native", SHORT)
    assert_clean(row)
    assert row.faults == {"kills": SHORT.kills, "scaling": 2, "zombie": 1, "hostile": 0}[name]


def test_faust_runtime_under_kills_keeps_its_guarantee(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """At least once: repeats allowed (each the same outcome), nothing lost or different."""
    row = SCENARIOS["kills"](kafka_bootstrap, tmp_path, "faust", SHORT)
    assert_clean(row)


def test_broker_stop_and_start_mid_stream(launcher: None, tmp_path: Path) -> None:
    row = broker_restart(tmp_path, "native", SHORT)
    assert_clean(row)
    assert row.faults == 1
