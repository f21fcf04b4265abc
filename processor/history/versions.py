"""Machine versions as every worker and auditor sees them: a compacted machines topic,
keyed `<name>@<version>`, each value the version's spec as JSON, signed by an operator.

A machine version is operator authority: a record on the topic takes effect only when
an operator's key (keyring `"operator": true`) signed it, the way a proposal is signed
(`processor.trust.signatures.signed_base` over the machines topic, the record's key and value,
the key id and the signing time; the same three headers). The key must be valid when
the record was appended (validity window, revocation); a signature's age does not
count, since versions are read years after they were published. Versions this process
holds from its own package or files (the built-in machines, their earlier versions in
`processor/machines/history/`, `--machine-path` files) need no signature: they are the
deployed code.

`runstate machines publish` signs and publishes versions with an operator's key; a
worker does the same for its machine files when it starts, if it is given one. A worker
reads every version on the topic when it starts, so that runs pinned to an older version
keep being decided by it after a deploy, by any worker; a record it does not accept (not
a machine, content that does not hash to its key, unsigned, badly signed, not an
operator's key) is logged at ERROR and set aside on the DLQ with the reason, never used.
`verify`, `replay` and `get --at` read the topic by the same rule.
"""

import logging
import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import KafkaException, Message, Producer
from pydantic import ValidationError

from processor.engine.machine import Catalog, Machine, MachineInvalid, compile_machine
from processor.kafka.config import KafkaSettings
from processor.kafka.readback import read_topics
from processor.kafka.topics import TopicNames
from processor.machines import load_catalog
from processor.records.intake import Headers, TimestampType, Unproven, authenticate, header_value
from processor.records.outputs import dead_letter_value, output_key
from processor.runtimes.errors import WorkerError
from processor.trust.keyring import Keyring, KeyringError, SigningKey, load_signing_key
from processor.trust.signatures import HEADER_KEY_ID, RecordHeaders, ed25519_public_key
from schemas.machine import MachineSpec

log = logging.getLogger("runstate.versions")

#: How a machine version is signed, for the errors that say what to do next.
SIGN_HINT = (
    "publish it with an operator's key (`runstate machines publish --signing-key-file "
    "<operator key>`)"
)
#: A signature on a machine version does not age out: it is read for as long as runs are
#: pinned to the version.
_AGELESS_MS = 2**62


def version_key(machine: Machine) -> bytes:
    return f"{machine.name}@{machine.version}".encode()


@dataclass(frozen=True)
class RefusedVersion:
    """A machines-topic record that does not take effect, and why."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int
    reason: str

    def __str__(self) -> str:
        name = (self.key or b"").decode(errors="replace")[:80]
        return f"machines topic offset {self.offset} ('{name}'): {self.reason}"


@dataclass
class TopicVersions:
    """What the machines topic holds, as this keyring and these local versions see it."""

    accepted: list[Machine] = field(default_factory=list)
    #: `<name>@<version>` of the accepted versions that carry an operator's signature.
    signed: set[bytes] = field(default_factory=set)
    refused: list[RefusedVersion] = field(default_factory=list)


def check_version(
    topic: str,
    key: bytes | None,
    value: bytes,
    headers: Headers,
    appended_at_ms: int,
    keyring: Keyring | None,
    held: Collection[bytes] = (),
    timestamp_type: TimestampType = TimestampType.LOG_APPEND_TIME,
) -> tuple[Machine, bool] | str:
    """The machine a machines-topic record publishes and whether an operator signed it,
    or why it does not take effect. `held`: the `<name>@<version>` this process holds
    from its package and files, which take effect unsigned. No keyring: only those.
    `timestamp_type`: who set `appended_at_ms`; a key's validity and revocation are
    judged by the broker's time only (a producer's own time would let a revoked key
    backdate its record)."""
    try:
        machine = compile_machine(MachineSpec.model_validate_json(value))
    except (ValidationError, MachineInvalid) as exc:
        return f"not a machine: {exc}"
    if version_key(machine) != key:
        return (
            f"holds version {machine.version} of '{machine.name}', not what its key says "
            "(a version is the digest of its content)"
        )
    unsigned = _not_an_operators(topic, key, value, headers, appended_at_ms, keyring, machine)
    if unsigned is None and timestamp_type is not TimestampType.LOG_APPEND_TIME:
        unsigned = (
            f"its time is not the broker's ({timestamp_type.value}): a revoked key could "
            "date its record before its revocation; set message.timestamp.type="
            f"LogAppendTime on the machines topic, then publish again ({SIGN_HINT})"
        )
    if unsigned is None:
        return machine, True
    return (machine, False) if key in held else unsigned


def _not_an_operators(
    topic: str,
    key: bytes,
    value: bytes,
    headers: Headers,
    appended_at_ms: int,
    keyring: Keyring | None,
    machine: Machine,
) -> str | None:
    """Why the record does not carry a valid operator's signature for `machine`, or None."""
    if keyring is None:
        return f"no keyring to check its signature with: give --keyring-file; {SIGN_HINT}"
    credential = authenticate(topic, key, value, headers, _ageless(keyring), appended_at_ms)
    if isinstance(credential, Unproven):
        return f"{credential.why}; a machine version takes effect only signed: {SIGN_HINT}"
    scope, principal = credential.scope, credential.principal
    if scope is None or not scope.operator:
        raw = header_value(headers, HEADER_KEY_ID)
        key_id = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
        return (
            f"signed by key '{key_id}' ({principal.authority}, {principal.source}), which "
            f"is not an operator's key: {SIGN_HINT}"
        )
    if scope.machines is not None and machine.name not in scope.machines:
        return (
            f"operator key '{scope.key_id}' is limited to machines "
            f"{', '.join(sorted(scope.machines)) or '(none)'}, not '{machine.name}'"
        )
    return None


