"""The fault harness's report reads whole where it is read: a log, a pipe, a terminal of
80 columns. Every figure of every row is in it, on lines no wider than that."""

from hypothesis import given
from hypothesis import strategies as st

from tests.faults.__main__ import WIDTH, bounds, report, wrapped
from tests.faults.brokers import CLUSTER_NAMES
from tests.faults.check import Row
from tests.faults.scenarios import SCENARIOS

#: Up to 100 times the full harness's feed (100,000 proposals) in every count at once.
counts = st.integers(min_value=0, max_value=10**7)
rows = st.builds(
    Row,
    scenario=st.sampled_from(sorted({*SCENARIOS, *CLUSTER_NAMES, "broker stop and start"})),
    runtime=st.sampled_from(["native", "faust"]),
    proposals=counts,
    faults=counts,
    lost=counts,
    duplicated=counts,
    repeated=counts,
    mismatched=counts,
    crashes=counts,
    self_restarts=counts,
    lag_zero=st.booleans(),
    # A fault that takes a broker away is measured both ways: recovery_s has one too.
    recovery_s=st.lists(st.floats(min_value=0, max_value=1e5), min_size=1, max_size=5),
    after_return_s=st.lists(st.floats(min_value=0, max_value=1e5), max_size=3),
    away_s=st.lists(st.floats(min_value=0, max_value=1e5), min_size=1, max_size=3),
    seconds=st.floats(min_value=0, max_value=1e6),
    examples=st.lists(st.text(min_size=0, max_size=300), max_size=4),
)


@given(st.lists(rows, max_size=8))
def test_every_line_fits_and_every_figure_is_there(chosen: list[Row]) -> None:
    lines = [*report(chosen), *wrapped(bounds(chosen))]
    assert all(len(line) <= WIDTH for line in lines), max(lines, key=len)
    blocks = "\n".join(report(chosen)).split("\n\n")[1:]
    assert len(blocks) == len(chosen)
    for row, block in zip(chosen, blocks, strict=True):
        head, size, guarantee, process, *_ = block.splitlines()
        assert head == f"{row.scenario} ({row.runtime}): {'clean' if row.clean else 'NOT CLEAN'}"
        assert size.startswith(f"  {row.proposals:,} proposals, {row.faults} faults")
        assert guarantee == (
            f"  lost {row.lost}, duplicated {row.duplicated}, repeated {row.repeated}, "
            f"mismatched {row.mismatched}"
        )
        assert process.startswith(f"  crashes {row.crashes}, self restarts {row.self_restarts}")


def test_the_widest_row_fits() -> None:
    most = 10**7
    row = Row(max(CLUSTER_NAMES, key=len), "native", most, most, most, most, most, most, most, most)
    row.recovery_s, row.seconds = [99999.9], 999999.0
    assert max(len(line) for line in report([row])) <= WIDTH


def test_a_row_reads_as_a_block() -> None:
    row = Row("kills", "native", 100_000, 24, recovery_s=[1.0, 3.5, 2.0], seconds=61.2)
    lines = report([row])
    assert lines[2:] == [
        f"kills (native): {'clean' if row.clean else 'NOT CLEAN'}",
        "  100,000 proposals, 24 faults, 61 s",
        "  lost 0, duplicated 0, repeated 0, mismatched 0",
        "  crashes 0, self restarts 0, lag back to 0: NO",
        "  recovery max 3.5 s, median 2.0 s",
    ]
