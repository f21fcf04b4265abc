"""`python -m tests.faults.soak` (`make soak`): the worker group run for a long time on
a three-node cluster at a steady half of its own drain rate, a random worker SIGKILLed
every two minutes, one broker restarted in the middle, HTTP readers asking for runs
throughout. At the end the same invariants as every fault scenario (lost, duplicated,
mismatched: zero), and over time: each worker's resident memory, the group's lag, the
p99 of answers (from a proposal's append to its outcome reaching a reader), the
readers' errors; as a table and a plot.

Memory is judged per worker process: a killed worker starts again with a fresh heap, so
"flat" means each life's RSS after its warm-up grows by less than RSS_GROWTH_LIMIT. A
life's warm-up ends when its bounded caches have filled: RocksDB's block cache at 95 %
of its size, and the decoded-snapshot cache at its capacity or no longer growing (it
holds the runs used in its idle time, a level a steady load keeps well under the
capacity: its highest over LEVEL_WINDOW_S under 5 % above the window before); and not
before WARM_UP_S.
A cache filling is the warm-up, growth past it is not. A life is judged when at least
JUDGED_S follow its warm-up; the growth from WARM_UP_S is reported beside it."""

import http.client
import json
import random
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import click
from confluent_kafka import Consumer, TopicPartition
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from benchmarks.records import RawRecord
from processor.broker.cluster import Cluster as Brokers
from processor.broker.cluster import running_cluster
from processor.kafka.partitioning import partition_for
from processor.runtimes.native.snapshot_cache import CAPACITY as SNAPSHOT_CAPACITY
from processor.runtimes.native.store.options import BLOCK_CACHE_BYTES
from tests.faults.arrivals import Arrivals, recovery_seconds
from tests.faults.check import Row, check
from tests.faults.cluster import Cluster, signed_records
from tests.faults.scenarios import PARTITIONS, fresh_env
from tests.integration.harness import Env, WorkerProcess, workload

SAMPLE_S = 10.0
WARM_UP_S = 60.0  # a worker life's warm-up lasts at least this long
JUDGED_S = 120.0  # and a life is judged on this much at least after it
LEVEL_WINDOW_S = 120.0  # the snapshot cache is level when one such window adds under 5 %
RSS_GROWTH_LIMIT = 0.10
BLOCK_CACHE_MB = BLOCK_CACHE_BYTES / 2**20
CHUNK_S = 20.0  # the feed is generated and signed this many seconds at a time
#: Proposals drained as a backlog to find the rate: about 10 s of draining. A backlog of
#: 6,000 (2 s) measured 1,724, 3,036 and 5,678/s in three runs of the same code.
PROBE = 30_000


@dataclass
class Sample:
    at_s: float  # since the soak began
    rss_mb: dict[str, float]  # slot -> resident MB (its current process)
    lag: int | None  # records the group is behind, all partitions
    answered: int  # outcomes that reached the reader in the interval
    p99_ms: float | None  # of those, proposal append -> outcome read
    reads: int
    read_errors: int


@dataclass
class Life:
    """One worker process: its slot, when it started and its RSS samples."""

    slot: int
    pid: int
    started_s: float
    rss: list[tuple[float, float]] = field(default_factory=list)
    #: RSS less what RocksDB holds (its memtables, table readers and block cache, from
    #: the worker's /metrics), sampled with `rss`: the heap's part of the growth.
    heap: list[tuple[float, float]] = field(default_factory=list)
    #: The runs its snapshot cache held, sampled with `rss`.
    cached: list[tuple[float, int]] = field(default_factory=list)
    #: When its caches were first seen full (see `caches_full`); None while they fill.
    caches_full_s: float | None = None

    def sampled(self, at: float, rocksdb: dict[str, float], cached: int | None) -> None:
        """A sample of its caches, taken with an RSS sample at `at`."""
        if cached is not None:
            self.cached.append((at, cached))
        if self.caches_full_s is None and caches_full(rocksdb, self.cached, at):
            self.caches_full_s = at

    @property
    def warm_s(self) -> float | None:
        """When its warm-up ended (see the module's docstring); None: not yet."""
        if self.caches_full_s is None:
            return None
        return max(self.caches_full_s, self.started_s + WARM_UP_S)

    def since(self, samples: list[tuple[float, float]], start_s: float | None) -> list[float]:
        """The MB of `samples` (`rss` or `heap`) from `start_s` on."""
        return [] if start_s is None else [mb for at, mb in samples if at >= start_s]

    def judged(self) -> bool:
        warm = self.warm_s
        return warm is not None and bool(self.rss) and self.rss[-1][0] - warm >= JUDGED_S

    def growth(self, of: str = "rss", start_s: float | None = None) -> float | None:
        """Growth from the first sample after the warm-up (or `start_s`) to the last, as a
        fraction, of RSS (or of "heap": RSS less RocksDB); None for a life not judged
        (or, from `start_s`, too short to say)."""
        if start_s is None and not self.judged():
            return None
        kept = self.since(self.rss if of == "rss" else self.heap, start_s or self.warm_s)
        return None if len(kept) < 3 else (kept[-1] - kept[0]) / kept[0]

    def growth_from_first_minute(self, of: str = "rss") -> float | None:
        """The same from WARM_UP_S on, caches full or not (a figure reported, not judged
        by)."""
        return self.growth(of, self.started_s + WARM_UP_S)


