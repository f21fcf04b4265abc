"""docs/vectors match the product, and their values hold by independent means."""

import hashlib
import hmac
import json

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from tests.vectors import VECTORS, render

pytestmark = pytest.mark.unit


def _load(name: str) -> object:
    return json.loads((VECTORS / name).read_text(encoding="utf-8"))


def test_vector_files_match_the_product() -> None:
    for name, text in render().items():
        assert (VECTORS / name).read_text(encoding="utf-8") == text, (
            f"docs/vectors/{name} is out of date: run `python -m tests.vectors` and commit it"
        )


def test_signature_vectors_verify_independently() -> None:
    data = _load("signatures.json")
    assert isinstance(data, dict)
    keys = {k["key_id"]: k for k in data["signing_keys"]}
    for case in data["cases"]:
        base = "\n".join(
            [
                "runstate-proposal-v1",
                case["topic"],
                case["key_id"],
                str(case["signed_at"]),
                hashlib.sha256(case["key"].encode()).hexdigest(),
                hashlib.sha256(case["value"].encode()).hexdigest(),
            ]
        ).encode()
        assert base.decode() == case["signed_base"]
        key = keys[case["key_id"]]
        if case["algorithm"] == "hmac-sha256":
            expected = hmac.new(key["secret"].encode(), base, hashlib.sha256).hexdigest()
            assert case["signature"] == expected
        else:
            from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

            private = Ed25519PrivateKey.from_private_bytes(bytes.fromhex(key["private_key"]))
            public: Ed25519PublicKey = private.public_key()
            public.verify(bytes.fromhex(case["signature"]), base)  # raises when wrong


def test_chain_vectors_hash_their_canonical_text() -> None:
    data = _load("chain.json")
    assert isinstance(data, dict)
    previous = ""
    for entry in data["transitions"]:
        assert hashlib.sha256(entry["canonical"].encode()).hexdigest() == entry["hash"]
        assert entry["transition"]["hash"] == entry["hash"]
        assert entry["transition"]["prev_hash"] == previous
        previous = entry["hash"]