def _ageless(keyring: Keyring) -> Keyring:
    return keyring.model_copy(update={"signature_max_age_ms": _AGELESS_MS})


def sort_versions(
    topic: str, messages: Iterable[Message], keyring: Keyring | None, held: Collection[bytes]
) -> TopicVersions:
    """Every record of the machines topic, in order, checked (`check_version`). A
    tombstone drops its version; a refused record does not undo an accepted one (its
    content is the same version or no machine at all). Refusals of records a later
    accepted one of the same key supersedes (an unsigned copy, then an operator's
    publish) are not reported: compaction removes them."""
    accepted: dict[bytes, Machine] = {}
    signed: set[bytes] = set()
    refused: list[tuple[RefusedVersion, int]] = []
    last_accepted: dict[bytes, int] = {}
    for index, msg in enumerate(messages):
        key, value = msg.key(), msg.value()
        if value is None:
            accepted.pop(key or b"", None)
            signed.discard(key or b"")
            continue
        kind, at_ms = msg.timestamp()
        checked = check_version(
            topic,
            key,
            value,
            msg.headers(),
            at_ms,
            keyring,
            held,
            TimestampType.of_librdkafka(kind),
        )
        if isinstance(checked, str):
            where = RefusedVersion(
                msg.partition() or 0, msg.offset() or 0, key, value, msg.timestamp()[1], checked
            )
            refused.append((where, index))
            continue
        machine, is_signed = checked
        accepted[key or b""] = machine
        last_accepted[key or b""] = index
        if is_signed:
            signed.add(key or b"")
    reported = [r for r, index in refused if last_accepted.get(r.key or b"", -1) < index]
    return TopicVersions(list(accepted.values()), signed, reported)


def read_versions(
    settings: KafkaSettings, topic: str, keyring: Keyring | None, held: Collection[bytes]
) -> TopicVersions:
    """The machines topic, checked (an empty one when there is none)."""
    try:
        messages = list(read_topics(settings, [topic]))
    except KafkaException as exc:
        log.warning("machines topic %s not read (%s): only local machine files", topic, exc)
        return TopicVersions()
    return sort_versions(topic, messages, keyring, held)


def published(settings: KafkaSettings, topic: str) -> list[Machine]:
    """Every machine version on the machines topic as published, signed or not (what
    `runstate machines versions` lists); unchecked: never a catalog's source."""
    found: dict[bytes, Machine] = {}
    try:
        messages = list(read_topics(settings, [topic]))
    except KafkaException as exc:
        log.warning("machines topic %s not read (%s)", topic, exc)
        return []
    for msg in messages:
        key, value = msg.key() or b"", msg.value()
        if value is None:
            found.pop(key, None)
            continue
        try:
            machine = compile_machine(MachineSpec.model_validate_json(value))
        except (ValidationError, MachineInvalid):
            continue
        if version_key(machine) == key:
            found[key] = machine
    return list(found.values())


def operator_key(keyring: Keyring, signing: SigningKey) -> SigningKey:
    """`signing`, checked to be an operator's key of `keyring` that verifies there (so
    that what it signs takes effect); a WorkerError saying what to do otherwise."""
    entry = keyring.keys.get(signing.key_id)
    if entry is None or not entry.operator:
        raise WorkerError(
            f"key '{signing.key_id}' is not an operator's key in the keyring: machine "
            "versions it signed would be refused; add one (`runstate keys add KEY_ID "
            '--operator ...`) or mark the key `"operator": true`'
        )
    if entry.public_key is not None and (
        signing.private_key is None or ed25519_public_key(signing.private_key) != entry.public_key
    ):
        raise WorkerError(
            f"the signing key '{signing.key_id}' does not match its public key in the keyring"
        )
    if entry.secret is not None and signing.secret != entry.secret:
        raise WorkerError(
            f"the signing key '{signing.key_id}' does not match its secret in the keyring"
        )
    return signing