@dataclass
class Report:
    minutes: float
    rate: float
    drain_rate: float
    row: Row
    samples: list[Sample]
    lives: list[Life]
    faults: list[tuple[float, str]]  # (seconds since start, what)

    @property
    def worst_growth(self) -> float | None:
        growths = [g for g in (life.growth() for life in self.lives) if g is not None]
        return max(growths) if growths else None

    @property
    def clean(self) -> bool:
        """The invariants hold, and at least one life was judged, each under the limit
        (none judged is no evidence of flat memory)."""
        worst = self.worst_growth
        return self.row.clean and worst is not None and worst < RSS_GROWTH_LIMIT


def rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def worker_memory(url: str, headers: dict[str, str]) -> tuple[dict[str, float], int | None]:
    """A worker's `runstate_store_memory_bytes` by kind, in MB (memtables, table
    readers, the shared block cache), and its `runstate_snapshot_cache_runs`."""
    request = urllib.request.Request(url + "/metrics", headers=headers)
    with urllib.request.urlopen(request, timeout=5) as response:
        text = response.read().decode()
    rocksdb: dict[str, float] = {}
    cached = None
    for family in text_string_to_metric_families(text):
        if family.name == "runstate_store_memory_bytes":
            for sample in family.samples:
                rocksdb[sample.labels["kind"]] = round(sample.value / 2**20, 1)
        elif family.name == "runstate_snapshot_cache_runs":
            cached = int(family.samples[0].value)
    return rocksdb, cached


def caches_full(rocksdb: dict[str, float], cached: list[tuple[float, int]], at: float) -> bool:
    """The block cache at 95 %, and the snapshot cache (`cached`: its samples up to `at`)
    at capacity or level: its highest over the last LEVEL_WINDOW_S under 5 % above its
    highest over the window before. Highest, not the last sample: the cache saw-tooths as
    runs finish and leave it, and a sample in a trough once passed for a level while the
    cache still rose by hundreds of runs a minute. Two minutes, not one: its rise paused
    for a minute once and went on."""
    if rocksdb.get("block_cache", 0.0) < 0.95 * BLOCK_CACHE_MB or not cached:
        return False
    if cached[-1][1] >= SNAPSHOT_CAPACITY:
        return True
    last = [n for t, n in cached if at - t < LEVEL_WINDOW_S]
    before = [n for t, n in cached if LEVEL_WINDOW_S <= at - t < 2 * LEVEL_WINDOW_S]
    return bool(last and before) and max(last) <= 1.05 * max(before)


def _lags(env: Env) -> dict[int, int] | None:
    """Records of each partition of the proposals topic past the group's committed
    offset; None while a broker is away."""
    consumer = Consumer({"bootstrap.servers": env.bootstrap, "group.id": env.group_id})
    try:
        parts = [TopicPartition(env.topics.proposals, p) for p in range(PARTITIONS)]
        lags = {}
        for tp in consumer.committed(parts, timeout=10):
            low, high = consumer.get_watermark_offsets(tp, timeout=10)
            lags[tp.partition] = high - (tp.offset if tp.offset >= 0 else low)
        return lags
    except Exception:  # a broker away: no figure for this sample
        return None
    finally:
        consumer.close()


def _lag(env: Env) -> int | None:
    """Records of the proposals topic past the group's committed offsets."""
    lags = _lags(env)
    return None if lags is None else sum(lags.values())


