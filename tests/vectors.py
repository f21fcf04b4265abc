"""Conformance vectors for docs/wire.md: `python -m tests.vectors` writes docs/vectors/.

Every expected value comes from the product's own functions (partition_for, the signed
base, SigningKey, authenticate, parse_keyring, verify_ed25519, decide_record,
transition_hash); a unit test checks the files match (drift) and checks the values by
independent means too (hashlib, hmac, cryptography, tests/ed25519_ref.py, libsodium
where it is installed). A second implementation reads the same files.
"""

import json
from pathlib import Path
from typing import Any

from processor.intake import Credential, authenticate
from processor.keyring import Keyring, KeyringError, SigningKey, parse_keyring
from processor.machines import builtin_machines
from processor.partitioning import murmur2, partition_for
from processor.pipeline import RunsInMemory, decide_record
from processor.signatures import ed25519_public_key, ed25519_signature, signed_base, verify_ed25519
from schemas.audit import canonical_values
from schemas.messages import Transition
from tests import ed25519_ref as ref

ROOT = Path(__file__).resolve().parents[1]
VECTORS = ROOT / "docs" / "vectors"
TOPIC = "runstate.proposals"
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z

#: Fixed keys: test vectors only, never for use.
ED25519_SEED = bytes(range(32)).hex()
HMAC_SECRET = "0123456789abcdef0123456789abcdef"
AGENT = SigningKey(key_id="agent-1", algorithm="ed25519", private_key=ED25519_SEED)
HMAC_AGENT = SigningKey.hmac("agent-hmac", HMAC_SECRET)
KEYRING = Keyring.model_validate(
    {
        "keys": {
            "agent-1": {
                "algorithm": "ed25519",
                "public_key": ed25519_public_key(ED25519_SEED),
                "source": "runtime",
                "authority": "runtime",
            },
            "agent-hmac": {
                "algorithm": "hmac-sha256",
                "secret": HMAC_SECRET,
                "source": "runtime",
                "authority": "runtime",
            },
            "revoked-1": {
                "algorithm": "ed25519",
                "public_key": ed25519_public_key(ED25519_SEED),
                "source": "runtime",
                "authority": "runtime",
                "revoked_at_ms": T0 + 60_000,
            },
        },
        "signature_max_age_ms": 300_000,
        "clock_skew_ms": 30_000,
    }
)


def _proposal(run_id: str, pid: str, event: str, **fields: Any) -> bytes:
    return json.dumps(
        {"run_id": run_id, "proposal_id": pid, "event": event, **fields},
        ensure_ascii=False,
        separators=(",", ":"),
    ).encode()


def partitions() -> list[dict[str, Any]]:
    keys = ["doc-42", "run-1", "r", "", "team-a/run-0001", "ünïcödé-run", "😀", "x" * 300]
    return [
        {
            "key": key,
            "key_hex": key.encode().hex(),
            "murmur2": murmur2(key.encode()),
            "partition": {str(n): partition_for(key, n) for n in (1, 2, 3, 6, 12, 100)},
        }
        for key in keys
    ]


def signatures() -> dict[str, Any]:
    cases = []
    records = [
        (AGENT, "run-1", _proposal("run-1", "p1", "create", payload={"machine": "run_state"})),
        (HMAC_AGENT, "run-1", _proposal("run-1", "p2", "start")),
        (AGENT, "ünï-😀", _proposal("ünï-😀", "p3", "start", metadata={"note": "<é>"})),
        (AGENT, "run-2", b'{ "run_id" : "run-2", "proposal_id": "p4", "event": "start" }'),
    ]
    for signer, run_id, value in records:
        key = run_id.encode()
        base = signed_base(TOPIC, key, value, signer.key_id, T0)
        cases.append(
            {
                "algorithm": signer.algorithm,
                "key_id": signer.key_id,
                "topic": TOPIC,
                "key": run_id,
                "value": value.decode(),
                "signed_at": T0,
                "signed_base": base.decode(),
                "signature": signer.sign(base),
            }
        )
    return {
        "signing_keys": [
            AGENT.model_dump(mode="json", exclude_none=True),
            HMAC_AGENT.model_dump(mode="json", exclude_none=True),
        ],
        "cases": cases,
    }


