"""`runstate demo`: the whole job end to end on a real broker, in one command."""

import shutil
import sys
import tempfile
import time
from collections import Counter
from contextlib import ExitStack
from pathlib import Path

import click
from confluent_kafka.admin import AdminClient
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from processor.broker.launcher import BrokerError
from processor.broker.provide import configured_bootstrap, provide_broker
from processor.broker.server import free_ports
from processor.cli.options import bootstrap_option, option
from processor.demo.driver import DemoResult, Driver
from processor.kafka.config import KafkaSettings
from processor.kafka.readback import read_topics
from processor.kafka.topic_creation import create_topics
from processor.kafka.topic_plans import plan_topics
from processor.kafka.topics import TopicNames
from processor.runtimes.native.process import WorkerProcess
from processor.trust.keygen import generate_keyring
from processor.trust.keyring import dump_keyring, signing_keys
from schemas.messages import Rejection, Transition


@click.command()
@option("--runs", env="DEMO_RUNS", type=click.IntRange(min=3), default=300, help="Runs to drive.")
@option(
    "--workers", env="DEMO_WORKERS", type=click.IntRange(1, 6), default=2, help="Worker processes."
)
@option(
    "--partitions",
    env="DEMO_PARTITIONS",
    type=click.IntRange(min=1),
    default=6,
    help="Topic partitions.",
)
@option("--seed", env="DEMO_SEED", type=int, default=2026, help="Seed of the runs' stories.")
@option("--keep", env="DEMO_KEEP", is_flag=True, help="Keep the demo's directory (logs, state).")
@bootstrap_option
def demo(
    runs: int,
    workers: int,
    partitions: int,
    seed: int,
    keep: bool,
    bootstrap_servers: str | None,
) -> None:
    """Run the processor end to end and show what it decided.

    Uses the broker in --bootstrap-servers / KAFKA_BOOTSTRAP_SERVERS if set, else starts
    one (Docker if an engine answers, else Java 17 + Maven). Creates fresh topics,
    starts worker processes, drives runs of the three built-in machines through realistic
    lives (approvals granted and denied, transient errors and retries, idempotent steps,
    illegal, forged and garbage records), then prints a summary. Exits 0 only when
    every proposal got exactly one outcome.
    """
    console = Console()
    workdir = Path(tempfile.mkdtemp(prefix="runstate-demo-"))
    ok = False
    try:
        with ExitStack() as stack:
            bootstrap = bootstrap_servers or configured_bootstrap()
            if bootstrap is None:
                console.print("[bold]1/4[/] No broker configured: starting a local Kafka broker")
                try:
                    bootstrap = stack.enter_context(provide_broker(workdir / "broker", console))
                except BrokerError as exc:
                    raise click.ClickException(str(exc)) from exc
            else:
                console.print(f"[bold]1/4[/] Using the Kafka broker at {bootstrap}")
            settings = KafkaSettings.resolve(bootstrap)
            prefix = f"runstate-demo-{int(time.time())}."
            topics = TopicNames.with_prefix(prefix)
            admin = AdminClient(settings.client())
            create_topics(admin, plan_topics(topics, partitions, 1))
            del admin  # its connections must not outlive a broker we stop at the end
            console.print(f"[bold]2/4[/] Topics {prefix}* ({partitions} partitions) created")

            keyring = generate_keyring()
            keyring_file = workdir / "keyring.json"
            keyring_file.write_text(dump_keyring(keyring))
            procs = []
            # Each worker asks the others for reads across the cluster: they are its peers.
            ports = free_ports(workers)
            peers = [arg for port in ports for arg in ("--peer", f"http://127.0.0.1:{port}")]
            with console.status(f"Starting {workers} worker process(es)"):
                for n in range(workers):
                    proc = WorkerProcess(
                        bootstrap=bootstrap,
                        topic_prefix=prefix,
                        group_id=f"{prefix}workers",
                        state_dir=workdir / f"state-{n}",
                        keyring_file=keyring_file,
                        log_path=workdir / f"worker-{n}.log",
                        extra_args=("-X", "session.timeout.ms=10000", *peers),
                        port=ports[n],
                    )
                    stack.callback(proc.terminate)
                    procs.append(proc)
                _wait_for_partitions(procs, partitions)
            owned = ", ".join(
                f"worker {n}: {len((p.health() or {}).get('partitions', []))}"
                for n, p in enumerate(procs)
            )
            console.print(f"[bold]3/4[/] Workers up, partitions owned: {owned}")

            driver = Driver(settings, topics, signing_keys(keyring), seed=seed)
            stack.callback(driver.close)
            with Progress(
                TextColumn("[bold]4/4[/] {task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=console,
            ) as progress:
                task = progress.add_task("Driving runs", total=None)
                state = {"base": 0, "size": 0}

                def on_wave(wave: int, size: int) -> None:
                    state["base"] += state["size"]
                    state["size"] = size
                    progress.update(
                        task,
                        description=f"wave {wave}: {size} proposals",
                        total=state["base"] + size,
                        completed=state["base"],
                    )

                result = driver.run(
                    runs,
                    on_wave=on_wave,
                    progress=lambda done: progress.update(task, completed=state["base"] + done),
                )
            dlq = sum(1 for _ in read_topics(settings, [topics.dlq]))
            ok = _summary(console, result, dlq)
            for n, proc in enumerate(procs):
                code = proc.terminate()
                if code != 0:
                    console.print(f"[red]worker {n} exited {code}[/]; log: {proc.log_path}")
                    ok = False
    finally:
        if keep or not ok:
            console.print(f"demo directory (logs, state, keyring): {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    sys.exit(0 if ok else 1)


def _wait_for_partitions(procs: list[WorkerProcess], partitions: int, timeout: float = 120) -> None:
    """Until the group has settled: every partition owned, every worker with a share."""
    deadline = time.monotonic() + timeout
    settled_since = None
    while time.monotonic() < deadline:
        shares = []
        for proc in procs:
            if proc.proc.poll() is not None:
                raise click.ClickException(f"a worker exited:\n{proc.log()}")
            shares.append(len((proc.health() or {}).get("partitions", [])))
        if sum(shares) == partitions and min(shares) >= min(1, partitions // len(procs)):
            settled_since = settled_since or time.monotonic()
            if time.monotonic() - settled_since > 1.0:
                return
        else:
            settled_since = None
        time.sleep(0.2)
    raise click.ClickException("workers did not take all partitions in time")


def _summary(console: Console, result: DemoResult, dlq: int) -> bool:
    transitions = result.transitions()
    rejections = result.rejections()
    by_machine: dict[str, Counter[str]] = {}
    for run_id, machine in result.machine_of.items():
        by_machine.setdefault(machine, Counter())[result.final_state.get(run_id, "(none)")] += 1
    runs = Table("machine", "runs", "final states", title="Runs per final state")
    for machine, states in sorted(by_machine.items()):
        shown = ", ".join(f"{s} {n}" for s, n in states.most_common())
        runs.add_row(machine, str(sum(states.values())), shown)
    console.print(runs)

    # Deadlines the processor proposed itself (retry backoff) race the agents' own
    # proposals; whichever comes second is refused. Counted apart from the agents'.
    def by_timer(outcome: Transition | Rejection) -> bool:
        return (outcome.proposal_id or "").startswith("timer:")

    outcomes = Table("outcome", "agents", "processor deadlines", title="Outcomes")
    outcomes.add_row(
        "transitions (committed)",
        str(sum(not by_timer(t) for t in transitions)),
        str(sum(by_timer(t) for t in transitions)),
    )
    codes = Counter((r.code.value, by_timer(r)) for r in rejections)
    for code in sorted({c for c, _ in codes}, key=lambda c: -codes[(c, False)]):
        outcomes.add_row(f"rejected: {code}", str(codes[(code, False)]), str(codes[(code, True)]))
    outcomes.add_row("DLQ (not a proposal)", f"{dlq} of {result.garbage_sent} sent", "")
    console.print(outcomes)

    sent = sum(result.sent.values())
    ids = Counter(t.transition_id for t in transitions)
    twice = sum(1 for n in ids.values() if n > 1)
    missing, extra = result.missing, result.extra
    ok = not missing and not extra and not twice and dlq == result.garbage_sent
    verdict = "[green]every proposal got exactly one outcome[/]" if ok else "[red]FAILED[/]"
    console.print(
        f"{sent} proposals in {result.waves} waves; missing {len(missing)}, "
        f"more than one outcome {len(extra)}, duplicate transition ids {twice}: {verdict}"
    )
    return ok
