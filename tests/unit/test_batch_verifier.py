"""A batch's Ed25519 signatures verified on threads beforehand give the decisions the
loop would have made alone, for every kind of bad signature mixed in."""

import random
from dataclasses import replace

import pytest

from benchmarks.records import RawRecord
from benchmarks.workload import Keys, lives
from processor.machines import builtin_machines
from processor.records.intake import Verified, authenticate
from processor.records.pipeline import Outcome, RunsInMemory, decide_record
from processor.runtimes.verifier import MIN_BATCH, BatchVerifier, Read
from processor.trust.keygen import generate_keyring, generate_keys
from processor.trust.keyring import Keyring
from processor.trust.signatures import HEADER_KEY_ID, HEADER_SIGNATURE, HEADER_SIGNED_AT, Algorithm

TOPIC = "t.proposals"
NOW_MS = 1_800_000_000_000


def _tampered(record: RawRecord, how: str, rng: random.Random) -> RawRecord:
    headers = {k: v.decode() if isinstance(v, bytes) else v for k, v in record.headers}
    if how == "value":  # signed, then changed
        return replace(record, value=(record.value or b"") + b" ")
    if how == "signature":
        signature = str(headers[HEADER_SIGNATURE])
        flipped = "0" if signature[-1] != "0" else "1"
        headers[HEADER_SIGNATURE] = signature[:-1] + flipped
    elif how == "unknown key":
        headers[HEADER_KEY_ID] = "nobody"
    elif how == "signed-at":
        headers[HEADER_SIGNED_AT] = "0" + str(headers[HEADER_SIGNED_AT])
    elif how == "not hex":
        headers[HEADER_SIGNATURE] = "XYZ"
    elif how == "no signature":
        del headers[HEADER_SIGNATURE]
    elif how == "twice":
        return replace(record, headers=[*record.headers, (HEADER_KEY_ID, "runtime")])
    return replace(record, headers=list(headers.items()))


KINDS = ["good"] * 6 + [
    "value",
    "signature",
    "unknown key",
    "signed-at",
    "not hex",
    "no signature",
    "twice",
]


def _batch(seed: int) -> tuple[list[RawRecord], Keyring]:
    rng = random.Random(seed)
    keyring, signers = generate_keys(Algorithm.ED25519)
    keyring = keyring.model_copy(update={"signature_max_age_ms": 10**12})
    plain = lives(Keys.generate(Algorithm.HMAC_SHA256), 20, 200, seed)
    records = []
    for record in plain:
        raw = dict(record.headers)[HEADER_KEY_ID]
        key_id = raw.decode() if isinstance(raw, bytes) else str(raw)
        headers = signers[key_id].headers(TOPIC, record.key, record.value or b"", NOW_MS)
        records.append(_tampered(replace(record, headers=headers), rng.choice(KINDS), rng))
    return records, keyring


def _messages(records: list[RawRecord]) -> list[Read]:
    return [(r.key, r.value, r.headers) for r in records]


@pytest.mark.parametrize("seed", range(5))
def test_decisions_are_the_same_with_the_batch_verified_beforehand(seed: int) -> None:
    records, keyring = _batch(seed)
    verifier = BatchVerifier()
    try:
        verified = verifier.verify(TOPIC, _messages(records), keyring)
    finally:
        verifier.close()
    assert True in verified.values() and False in verified.values()
    machines = builtin_machines()
    alone, helped = RunsInMemory(), RunsInMemory()

    def decide(runs: RunsInMemory, record: RawRecord, known: Verified | None) -> Outcome:
        return decide_record(
            record.key,
            record.value,
            record.headers,
            NOW_MS,
            topic=TOPIC,
            keyring=keyring,
            machines=machines,
            lookup=runs.lookup,
            seen=runs.seen,
            placement=None,
            verified=known,
        )

    for record in records:
        first, second = decide(alone, record, None), decide(helped, record, verified)
        assert first == second
        alone.apply(first)
        helped.apply(second)
        value = record.value or b""
        assert authenticate(TOPIC, record.key, value, record.headers, keyring, NOW_MS) == (
            authenticate(TOPIC, record.key, value, record.headers, keyring, NOW_MS, verified)
        )


def test_hmac_keyrings_and_small_batches_are_left_to_the_loop() -> None:
    records, keyring = _batch(0)
    verifier = BatchVerifier()
    try:
        assert verifier.verify(TOPIC, _messages(records), generate_keyring()) == {}
        assert verifier.verify(TOPIC, _messages(records[: MIN_BATCH - 1]), keyring) == {}
    finally:
        verifier.close()


def test_a_failure_beforehand_leaves_the_signatures_to_the_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    records, keyring = _batch(1)

    def broken(public_key: str, base: bytes, signature: str) -> bool:
        raise RuntimeError("a bug")

    monkeypatch.setattr("processor.runtimes.verifier.verify_ed25519", broken)
    verifier = BatchVerifier()
    try:
        assert verifier.verify(TOPIC, _messages(records), keyring) == {}
    finally:
        verifier.close()
