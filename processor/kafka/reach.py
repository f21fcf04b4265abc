"""Whether Kafka answers at the configured address, asked once with a bound: a command
given a wrong address says so in one line within seconds, with what librdkafka last
complained of, instead of retrying for a minute behind a wall of log lines."""

import logging

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from processor.kafka.config import KAFKA_LOG, KafkaSettings

#: How long a command waits for Kafka's first answer: a broker that answers at all
#: answers a metadata request in well under a second.
REACH_S = 5.0


class KafkaUnreachable(ConnectionError):
    """No broker at the configured address answered within the bound."""


class KafkaSettingsRefused(ValueError):
    """librdkafka refused a setting (-X, RUNSTATE_KAFKA_*) before any connection."""


class _Last(logging.Handler):
    """Keeps librdkafka's last complaint."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.last: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        self.last = record.getMessage()


def reach(settings: KafkaSettings, within_s: float = REACH_S) -> None:
    """Return once a broker of `settings` answered a metadata request; KafkaUnreachable
    after `within_s` without one, naming the address and librdkafka's last complaint."""
    heard = _Last()
    logger = KAFKA_LOG.getChild("reach")
    logger.setLevel(logging.WARNING)  # whatever the application does with KAFKA_LOG
    logger.propagate = False  # a failed attempt is said once, in the error
    logger.addHandler(heard)
    try:
        try:
            admin = AdminClient(settings.client({"logger": logger}))
        except KafkaException as exc:
            raise KafkaSettingsRefused(
                f"the Kafka client refused its settings: {exc.args[0] if exc.args else exc}; "
                "check the -X settings (RUNSTATE_KAFKA_*)"
            ) from None
        admin.list_topics(timeout=within_s)
    except KafkaException as exc:
        admin.poll(0)  # hands over the log lines queued meanwhile
        raise KafkaUnreachable(unreachable(settings, within_s, heard.last or str(exc))) from exc
    finally:
        logger.removeHandler(heard)


def unreachable(settings: KafkaSettings, within_s: float, why: str) -> str:
    """What a person reads when Kafka did not answer: where, why, and what to do."""
    why = why.split("]: ", 1)[-1]  # librdkafka's thread prefix says nothing to a reader
    return (
        f"Kafka did not answer at {settings.bootstrap_servers} within {within_s:g} s "
        f"({why}). Is the broker running there? Give its address with --bootstrap-servers "
        "or RUNSTATE_BOOTSTRAP_SERVERS (and any security settings with -X or "
        "RUNSTATE_KAFKA_*)."
    )