def caught_up(env: Env, backlog: int, drain: float) -> bool:
    """Wait until the group has read every partition to its end but for a transaction
    marker (a committed offset stops before the marker that ends its last
    transaction): within three times the backlog's drain time, two minutes at least.
    False when it did not; no figure (a broker away) is not an end."""
    limit = time.monotonic() + max(120.0, 3 * backlog / max(drain, 1.0))
    while time.monotonic() < limit:
        lags = _lags(env)
        if lags is not None and all(lag <= 1 for lag in lags.values()):
            return True
        time.sleep(1.0)
    return False


class Feed(threading.Thread):
    """Proposals at `rate` per second for `seconds`, generated and signed CHUNK_S at a
    time (new runs each chunk), from one producer (each run's order kept)."""

    def __init__(self, env: Env, rate: float, seconds: float, first_seed: int) -> None:
        super().__init__(daemon=True, name="feed")
        self.env, self.rate, self.seconds, self.first_seed = env, rate, seconds, first_seed
        self.sent = 0
        self.last_sent = 0.0  # wall clock of the last send
        self.run_ids: list[str] = []
        self.error: BaseException | None = None
        self._stopping = threading.Event()

    def chunks(self) -> Iterator[list[RawRecord]]:
        per_chunk = max(100, int(self.rate * CHUNK_S))
        for n in range(int(self.seconds / CHUNK_S) + 1):
            plan = workload(runs=per_chunk // 10, proposals=per_chunk, seed=self.first_seed + n)
            self.run_ids += sorted({str(p["run_id"]) for p in plan})
            yield signed_records(self.env, plan)

    def run(self) -> None:
        client = self.env.client(timeout=300)  # deliveries outlast a broker restart
        try:
            started = time.monotonic()
            for chunk in self.chunks():
                for record in chunk:
                    if self._stopping.is_set() or time.monotonic() - started > self.seconds:
                        return
                    if self.sent % 50 == 0:
                        ahead = self.sent / self.rate - (time.monotonic() - started)
                        if ahead > 0:
                            time.sleep(ahead)
                    client.send_raw(record.key, record.value, record.headers)  # type: ignore[arg-type]
                    self.sent += 1
                    self.last_sent = time.time()
        except BaseException as exc:  # reported by the soak
            self.error = exc
        finally:
            client.flush(300)
            client.close()

    def stop(self) -> None:
        self._stopping.set()


class Readers(threading.Thread):
    """HTTP readers: a run's snapshot from the worker that owns its partition, over and
    over; errors are counted (a run not found yet is an answer, not an error)."""

    def __init__(self, workers: Cluster, feed: Feed) -> None:
        super().__init__(daemon=True, name="readers")
        self.workers, self.feed = workers, feed
        self.reads = self.errors = 0
        self._stopping = threading.Event()
        self.rng = random.Random(7)

    def _owner(self, run_id: str) -> WorkerProcess | None:
        partition = partition_for(run_id, PARTITIONS)
        for worker in self.workers.live():
            if partition in (worker.health() or {}).get("partitions", []):
                return worker
        return None

    def run(self) -> None:
        while not self._stopping.is_set():
            if not self.feed.run_ids:
                time.sleep(0.2)
                continue
            run_id = self.rng.choice(self.feed.run_ids)
            worker = self._owner(run_id)
            self.reads += 1
            if worker is None:  # between owners (a rebalance): not an error of a worker
                time.sleep(0.05)
                continue
            try:
                worker.get(worker.run_path(run_id))
            except (OSError, ValueError, http.client.HTTPException):  # killed mid-answer
                self.errors += 1
            time.sleep(0.02)

    def stop(self) -> None:
        self._stopping.set()
        self.join(30)


def _p99(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def probe_drain_rate(env: Env, arrivals: Arrivals, seed: int, proposals: int = PROBE) -> float:
    """Proposals per second the group answers from a backlog of `proposals`."""
    plan = workload(runs=proposals // 10, proposals=proposals, seed=seed)
    records = signed_records(env, plan)
    before = sum(len(t) for t in arrivals.times.values())
    client = env.client(timeout=120)
    for record in records:
        client.send_raw(record.key, record.value, record.headers)  # type: ignore[arg-type]
    client.flush(120)
    client.close()
    deadline = time.monotonic() + 300
    while sum(len(t) for t in arrivals.times.values()) - before < len(records):
        if time.monotonic() > deadline:
            raise TimeoutError("the drain probe was not answered within 300 s")
        time.sleep(0.2)
    stamps = sorted(t for ts in arrivals.times.values() for t in ts)[before:]
    return len(records) / max(0.001, stamps[len(records) - 1] - stamps[0])


def soak(
    brokers: Brokers,
    tmp: Path,
    minutes: float,
    *,
    rate: float | None = None,
    kill_every_s: float = 120.0,
    probe: int = PROBE,
    console: Console | None = None,
) -> Report:
    console = console or Console(stderr=True)
    env = fresh_env(brokers.bootstrap, tmp, replication=3)
    workers = Cluster(env, "native", "--static-membership")
    for slot in range(3):
        workers.start(slot)
    arrivals = Arrivals(env, latencies=True)
    samples: list[Sample] = []
    lives: dict[int, Life] = {}
    faults: list[tuple[float, str]] = []
    row = Row("soak", "native", 0, 0)
    began = time.monotonic()
    readers: Readers | None = None
    feed: Feed | None = None
    try:
        workers.wait_owned(PARTITIONS)
        arrivals.begin()
        drain = probe_drain_rate(env, arrivals, seed=999, proposals=probe)
        rate = rate or drain / 2
        console.print(f"drain rate {drain:,.0f}/s; feeding {rate:,.0f}/s for {minutes:g} min")
        feed = Feed(env, rate, minutes * 60, first_seed=1000)
        readers = Readers(workers, feed)
        began = time.monotonic()
        feed.start()
        readers.start()
        fault_times: list[float] = []
        next_kill = kill_every_s
        restart_at = minutes * 60 / 2
        restarted = False
        rng = random.Random(11)
        last_sample, seen, reads, errors = began, 0, 0, 0
        while feed.is_alive():
            time.sleep(1.0)
            now = time.monotonic() - began
            # No fault in the feed's last 20 s: its recovery would not be seen.
            if now >= next_kill and now < minutes * 60 - 20:
                next_kill += kill_every_s
                slot = rng.choice(sorted(workers.workers))
                fault_times.append(time.time())
                faults.append((now, f"SIGKILL worker {slot}"))
                workers.restart(slot)
            if not restarted and now >= restart_at:
                restarted = True
                node = rng.choice(brokers.node_ids)
                fault_times.append(time.time())
                faults.append((now, f"restart broker {node}"))
                brokers.stop(node)
                brokers.start(node)
            if time.monotonic() - last_sample >= SAMPLE_S:
                last_sample = time.monotonic()
                window = arrivals.latencies[seen:]
                seen += len(window)
                rss: dict[str, float] = {}
                for slot, worker in sorted(workers.workers.items()):
                    pid = worker.proc.pid
                    life = lives.get(pid)
                    if life is None:
                        life = lives[pid] = Life(slot, pid, now)
                    mb = rss_mb(pid)
                    if mb is not None:
                        rss[str(slot)] = round(mb, 1)
                        life.rss.append((now, mb))
                        try:
                            rocksdb, cached = worker_memory(worker.url, worker.headers)
                        except (OSError, ValueError, http.client.HTTPException):
                            continue  # starting, or just killed: no split this time
                        life.heap.append((now, mb - sum(rocksdb.values())))
                        life.sampled(now, rocksdb, cached)
                samples.append(
                    Sample(
                        round(now, 1),
                        rss,
                        _lag(env),
                        len(window),
                        None if not window else round(1000 * (_p99(window) or 0), 1),
                        readers.reads - reads,
                        readers.errors - errors,
                    )
                )
                reads, errors = readers.reads, readers.errors
                shown = samples[-1]
                console.print(
                    f"{now / 60:5.1f} min  rss {shown.rss_mb}  lag {shown.lag}  "
                    f"p99 {shown.p99_ms} ms  answered {shown.answered}  "
                    f"read errors {shown.read_errors}/{shown.reads}"
                )
        if feed.error is not None:
            raise feed.error
        readers.stop()
        workers.note_crashes()
        row.proposals = feed.sent + probe
        row.faults = len(fault_times)
        workers.wait_owned(PARTITIONS)
        # Counted with every worker stopped (each commits and leaves): the workers'
        # own deadlines keep firing for the soak's many runs, and at this size a read
        # of the topics takes minutes, so a count made while they run never catches up
        # (a first soak counted 117 deadline transitions as lost and 700 runs as
        # mismatched that way). The readers above asked the running workers.
        if not caught_up(env, _lag(env) or 0, drain):
            row.examples.append(f"the group had not caught up when stopped: lag {_lags(env)}")
        workers.note_crashes()
        workers.close()
        check(row, env, [], PARTITIONS, settle=120)
        arrivals.end()
        # Stalls that began in the feed's last half second are the feed ending.
        row.recovery_s = recovery_seconds(fault_times, arrivals.times, feed.last_sent - 0.5)
    finally:
        if readers is not None:
            readers.stop()
        if feed is not None:
            feed.stop()
        arrivals.end()
        workers.close()
        row.crashes = len(workers.crashes)
        row.self_restarts = workers.self_restarts()
        row.examples += workers.crashes[:2]
        row.seconds = round(time.monotonic() - began, 1)
    return Report(minutes, rate or 0.0, drain, row, samples, list(lives.values()), faults)


def table(report: Report) -> str:
    """The report as Markdown: the invariants, then one row per minute."""
    row = report.row
    worst = report.worst_growth
    lines = [
        f"{report.minutes:g} minutes on 3 brokers (replication 3, min.insync.replicas 2), "
        f"3 workers; fed {report.rate:,.0f} proposals/s (half the drain rate measured "
        f"first, {report.drain_rate:,.0f}/s); {row.proposals:,} proposals.",
        "",
        "| lost | duplicated | mismatched | crashes | self restarts | lag 0 | faults | "
        "recovery s (max / median) | worst RSS growth of a worker life after warm-up "
        "(lives judged) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    rec = sorted(row.recovery_s)
    shown = f"{rec[-1]:.1f} / {rec[len(rec) // 2]:.1f}" if rec else "-"
    judged = sum(life.judged() for life in report.lives)
    growth = "none judged" if worst is None else f"{100 * worst:+.1f} % ({judged})"
    lag = "yes" if row.lag_zero else "NO"
    if row.pending_timers:  # written by the stopping workers' timers, for the next owner
        lag += f" ({row.pending_timers} deadline proposals unread)"
    lines.append(
        f"| {row.lost} | {row.duplicated} | {row.mismatched} | {row.crashes} | "
        f"{row.self_restarts} | {lag} | {row.faults} | {shown} | "
        f"{growth} |"
    )
    lines += [
        "",
        "| minute | RSS MB per worker | lag | answered/s | p99 ms | HTTP reads (errors) |",
        "|---|---|---|---|---|---|",
    ]
    per_minute: dict[int, list[Sample]] = {}
    for sample in report.samples:
        per_minute.setdefault(int(sample.at_s // 60), []).append(sample)
    for minute, group in sorted(per_minute.items()):
        last = group[-1]
        rss = ", ".join(f"{v:.0f}" for _, v in sorted(last.rss_mb.items()))
        lags = [s.lag for s in group if s.lag is not None]
        p99s = [s.p99_ms for s in group if s.p99_ms is not None]
        answered = sum(s.answered for s in group) / (len(group) * SAMPLE_S)
        reads, errs = sum(s.reads for s in group), sum(s.read_errors for s in group)
        lines.append(
            f"| {minute} | {rss} | {max(lags) if lags else '-'} | {answered:,.0f} | "
            f"{max(p99s) if p99s else '-'} | {reads} ({errs}) |"
        )
    lines += ["", "Faults: " + "; ".join(f"{at / 60:.1f} min {what}" for at, what in report.faults)]
    lines += [
        "",
        "Worker lives, RSS and RSS less RocksDB's memory in MB. Warm: minutes into the "
        f"life when its caches had filled (the block cache at 95 % of {BLOCK_CACHE_MB:.0f} "
        f"MB, the snapshot cache at {SNAPSHOT_CAPACITY:,} runs or level: its highest over "
        f"{LEVEL_WINDOW_S / 60:.0f} minutes under 5 % above its highest over the "
        f"{LEVEL_WINDOW_S / 60:.0f} before), not before "
        f"{WARM_UP_S:.0f} s; judged from there to the end when {JUDGED_S:.0f} s or more "
        f"follow (growth under {100 * RSS_GROWTH_LIMIT:.0f} %). From {WARM_UP_S:.0f} s: the "
        "same from the first minute on, caches full or not.",
        "",
        "| worker | started min | minutes | warm min | RSS after warm | growth | "
        "RSS less RocksDB | growth | RSS from 1 min | growth |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for life in report.lives:
        if not life.rss:
            continue
        warm, first = life.warm_s, life.started_s + WARM_UP_S
        shown = "-" if warm is None else f"{(warm - life.started_s) / 60:.1f}"
        after = life.warm_s if life.judged() else None
        lines.append(
            f"| {life.slot} | {life.started_s / 60:.1f} | "
            f"{(life.rss[-1][0] - life.started_s) / 60:.1f} | {shown} | "
            f"{_span(life.since(life.rss, after))} | {_percent(life.growth())} | "
            f"{_span(life.since(life.heap, after))} | {_percent(life.growth('heap'))} | "
            f"{_span(life.since(life.rss, first))} | "
            f"{_percent(life.growth_from_first_minute())} |"
        )
    return "\n".join(lines)


def _span(mbs: list[float]) -> str:
    return f"{mbs[0]:.0f} -> {mbs[-1]:.0f}" if mbs else "-"


def _percent(fraction: float | None) -> str:
    return "-" if fraction is None else f"{100 * fraction:+.1f} %"


def plot(report: Report, path: Path) -> None:
    """RSS per worker life, lag and p99 over time, faults marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1, figsize=(10, 9), sharex=True)
    for life in report.lives:
        xs = [at / 60 for at, _ in life.rss]
        axes[0].plot(
            xs, [mb for _, mb in life.rss], color=f"C{life.slot}", label=f"worker {life.slot}"
        )
    axes[0].set_ylabel("RSS (MB)")
    handles, labels = axes[0].get_legend_handles_labels()
    unique = dict(zip(labels, handles, strict=False))
    axes[0].legend(unique.values(), unique.keys(), loc="upper left", fontsize=8)
    xs = [s.at_s / 60 for s in report.samples]
    axes[1].plot(xs, [s.lag if s.lag is not None else float("nan") for s in report.samples])
    axes[1].set_ylabel("lag (records)")
    axes[2].plot(xs, [s.p99_ms if s.p99_ms is not None else float("nan") for s in report.samples])
    axes[2].set_ylabel("p99 (ms)")
    axes[2].set_yscale("log")
    axes[2].set_xlabel("minutes")
    for ax in axes:
        for at, what in report.faults:
            ax.axvline(at / 60, color="red" if "broker" in what else "grey", lw=0.6, ls="--")
    fig.suptitle(
        f"runstate soak: {report.minutes:g} min, {report.rate:,.0f} proposals/s, "
        "3 brokers, 3 workers (grey: worker SIGKILL, red: broker restart)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


@click.command()
@click.option("--minutes", type=float, default=30.0, show_default=True, help="How long to feed.")
@click.option(
    "--rate", type=float, default=None, help="Proposals per second (default: half the drain rate)."
)
@click.option("--kill-every", type=float, default=120.0, show_default=True, help="Seconds.")
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("docs/soak"),
    show_default=True,
    help="Where report.md, report.json and soak.png go.",
)
@click.option(
    "--logs",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Keep the workers' logs here (one file per worker life); else they go with the run.",
)
def main(
    minutes: float, rate: float | None, kill_every: float, out: Path, logs: Path | None
) -> None:
    """Soak the worker group on a local 3-node cluster; exits 1 unless clean."""
    import shutil
    import tempfile

    console = Console()
    out.mkdir(parents=True, exist_ok=True)
    with (
        tempfile.TemporaryDirectory(prefix="runstate-soak-") as tmp,
        running_cluster(Path(tmp) / "cluster", 3) as brokers,
    ):
        try:
            report = soak(brokers, Path(tmp) / "env", minutes, rate=rate, kill_every_s=kill_every)
        finally:
            if logs is not None:
                logs.mkdir(parents=True, exist_ok=True)
                for log in (Path(tmp) / "env").glob("*.log"):
                    shutil.copy(log, logs / log.name)
    (out / "report.json").write_text(json.dumps(asdict(report), indent=2, default=str))
    (out / "report.md").write_text(table(report) + "\n")
    plot(report, out / "soak.png")
    console.print(table(report))
    console.print(f"wrote {out / 'report.md'}, {out / 'report.json'}, {out / 'soak.png'}")
    raise SystemExit(0 if report.clean else 1)


if __name__ == "__main__":
    main()
