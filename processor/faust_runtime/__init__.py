"""The Faust runtime (`runstate worker --runtime faust`)."""

from confluent_kafka.admin import AdminClient

from processor.config import WorkerConfig
from processor.errors import WorkerError


def run_faust_worker(config: WorkerConfig, http_port: int, log_level: str = "info") -> None:
    """Run the Faust app until SIGTERM/SIGINT (Faust's worker handles the signals)."""
    import faust

    from processor.faust_runtime.app import build_app
    from processor.faust_runtime.kafka import faust_kafka_settings

    faust_kafka_settings(config.kafka.client_config)  # refuses what Faust cannot take, first
    meta = AdminClient(config.kafka.client()).list_topics(config.topics.proposals, timeout=30)
    topic = meta.topics.get(config.topics.proposals)
    if topic is None or topic.error is not None:
        raise WorkerError(
            f"topic {config.topics.proposals} does not exist; run `runstate topics create`"
        )
    app = build_app(config, len(topic.partitions), http_port)
    worker = faust.Worker(app, loglevel=log_level.upper(), quiet=True, redirect_stdouts=False)
    worker.execute_from_commandline()
