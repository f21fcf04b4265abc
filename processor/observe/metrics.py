"""The worker's Prometheus metrics (GET /metrics): what it committed, refused and
dead-lettered, how long runs stay in their states, how long decisions and transactions
take, what it restored, and how many runs wait in each state.

Outcome metrics move when the transaction carrying the outcomes commits: an aborted
batch is decided again, and counting it twice would make the counters lie. Runs per
state are read from the partitions the worker owns when scraped, so a worker that owns
none reports none."""

from collections import Counter as TallyOf
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from processor.engine import Beat, Commit, Forget, Machine, Relay
from processor.records.pipeline import DeadLetterReason, Outcome
from schemas.codes import RejectionCode
from schemas.messages import Rejection, RunSnapshot, Transition

# A run recovers when it leaves one of these for running again.
RECOVERABLE = frozenset({"paused", "blocked", "retrying", "waiting", "waiting_approval"})
_STATE_SECONDS = (0.1, 1, 5, 30, 60, 300, 900, 3600, 4 * 3600, 24 * 3600)
_FAST_SECONDS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.1, 0.5, 1)
_TRANSACTION_SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
_TRANSACTION_RECORDS = (1, 10, 50, 100, 250, 500, 1000, 2500, 5000)


@dataclass
class MetricsBatch:
    """Observations of one open transaction, counted when it commits."""

    transitions: list[tuple[RunSnapshot | None, Commit]] = field(default_factory=list)
    rejections: list[tuple[str, Rejection]] = field(default_factory=list)
    dead_letters: int = 0
    heartbeats: list[str] = field(default_factory=list)  # machine of each
    forgotten: list[Transition] = field(default_factory=list)  # their `forget` transitions
    alerts: list[tuple[str, str]] = field(default_factory=list)  # (machine, rule)

    def stage(self, previous: RunSnapshot | None, outcome: Outcome) -> None:
        """An outcome of the transaction; `previous` is the run before it."""
        if isinstance(outcome, Commit):
            self.transitions.append((previous, outcome))
        elif isinstance(outcome, Beat):
            self.heartbeats.append(outcome.snapshot.machine)
        elif isinstance(outcome, Forget):
            self.forgotten.append(outcome.transition)
        elif isinstance(outcome, DeadLetterReason):
            self.dead_letters += 1
        elif isinstance(outcome, Relay):
            # A message to another run: counted where it is decided; a refusal with it here.
            if outcome.refusal is not None:
                self.stage(previous, outcome.refusal)
        else:
            machine = previous.machine if previous is not None else ""
            self.rejections.append((machine, outcome))

    def stage_alert(self, machine: str, rule: str) -> None:
        self.alerts.append((machine, rule))


