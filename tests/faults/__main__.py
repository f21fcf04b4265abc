"""`python -m tests.faults` (`make faults`): every fault scenario, full size, on a real
broker, then the report table (and JSON with --json)."""

import json
import tempfile
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

import click
from rich.console import Console

from processor.broker.cluster import running_cluster
from processor.broker.provide import provide_broker
from tests.faults.brokers import CLUSTER_NAMES, CLUSTER_SCENARIOS, CLUSTER_SIZE
from tests.faults.check import Row
from tests.faults.scenarios import FULL, SCENARIOS, SHORT, Size, broker_restart

ALL = [*SCENARIOS, "broker", *CLUSTER_SCENARIOS]


#: The report's widest line: it reads whole in a log, a pipe and a narrow terminal.
WIDTH = 80


def report(rows: list[Row]) -> list[str]:
    """The report as plain lines of at most WIDTH characters: a block per scenario (its
    size, then what a guarantee counts, then lag and recovery), no table to cut."""
    held = sum(r.clean for r in rows)
    lines = [f"runstate fault harness: {len(rows)} scenario runs, {held} clean"]
    for row in rows:
        recovery = sorted(row.recovery_s)
        shown = (
            f"recovery max {recovery[-1]:.1f} s, median {recovery[len(recovery) // 2]:.1f} s"
            if recovery
            else "no recovery measured"
        )
        lines += [
            "",
            f"{row.scenario} ({row.runtime}): {'clean' if row.clean else 'NOT CLEAN'}",
            f"  {row.proposals:,} proposals, {row.faults} faults, {row.seconds:.0f} s",
            f"  lost {row.lost}, duplicated {row.duplicated}, repeated {row.repeated}, "
            f"mismatched {row.mismatched}",
            f"  crashes {row.crashes}, self restarts {row.self_restarts}, "
            f"lag back to 0: {'yes' if row.lag_zero else 'NO'}",
            f"  {shown}",
            *(f"  {_clip(example)}" for example in row.examples[:3]),
        ]
    return lines


def wrapped(lines: list[str]) -> list[str]:
    """Long lines folded at WIDTH, their continuations indented."""
    return [part for line in lines for part in textwrap.wrap(line, WIDTH, subsequent_indent="  ")]


def _clip(text: str) -> str:
    """One line of an example: its whitespace folded, cut to fit after the indent."""
    line = " ".join(text.split())
    return line if len(line) <= WIDTH - 2 else line[: WIDTH - 5] + "..."


