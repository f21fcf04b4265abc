"""`python -m tests.faults.life`: one worker's memory over one long life, no faults.

A native worker owns every partition of a fresh set of topics and is fed the fault
harness's workload at a steady rate; every 15 s its RSS and its stores' RocksDB memory
(`runstate_store_memory_bytes`: memtables, table readers, the shared block cache) are
sampled. It prints each sample and, at the end, RSS growth from the soak's warm-up
(60 s) and from the block cache's filling, and the same for RSS less RocksDB's memory:
what the soak's per-life figure is made of, for a life longer than the soak lets one be.
"""

import json
import time
from pathlib import Path

import click

from processor.broker.provide import provide_broker
from processor.runtimes.native.store.options import BLOCK_CACHE_BYTES
from tests.faults.cluster import Cluster, Feeder, signed_records
from tests.faults.scenarios import fresh_env
from tests.faults.soak import WARM_UP_S, rss_mb, worker_memory
from tests.integration.harness import workload

SAMPLE_S = 15.0
BLOCK_CACHE_MB = BLOCK_CACHE_BYTES / 2**20


def growth(rows: list[dict[str, float]], key: str, since_s: float) -> float | None:
    after = [r[key] for r in rows if r["s"] >= since_s]
    return None if len(after) < 3 else round((after[-1] - after[0]) / after[0], 3)


@click.command()
@click.option("--minutes", default=15.0, show_default=True, help="How long to feed.")
@click.option("--rate", default=950.0, show_default=True, help="Proposals per second.")
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=Path("build/life"),
    show_default=True,
    help="Where the broker, the worker's files and life.json (samples, summary) go.",
)
def main(minutes: float, rate: float, out: Path) -> None:
    """One worker fed steadily for MINUTES: RSS and its stores' RocksDB memory every
    15 s (JSON lines), then the growth figures."""
    out.mkdir(parents=True, exist_ok=True)
    count = int(minutes * 60 * rate)
    with provide_broker(out / "broker") as bootstrap:
        env = fresh_env(bootstrap, out / "env")
        cluster = Cluster(env, "native")
        worker = cluster.start(0)
        cluster.wait_owned(3)
        plan = workload(runs=count // 10, proposals=count, seed=11)
        feeder = Feeder(env, signed_records(env, plan), rate)
        feeder.start()
        started, rows = time.monotonic(), []
        try:
            while feeder.is_alive():
                time.sleep(SAMPLE_S)
                memory, cached = worker_memory(worker.url, worker.headers)
                rss = rss_mb(worker.proc.pid)
                assert rss is not None, "the worker is gone"
                row = {"s": round(time.monotonic() - started), "rss": round(rss, 1)}
                row |= memory
                row["rss_less_rocksdb"] = round(row["rss"] - sum(memory.values()), 1)
                row["cached_snapshots"] = cached if cached is not None else -1
                rows.append(row)
                print(json.dumps(row), flush=True)
        finally:
            cluster.close()
    full = next((r["s"] for r in rows if r.get("block_cache", 0) >= BLOCK_CACHE_MB * 0.95), None)
    summary = {
        "minutes": minutes,
        "rate": rate,
        "block_cache_full_at_s": full,
        "rss_growth_after_warm_up": growth(rows, "rss", WARM_UP_S),
        "rss_less_rocksdb_growth_after_warm_up": growth(rows, "rss_less_rocksdb", WARM_UP_S),
        # None when the cache never filled: there is no "after" to judge.
        "rss_growth_after_block_cache_full": None if full is None else growth(rows, "rss", full),
        "rss_less_rocksdb_growth_after_block_cache_full": (
            None if full is None else growth(rows, "rss_less_rocksdb", full)
        ),
    }
    (out / "life.json").write_text(json.dumps({"summary": summary, "samples": rows}, indent=1))
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