class WorkerMetrics:
    def __init__(
        self,
        machines: Mapping[str, Machine],
        runs_by_state: Callable[[], Iterable[tuple[str, str, int]]],
        lag: Callable[[], dict[int, int]],
        store_memory: Callable[[], dict[str, int]] | None = None,
        cached_snapshots: Callable[[], int] | None = None,
    ) -> None:
        """`runs_by_state` yields (machine, state, runs) over the owned partitions,
        `lag` gives records behind per owned partition, `store_memory` the bytes the
        stores' RocksDB holds by kind and `cached_snapshots` the decoded snapshots the
        process keeps (none: not exported), all read at scrape time."""
        self.machines = machines
        self.registry = CollectorRegistry()
        r = self.registry
        self.transitions = Counter(
            "runstate_transitions",
            "Committed transitions.",
            ["machine", "from_state", "to_state", "event"],
            registry=r,
        )
        self.rejections = Counter(
            "runstate_rejections", "Refused proposals.", ["machine", "event", "code"], registry=r
        )
        self.invalid_transitions = Counter(
            "runstate_invalid_transition_attempts",
            "Proposals of an event the run's state does not allow.",
            ["machine", "state", "event"],
            registry=r,
        )
        self.retries = Counter(
            "runstate_retries", "Transitions into a retry state.", ["machine"], registry=r
        )
        self.dead_letters = Counter("runstate_dead_letters", "Records sent to the DLQ.", registry=r)
        self.heartbeats = Counter(
            "runstate_heartbeats",
            "Heartbeats taken (liveness, not transitions).",
            ["machine"],
            registry=r,
        )
        self.time_in_state = Histogram(
            "runstate_time_in_state_seconds",
            "Time a run spent in a state, observed when it leaves it.",
            ["machine", "state"],
            buckets=_STATE_SECONDS,
            registry=r,
        )
        self.recovery = Histogram(
            "runstate_recovery_seconds",
            "Time from entering paused, blocked, retrying or waiting to running again.",
            ["machine", "state"],
            buckets=_STATE_SECONDS,
            registry=r,
        )
        self.decision = Histogram(
            "runstate_decision_seconds",
            "Time to decode, authenticate and decide one proposal.",
            buckets=_FAST_SECONDS,
            registry=r,
        )
        self.transaction = Histogram(
            "runstate_transaction_seconds",
            "Time to commit a transaction and flush the stores.",
            buckets=_TRANSACTION_SECONDS,
            registry=r,
        )
        self.transaction_records = Histogram(
            "runstate_transaction_records",
            "Proposals and timer firings per committed transaction.",
            buckets=_TRANSACTION_RECORDS,
            registry=r,
        )
        self.alerts = Counter(
            "runstate_alerts",
            "Alert records raised (the machines' alert rules, armed as timers).",
            ["machine", "rule"],
            registry=r,
        )
        self.aborts = Counter("runstate_aborts", "Aborted transactions.", registry=r)
        self.restored = Counter(
            "runstate_restored_records", "Changelog and transition records restored.", registry=r
        )
        self.restoring = Gauge(
            "runstate_restore_in_progress", "1 while partitions are being restored.", registry=r
        )
        r.register(_Scraped(runs_by_state, lag, store_memory, cached_snapshots))

    # -- transactions -------------------------------------------------------------
    def committed(self, batch: MetricsBatch, seconds: float, records: int) -> None:
        """A transaction committed: its outcomes count now. Counts are summed per label
        set first and added once each: a label lookup per outcome cost microseconds each
        at full load."""
        transitions: TallyOf[tuple[str, str, str, str]] = TallyOf()
        retries: TallyOf[str] = TallyOf()
        for previous, commit in batch.transitions:
            t = commit.transition
            from_state = t.from_state or ""
            transitions[(t.machine, from_state, t.to_state, t.event)] += 1
            retry_states = (
                self.machines[t.machine].retry_states if t.machine in self.machines else ()
            )
            if t.to_state in retry_states and from_state not in retry_states:
                retries[t.machine] += 1
            if previous is not None and previous.state != t.to_state:
                spent = max(0.0, (t.at_ms - previous.entered_state_at_ms) / 1000)
                self.time_in_state.labels(t.machine, previous.state).observe(spent)
                if previous.state in RECOVERABLE and t.to_state == "running":
                    self.recovery.labels(t.machine, previous.state).observe(spent)
        for t in batch.forgotten:
            transitions[(t.machine, t.from_state or "", t.to_state, t.event)] += 1
        rejections: TallyOf[tuple[str, str, str]] = TallyOf()
        invalid: TallyOf[tuple[str, str, str]] = TallyOf()
        for machine, rejection in batch.rejections:
            event = rejection.event or ""
            rejections[(machine, event, rejection.code.value)] += 1
            if rejection.code is RejectionCode.INVALID_TRANSITION:
                invalid[(machine, rejection.state or "", event)] += 1
        heartbeats = TallyOf(batch.heartbeats)
        alerts = TallyOf(batch.alerts)
        for labels, n in transitions.items():
            self.transitions.labels(*labels).inc(n)
        for machine, n in retries.items():
            self.retries.labels(machine).inc(n)
        for refused, n in rejections.items():
            self.rejections.labels(*refused).inc(n)
        for attempted, n in invalid.items():
            self.invalid_transitions.labels(*attempted).inc(n)
        if batch.dead_letters:
            self.dead_letters.inc(batch.dead_letters)
        for machine, n in heartbeats.items():
            self.heartbeats.labels(machine).inc(n)
        for (machine, rule), n in alerts.items():
            self.alerts.labels(machine, rule).inc(n)
        self.transaction.observe(seconds)
        self.transaction_records.observe(records)

    def aborted(self) -> None:
        self.aborts.inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _Scraped(Collector):
    """Gauges read from the owned partitions when scraped (zeros when none are owned)."""

    def __init__(
        self,
        runs_by_state: Callable[[], Iterable[tuple[str, str, int]]],
        lag: Callable[[], dict[int, int]],
        store_memory: Callable[[], dict[str, int]] | None,
        cached_snapshots: Callable[[], int] | None,
    ) -> None:
        self.runs_by_state, self.lag, self.store_memory = runs_by_state, lag, store_memory
        self.cached_snapshots = cached_snapshots

    def collect(self) -> Iterator[GaugeMetricFamily]:
        runs = GaugeMetricFamily(
            "runstate_runs",
            "Runs in each state, in the partitions this worker owns.",
            labels=["machine", "state"],
        )
        for machine, state, count in self.runs_by_state():
            runs.add_metric([machine, state], count)
        yield runs
        lag = GaugeMetricFamily(
            "runstate_consumer_lag",
            "Proposals not yet decided, per owned partition.",
            labels=["partition"],
        )
        for partition, behind in sorted(self.lag().items()):
            lag.add_metric([str(partition)], behind)
        yield lag
        if self.store_memory is not None:
            memory = GaugeMetricFamily(
                "runstate_store_memory_bytes",
                "Memory the owned stores' RocksDB holds outside Python's heap, by kind: "
                "memtables, table readers (index and filter blocks), the shared block cache.",
                labels=["kind"],
            )
            for kind, size in sorted(self.store_memory().items()):
                memory.add_metric([kind], size)
            yield memory
        if self.cached_snapshots is not None:
            yield GaugeMetricFamily(
                "runstate_snapshot_cache_runs",
                "Decoded snapshots the process keeps for the runs used lately (a bounded "
                "cache: once at its capacity, it keeps as many).",
                value=self.cached_snapshots(),
            )