def verifications() -> dict[str, Any]:
    """Records as a worker reads them (topic, key, value, headers, broker time) and
    whether they authenticate with KEYRING, with the code when not."""
    value = _proposal("run-1", "p1", "start")
    other = _proposal("run-1", "p1", "cancel", reason="user_requested")

    def headers(signer: SigningKey, at: int, k: bytes = b"run-1", v: bytes = value) -> Any:
        return signer.headers(TOPIC, k, v, at)

    revoked = AGENT.model_copy(update={"key_id": "revoked-1"})

    def resigned(signature: bytes) -> Any:
        """AGENT's headers for `value` at T0 with another Ed25519 signature."""
        return [
            (h, signature.hex().encode() if h == "runstate-signature" else v)
            for h, v in headers(AGENT, T0)
        ]

    base = signed_base(TOPIC, b"run-1", value, AGENT.key_id, T0)
    good = bytes.fromhex(AGENT.sign(base))
    s_plus_l = (int.from_bytes(good[32:], "little") + ref.L).to_bytes(32, "little")
    identity_r = ref.sign_with_identity_r(bytes.fromhex(ED25519_SEED), base)
    cases: list[tuple[str, str, bytes, bytes, Any, int]] = [
        ("ed25519, fresh", TOPIC, b"run-1", value, headers(AGENT, T0), T0 + 1_000),
        ("hmac, fresh", TOPIC, b"run-1", value, headers(HMAC_AGENT, T0), T0 + 1_000),
        ("at the max age", TOPIC, b"run-1", value, headers(AGENT, T0), T0 + 300_000),
        ("past the max age", TOPIC, b"run-1", value, headers(AGENT, T0), T0 + 300_001),
        ("ahead within the skew", TOPIC, b"run-1", value, headers(AGENT, T0), T0 - 30_000),
        ("ahead past the skew", TOPIC, b"run-1", value, headers(AGENT, T0), T0 - 30_001),
        ("another topic", "other.proposals", b"run-1", value, headers(AGENT, T0), T0),
        ("another run's key", TOPIC, b"run-2", value, headers(AGENT, T0), T0),
        ("altered value", TOPIC, b"run-1", other, headers(AGENT, T0), T0),
        (
            "unknown key id",
            TOPIC,
            b"run-1",
            value,
            headers(AGENT.model_copy(update={"key_id": "nobody"}), T0),
            T0,
        ),
        ("before revocation", TOPIC, b"run-1", value, headers(revoked, T0), T0 + 59_999),
        ("after revocation", TOPIC, b"run-1", value, headers(revoked, T0 + 60_000), T0 + 60_000),
        ("ed25519, S + L", TOPIC, b"run-1", value, resigned(good[:32] + s_plus_l), T0),
        ("ed25519, R the identity", TOPIC, b"run-1", value, resigned(identity_r), T0),
        (
            "no signed-at",
            TOPIC,
            b"run-1",
            value,
            [h for h in headers(AGENT, T0) if h[0] != "runstate-signed-at"],
            T0,
        ),
    ]
    out = []
    for name, topic, key, val, hdrs, appended in cases:
        result = authenticate(topic, key, val, hdrs, KEYRING, appended)
        out.append(
            {
                "name": name,
                "topic": topic,
                "key": key.decode(),
                "value": val.decode(),
                "headers": {h: (v.decode() if isinstance(v, bytes) else v) for h, v in hdrs},
                "appended_at": appended,
                "expect": "ok" if isinstance(result, Credential) else result.code.value,
            }
        )
    return {"keyring": KEYRING.model_dump(mode="json", exclude_none=True), "cases": out}


def _keyring_loads(public_key: str) -> bool:
    one = {"algorithm": "ed25519", "public_key": public_key, "source": "s", "authority": "a"}
    try:
        parse_keyring(json.dumps({"keys": {"k": one}}), "vector")
    except KeyringError:
        return False
    return True


