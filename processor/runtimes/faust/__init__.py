"""The Faust runtime (`runstate worker --runtime faust`)."""

from pathlib import Path

from confluent_kafka.admin import AdminClient

from processor.runtimes import identity
from processor.runtimes.errors import WorkerError
from processor.runtimes.native.preflight import learn_limits
from processor.runtimes.settings import WorkerConfig


def datadir_of(config: WorkerConfig) -> Path:
    """Where the Faust runtime keeps its tables (RocksDB) and their identity."""
    return Path(config.settings.state_dir) / config.settings.group_id / "faust"


def run_faust_worker(
    config: WorkerConfig, http_port: int, log_level: str = "info", advertised_url: str | None = None
) -> None:
    """Run the Faust app until SIGTERM/SIGINT (Faust's worker handles the signals). Logging
    is the caller's (`processor.observe.logs.setup_logging`): Faust's worker leaves it alone."""
    from processor.runtimes.faust.app import FaustWorker, StackDumpingWorker
    from processor.runtimes.faust.kafka import faust_kafka_settings

    faust_kafka_settings(config.kafka.client_config)  # refuses what Faust cannot take, first
    meta = AdminClient(config.kafka.client()).list_topics(config.topics.proposals, timeout=30)
    topic = meta.topics.get(config.topics.proposals)
    if topic is None or topic.error is not None:
        raise WorkerError(
            f"topic {config.topics.proposals} does not exist; run `runstate topics create`"
        )
    partitions = len(topic.partitions)
    # Tables restored from other topics (deleted and created again) are discarded; a
    # changed partition count stops the worker (see processor/runtimes/identity.py).
    datadir = datadir_of(config)
    found = identity.current(AdminClient(config.kafka.client()), config.topics, partitions)
    kept = [p for p in datadir.glob("*") if p.name != identity.FILE] if datadir.exists() else []
    identity.reconcile(datadir, found, kept)
    # What each topic takes, as the native worker learns it: the same commits refused
    # state_too_large, the same outputs cut to fit.
    limits = learn_limits(AdminClient(config.kafka.client()), config.kafka, config.topics)
    app = FaustWorker(config, partitions, http_port, advertised_url, limits).app
    # override_logging=False: Faust would replace the root logger's handlers with its own
    # (colour, its format), and --log-format json would be lost.
    worker = StackDumpingWorker(
        app,
        loglevel=log_level.upper(),
        quiet=True,
        redirect_stdouts=False,
        override_logging=False,
    )
    # Faust's startup spinner writes terminal escapes with no newline to stdout (a file
    # too, not only a terminal); the next log line then began with them and was no
    # longer a JSON object. Without it, Faust logs "Ready" instead.
    worker.spinner = None
    worker.execute_from_commandline()