@click.command()
@click.option(
    "--scenario",
    "scenarios",
    multiple=True,
    type=click.Choice(ALL),
    help="Repeatable; default all.",
)
@click.option(
    "--runtime",
    "runtimes",
    multiple=True,
    type=click.Choice(["native", "faust"]),
    help="Repeatable; default native.",
)
@click.option("--short", is_flag=True, help="The CI sizes instead of the full ones.")
@click.option(
    "--json",
    "json_path",
    type=click.Path(allow_dash=True, path_type=Path),
    help="Also write the rows as JSON to this file ('-': standard output, instead of the report).",
)
@click.option(
    "--keep",
    type=click.Path(file_okay=False, path_type=Path),
    help="Keep the working directory (worker and broker logs) here.",
)
def main(
    scenarios: tuple[str, ...],
    runtimes: tuple[str, ...],
    short: bool,
    json_path: Path | None,
    keep: Path | None,
) -> None:
    """Run the fault scenarios and print lost / duplicated / mismatched per scenario.

    Full size, on one broker: SIGKILL 24 times over 100,000 proposals and 10,000 runs;
    1 -> 3 -> 1 workers; a zombie; 10,000 hostile records; a broker restart. On a
    3-node cluster (replication 3, min.insync.replicas 2), 24,000 proposals each: a
    partition leader, a changelog leader, a transaction coordinator and the group
    coordinator SIGKILLed; a rolling restart; a broker paused past its session; a broker
    restarted with its disk lost. Exits 1 unless every row is clean."""
    # Progress goes to stderr, so that `--json -` leaves standard output to the JSON.
    console = Console(stderr=True)
    size = SHORT if short else FULL
    chosen = scenarios or tuple(ALL)
    rows: list[Row] = []

    def ran(row: Row, runtime: str) -> None:
        rows.append(row)
        console.print(f"{row.scenario} ({runtime}): {'clean' if row.clean else 'NOT CLEAN'}")

    with _workdir(keep) as tmp:
        single = [n for n in chosen if n not in CLUSTER_SCENARIOS]
        on_cluster = [n for n in chosen if n in CLUSTER_SCENARIOS]
        for runtime in runtimes or ("native",):
            if single:
                with provide_broker(Path(tmp) / "shared-broker") as bootstrap:
                    for name in single:
                        where = Path(tmp) / f"{runtime}-{name}"
                        with console.status(f"{name} ({runtime}) ..."):
                            if name == "broker":
                                row = broker_restart(where, runtime, size)
                            else:
                                row = SCENARIOS[name](bootstrap, where, runtime, size)
                        ran(row, runtime)
            if on_cluster:
                cluster_size = _shorter(CLUSTER_SIZE) if short else CLUSTER_SIZE
                with (
                    console.status("starting a 3-node cluster ..."),
                    running_cluster(Path(tmp) / f"{runtime}-cluster", 3) as brokers,
                ):
                    for name in on_cluster:
                        where = Path(tmp) / f"{runtime}-{name}"
                        with console.status(f"{name} ({runtime}, 3 brokers) ..."):
                            ran(
                                CLUSTER_SCENARIOS[name](brokers, where, runtime, cluster_size),
                                runtime,
                            )
    as_json = json.dumps([asdict(r) for r in rows], indent=2)
    if json_path == Path("-"):
        click.echo(as_json)
    else:
        for line in [*report(rows), "", *wrapped(bounds(rows))]:
            click.echo(line)
        if json_path is not None:
            json_path.write_text(as_json)
    raise SystemExit(0 if all(r.clean for r in rows) else 1)


@contextmanager
def _workdir(keep: Path | None) -> Iterator[str]:
    if keep is None:
        with tempfile.TemporaryDirectory(prefix="runstate-faults-") as tmp:
            yield tmp
    else:
        keep.mkdir(parents=True, exist_ok=True)
        yield str(keep)


#: Recovery after a single-broker fault on the cluster (median, max), and after the
#: single broker's restart, in seconds.
CLUSTER_BOUNDS = (10.0, 20.0)
BROKER_RESTART_BOUND = 15.0


def bounds(rows: list[Row]) -> list[str]:
    """The recovery figures against their bounds, one line each (timing on a shared
    machine: reported, not part of the exit status)."""
    lines = []
    cluster = sorted(s for r in rows if r.scenario in CLUSTER_NAMES for s in r.recovery_s)
    if cluster:
        median, worst = cluster[len(cluster) // 2], cluster[-1]
        met = median <= CLUSTER_BOUNDS[0] and worst <= CLUSTER_BOUNDS[1]
        lines.append(
            f"cluster faults: recovery median {median:.1f} s (bound {CLUSTER_BOUNDS[0]:.0f}), "
            f"max {worst:.1f} s (bound {CLUSTER_BOUNDS[1]:.0f}): {'met' if met else 'NOT met'}"
        )
    for row in rows:
        if row.scenario == "broker stop and start" and row.after_return_s:
            # After the restart: from the broker answering again. From the stop, the
            # recovery also holds the broker's own time away (its stop, 5 s, its start).
            worst = max(row.after_return_s)
            met = worst <= BROKER_RESTART_BOUND
            lines.append(
                f"single broker restart ({row.runtime}): recovery {worst:.1f} s after the "
                f"broker answered again (bound {BROKER_RESTART_BOUND:.0f}): "
                f"{'met' if met else 'NOT met'}; {max(row.recovery_s):.1f} s from its stop, "
                f"of which it was away {max(row.away_s):.1f} s"
            )
    return lines


def _shorter(size: Size) -> Size:
    """A cluster scenario for CI: half the feed (a node still goes down and comes back
    while proposals flow)."""
    return Size(size.runs // 2, size.proposals // 2, size.rate, size.kills, size.hostile)


if __name__ == "__main__":
    main()