def ed25519() -> dict[str, Any]:
    """The strict Ed25519 rule (docs/wire.md §4): which public keys a keyring refuses and
    which signatures verify. The refused inputs are made by tests/ed25519_ref.py, whose
    lax verifier (RFC 8032's equation alone, as OpenSSL checks it) accepts every
    signature below but the first three kinds' bad ones."""
    seed = bytes.fromhex(ED25519_SEED)
    good = ed25519_public_key(ED25519_SEED)
    torsion = ref.torsion_points()
    order_8 = next(t for t in torsion if ref.order(t) == 8)
    keys: list[tuple[str, str]] = [("the vectors' key (agent-1)", good)]
    for raw, order, form in ref.torsion_encodings():
        keys.append((f"a point of order {order}, {form}", raw.hex()))
    keys.append(
        (
            "mixed order: agent-1's point plus one of order 8",
            ref.mixed_order_key(seed, order_8).hex(),
        )
    )
    not_canonical = next(
        y + ref.P for y in range(2, 19) if ref.decode_lax(y.to_bytes(32, "little")) is not None
    )
    keys.append(
        ("y + p for a point not of small order", not_canonical.to_bytes(32, "little").hex())
    )
    off_curve = next(y for y in range(2, 100) if ref.decode_lax(y.to_bytes(32, "little")) is None)
    keys.append(("not on the curve", off_curve.to_bytes(32, "little").hex()))

    message = signed_base(TOPIC, b"run-1", _proposal("run-1", "p1", "start"), "agent-1", T0)
    signature = bytes.fromhex(ed25519_signature(ED25519_SEED, message))
    s_plus_l = int.from_bytes(signature[32:], "little") + ref.L
    sigs: list[tuple[str, str, bytes, bytes]] = [
        ("good", good, message, signature),
        ("S + L", good, message, signature[:32] + s_plus_l.to_bytes(32, "little")),
        (
            "R the identity, S = k*a (made by the key holder)",
            good,
            message,
            ref.sign_with_identity_r(seed, message),
        ),
        (
            "mixed-order key, made by the key holder",
            ref.mixed_order_key(seed, order_8).hex(),
            message,
            next(ref.sign_mixed(seed, order_8, message)),
        ),
    ]
    for raw, order, form in ref.torsion_encodings():
        for n in range(100):
            forged_message = message + f" {n}".encode()
            forged = ref.forge_small_order(raw, forged_message)
            if forged is not None:
                name = f"forged, S = 0, under a point of order {order} ({form})"
                sigs.append((name, raw.hex(), forged_message, forged))
                break
    return {
        "keys": [
            {"name": name, "public_key": key, "expect": "ok" if _keyring_loads(key) else "refused"}
            for name, key in keys
        ],
        "signatures": [
            {
                "name": name,
                "public_key": key,
                "message": msg.decode(),
                "signature": sig.hex(),
                "expect": "valid" if verify_ed25519(key, msg, sig.hex()) else "invalid",
            }
            for name, key, msg, sig in sigs
        ],
    }


def chain() -> dict[str, Any]:
    """A run's transitions as published, each with the canonical text that is hashed."""
    runs = RunsInMemory()
    machines = builtin_machines()
    run_id = "chain-ü-😀"
    steps = [
        ("create", {"payload": {"machine": "task_lifecycle"}}),
        (
            "start",
            {
                "metadata": {
                    "ratio": 1.0,
                    "tiny": 1e-7,
                    "big": 1e21,
                    "neg_zero": -0.0,
                    "third": 1 / 3,
                    "int": 9007199254740991,
                    "text": '<tag> & "quotes" \\ / \u2028 \u007f \u0001 é 😀',
                    "keys": {"\ue000": 1, "😀": 2, "a": 3, "B": 4, "é": 5},
                    "nested": [[], {}, [None, True, False]],
                }
            },
        ),
    ]
    transitions = []
    for n, (event, fields) in enumerate(steps):
        value = _proposal(run_id, f"p{n}", event, **fields)
        key = run_id.encode()
        at = T0 + n * 1_000
        outcome = decide_record(
            key,
            value,
            AGENT.headers(TOPIC, key, value, at),
            at,
            topic=TOPIC,
            keyring=KEYRING,
            machines=machines,
            lookup=runs.lookup,
            seen=runs.seen,
            placement=None,
        )
        runs.apply(outcome)
        transition = getattr(outcome, "transition", None)
        assert isinstance(transition, Transition), outcome
        published = json.loads(transition.model_dump_json())
        transitions.append(
            {
                "transition": published,
                "canonical": _canonical_text(transition),
                "hash": transition.hash,
            }
        )
    return {"transitions": transitions}


def _canonical_text(transition: Transition) -> str:
    from schemas.audit import canonical_text

    return canonical_text(canonical_values(transition.__dict__))


def render() -> dict[str, str]:
    files = {
        "partitions.json": partitions(),
        "signatures.json": signatures(),
        "verifications.json": verifications(),
        "chain.json": chain(),
        "ed25519.json": ed25519(),
    }
    return {
        name: json.dumps(data, indent=2, ensure_ascii=False) + "\n" for name, data in files.items()
    }


def main() -> None:
    VECTORS.mkdir(parents=True, exist_ok=True)
    for name, text in render().items():
        (VECTORS / name).write_text(text, encoding="utf-8")
        print(f"wrote docs/vectors/{name}")


if __name__ == "__main__":
    main()
