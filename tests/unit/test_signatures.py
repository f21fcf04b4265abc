"""Properties of the signature: it verifies only over the very record, topic and time
it was made for, and only while fresh, for both algorithms."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from processor.records.intake import Credential, Unproven, authenticate
from processor.trust.keyring import Keyring, SigningKey
from processor.trust.signatures import HEADER_SIGNED_AT, ed25519_public_key
from schemas.codes import RejectionCode
from tests.examples import examples

pytestmark = pytest.mark.unit

SEED = "11" * 32
SIGNERS = [
    SigningKey(key_id="ed", algorithm="ed25519", private_key=SEED),
    SigningKey.hmac("mac", "a-shared-secret-of-some-length"),
]
KEYRING = Keyring.model_validate(
    {
        "keys": {
            "ed": {
                "algorithm": "ed25519",
                "public_key": ed25519_public_key(SEED),
                "source": "s",
                "authority": "a",
            },
            "mac": {"secret": "a-shared-secret-of-some-length", "source": "s", "authority": "a"},
        },
        "signature_max_age_ms": 60_000,
        "clock_skew_ms": 5_000,
    }
)
topics = st.from_regex(r"[a-z][a-z0-9._-]{0,30}", fullmatch=True)


def _flip(data: bytes, at: int, bit: int) -> bytes:
    if not data:
        return b"\x00"
    i = at % len(data)
    return data[:i] + bytes([data[i] ^ (1 << bit)]) + data[i + 1 :]


@settings(max_examples=examples(300), deadline=None)
@given(
    signer=st.sampled_from(SIGNERS),
    topic=topics,
    key=st.binary(max_size=40),
    value=st.binary(max_size=200),
    signed_at=st.integers(0, 2**45),
    age=st.integers(-10_000, 120_000),
    what=st.sampled_from(["none", "topic", "key", "value", "time"]),
    at=st.integers(0, 10_000),
    bit=st.integers(0, 7),
)
def test_a_signature_holds_for_its_record_only_and_only_while_fresh(
    signer: SigningKey,
    topic: str,
    key: bytes,
    value: bytes,
    signed_at: int,
    age: int,
    what: str,
    at: int,
    bit: int,
) -> None:
    headers = signer.headers(topic, key, value, signed_at)
    appended = signed_at + age
    if what == "topic":
        topic = topic + "x"
    elif what == "key":
        key = _flip(key, at, bit)
    elif what == "value":
        value = _flip(value, at, bit)
    elif what == "time":
        headers = [
            (h, str(signed_at + 1).encode() if h == HEADER_SIGNED_AT else v) for h, v in headers
        ]
    outcome = authenticate(topic, key, value, headers, KEYRING, appended)
    if what != "none":
        assert isinstance(outcome, Unproven) and outcome.code is RejectionCode.UNAUTHENTICATED
    elif age > KEYRING.signature_max_age_ms or -age > KEYRING.clock_skew_ms:
        assert isinstance(outcome, Unproven) and outcome.code is RejectionCode.STALE_SIGNATURE
    else:
        assert isinstance(outcome, Credential), outcome
