"""Machine versions as every worker and auditor sees them: a compacted machines topic,
keyed `<name>@<version>`, each value the version's spec as JSON.

A worker publishes the versions it was deployed with (its machine files) when it
starts, and reads every version published before, so that runs pinned to an older
version keep being decided by it after a deploy, by any worker; `verify`, `replay` and
`get --at` read the same topic. `runstate machines publish` publishes files ahead of a
deploy. A record whose content does not hash to the version in its key is ignored (and
named in the log): a version is its content.
"""

import logging
from collections.abc import Iterable
from pathlib import Path

from confluent_kafka import KafkaException, Producer
from pydantic import ValidationError

from processor.config import KafkaSettings
from processor.engine.machine import Catalog, Machine, MachineInvalid, compile_machine
from processor.errors import WorkerError
from processor.machines import load_catalog
from processor.readback import read_topics
from schemas.machine import MachineSpec

log = logging.getLogger("runstate.versions")


def version_key(machine: Machine) -> bytes:
    return f"{machine.name}@{machine.version}".encode()


def published(settings: KafkaSettings, topic: str) -> list[Machine]:
    """Every machine version on the machines topic (an empty list when there is none)."""
    found: dict[bytes, Machine] = {}
    try:
        messages = list(read_topics(settings, [topic]))
    except KafkaException as exc:
        log.warning("machines topic %s not read (%s): only local machine files", topic, exc)
        return []
    for msg in messages:
        key, value = msg.key() or b"", msg.value()
        if value is None:
            found.pop(key, None)
            continue
        try:
            machine = compile_machine(MachineSpec.model_validate_json(value))
        except (ValidationError, MachineInvalid) as exc:
            log.error("machines topic: %r is not a machine, ignored: %s", key[:80], exc)
            continue
        if version_key(machine) != key:
            log.error(
                "machines topic: %r holds version %s of '%s', not what its key says; ignored",
                key[:80],
                machine.version,
                machine.name,
            )
            continue
        found[key] = machine
    return list(found.values())


def publish(settings: KafkaSettings, topic: str, machines: Iterable[Machine]) -> list[str]:
    """Publish versions not yet on the topic; returns the `<name>@<version>` published."""
    known = {version_key(m) for m in published(settings, topic)}
    fresh = [m for m in machines if version_key(m) not in known]
    if fresh:
        _produce(settings, topic, fresh)
    return [version_key(m).decode() for m in fresh]


def _produce(settings: KafkaSettings, topic: str, machines: list[Machine]) -> None:
    producer = Producer(settings.client({"enable.idempotence": True, "acks": "all"}))
    meta = producer.list_topics(topic, timeout=30).topics.get(topic)
    if meta is None or meta.error is not None:
        raise WorkerError(
            f"topic {topic} does not exist: machine versions cannot be published; run "
            "`runstate topics create`"
        )
    failed: list[str] = []
    for machine in machines:
        value = machine.spec.model_dump_json(by_alias=True).encode()
        producer.produce(
            topic,
            value,
            version_key(machine),
            on_delivery=lambda err, _msg: failed.append(str(err)) if err else None,
        )
    if producer.flush(30) or failed:
        raise WorkerError(
            f"machine versions not delivered to {topic} within 30 s: {failed or 'timed out'}"
        )


def deployed_catalog(
    paths: Iterable[Path], settings: KafkaSettings, topic: str, *, publish_local: bool = True
) -> Catalog:
    """The machine files (and built-ins) as the versions new runs get, with every version
    on the machines topic for the runs pinned to them; the local versions are published
    first (a worker does, so that every other worker and auditor holds them too)."""
    local = load_catalog(paths)
    known = published(settings, topic)
    if publish_local:
        held = {version_key(m) for m in known}
        fresh = [m for m in local.values() if version_key(m) not in held]
        if fresh:
            _produce(settings, topic, fresh)
            log.info("published machine versions %s", [version_key(m).decode() for m in fresh])
    return load_catalog(paths, older=known)