def load_operator_key(keyring: Keyring, key_id: str | None, key_file: Path | None) -> SigningKey:
    """The operator's key from `key_file`, or the HMAC key `key_id` of the keyring."""
    try:
        if key_file is not None:
            signing = load_signing_key(key_file)
        else:
            assert key_id is not None
            entry = keyring.keys.get(key_id)
            if entry is None:
                raise WorkerError(
                    f"no key '{key_id}' in the keyring; have: {', '.join(sorted(keyring.keys))}"
                )
            if entry.secret is None:
                raise WorkerError(
                    f"key '{key_id}' is {entry.algorithm}: the keyring holds only its public "
                    "key; give its signing key file"
                )
            signing = SigningKey.hmac(key_id, entry.secret)
    except KeyringError as exc:
        raise WorkerError(str(exc)) from exc
    return operator_key(keyring, signing)


def publish(
    settings: KafkaSettings,
    topic: str,
    machines: Iterable[Machine],
    signer: SigningKey,
    keyring: Keyring,
    held: Collection[bytes] = (),
) -> list[str]:
    """Sign and publish the versions no operator has signed on the topic yet; returns
    the `<name>@<version>` published."""
    operator_key(keyring, signer)
    signed = read_versions(settings, topic, keyring, held).signed
    fresh = [m for m in machines if version_key(m) not in signed]
    if fresh:
        _produce(settings, topic, [_signed_record(topic, m, signer) for m in fresh])
    return [version_key(m).decode() for m in fresh]


def _signed_record(
    topic: str, machine: Machine, signer: SigningKey
) -> tuple[bytes | None, bytes, RecordHeaders]:
    key = version_key(machine)
    value = machine.spec.model_dump_json(by_alias=True).encode()
    return key, value, signer.headers(topic, key, value, int(time.time() * 1000))


def _produce(
    settings: KafkaSettings,
    topic: str,
    records: list[tuple[bytes | None, bytes, RecordHeaders]],
) -> None:
    producer = Producer(settings.client({"enable.idempotence": True, "acks": "all"}))
    meta = producer.list_topics(topic, timeout=30).topics.get(topic)
    if meta is None or meta.error is not None:
        raise WorkerError(
            f"topic {topic} does not exist: nothing can be published to it; run "
            "`runstate topics create`"
        )
    failed: list[str] = []
    for key, value, headers in records:
        producer.produce(
            topic,
            value,
            key,
            headers=headers,
            on_delivery=lambda err, _msg: failed.append(str(err)) if err else None,
        )
    if producer.flush(30) or failed:
        raise WorkerError(f"records not delivered to {topic} within 30 s: {failed or 'timed out'}")


def held_versions(catalog: Catalog) -> frozenset[bytes]:
    """`<name>@<version>` of every version a local catalog holds."""
    return frozenset(f"{name}@{version}".encode() for name, version in catalog.versions)


def trusted_catalog(
    paths: Iterable[Path],
    settings: KafkaSettings,
    topic: str,
    keyring: Keyring | None,
) -> tuple[Catalog, TopicVersions]:
    """The machine files (and built-ins, with their earlier versions) as the versions
    new runs get, with every version the machines topic holds that takes effect, for the
    runs pinned to them; and what the topic holds, refusals included."""
    local = load_catalog(paths)
    held = held_versions(local)
    found = read_versions(settings, topic, keyring, held)
    return load_catalog(paths, older=found.accepted), found


def deployed_catalog(
    paths: Iterable[Path],
    settings: KafkaSettings,
    topics: TopicNames,
    keyring: Keyring,
    signer: SigningKey | None = None,
) -> Catalog:
    """A worker's catalog at start (`trusted_catalog`). With an operator's key
    (`signer`), its local versions no operator has signed on the topic yet are signed
    and published first, for every other worker and auditor. Every refused record is
    logged at ERROR and set aside on the DLQ with its reason."""
    local = load_catalog(paths)
    held = held_versions(local)
    if signer is not None:
        fresh = publish(settings, topics.machines, local.values(), signer, keyring, held)
        if fresh:
            log.info("published machine versions %s, signed by '%s'", fresh, signer.key_id)
    found = read_versions(settings, topics.machines, keyring, held)
    if found.refused:
        for refusal in found.refused:
            log.error("machine version refused, not used: %s", refusal)
        _produce(settings, topics.dlq, [_dead_letter(topics.machines, r) for r in found.refused])
    return load_catalog(paths, older=found.accepted)


def _dead_letter(topic: str, refused: RefusedVersion) -> tuple[bytes | None, bytes, RecordHeaders]:
    key = output_key(refused.key)
    value = dead_letter_value(
        topic,
        refused.partition,
        refused.offset,
        refused.key,
        refused.value,
        f"machine version refused: {refused.reason}",
        refused.timestamp_ms,
    )
    return key, value, []
