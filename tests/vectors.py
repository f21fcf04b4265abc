"""Conformance vectors for docs/wire.md: `python -m tests.vectors` writes docs/vectors/.

Every expected value comes from the product's own functions (partition_for, the signed
base, SigningKey, authenticate, parse_keyring, verify_ed25519, decide_record,
transition_hash, proposal_digest, decide, the scope's prefix rule); a unit test checks the files match (drift) and checks the values by
independent means too (hashlib, hmac, cryptography, tests/ed25519_ref.py, libsodium
where it is installed). A second implementation reads the same files.
"""

import json
from pathlib import Path
from typing import Any

from processor.engine import Commit, decide
from processor.engine.answers import Answer, committed_digest, digest_of
from processor.engine.continuation import CONTINUED_BY, GRANTED, REFUSED, claimed, relay_id
from processor.engine.scope import reaches
from processor.kafka.partitioning import murmur2, partition_for
from processor.machines import builtin_machines
from processor.records.intake import Credential, authenticate, decode_proposal
from processor.records.pipeline import RunsInMemory, decide_record
from processor.trust.keyring import Keyring, KeyringError, SigningKey, parse_keyring
from processor.trust.signatures import (
    ed25519_public_key,
    ed25519_signature,
    signed_base,
    verify_ed25519,
)
from schemas.audit import canonical_text, canonical_values
from schemas.codes import RejectionCode
from schemas.messages import (
    CreatePayload,
    Principal,
    Proposal,
    Rejection,
    RunSnapshot,
    Transition,
)
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
    steps: list[tuple[str, dict[str, Any]]] = [
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
    return canonical_text(canonical_values(transition.__dict__))


RUNTIME = Principal(source="runtime", authority="runtime")
RUNTIME_2 = Principal(source="runtime-2", authority="runtime")
APPROVER = Principal(source="approver:bob", authority="approver")


def _principal(principal: Principal) -> dict[str, str]:
    return {"source": principal.source, "authority": principal.authority}


def _decoded(value: bytes) -> Proposal:
    decoded = decode_proposal(value, T0)
    assert isinstance(decoded, Proposal), decoded
    return decoded


class _Run:
    """One run of the built-in machines decided by `decide` alone, with its answers."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.machines = builtin_machines()
        self.snapshot: RunSnapshot | None = None
        self.answers: dict[str, Answer] = {}
        self.now = T0

    def propose(self, value: bytes, principal: Principal) -> Commit | Rejection:
        decision = decide(
            self.machines, self.snapshot, _decoded(value), principal, self.now, self.answers.get
        )
        self.now += 1_000
        if isinstance(decision, Commit):
            t = decision.transition
            self.snapshot = decision.snapshot
            self.answers[t.proposal_id] = Answer(t.revision, committed_digest(t))
        elif isinstance(decision, Rejection) and decision.content_digest is not None:
            self.answers[decision.proposal_id or ""] = Answer(
                None, decision.content_digest, decision
            )
        assert isinstance(decision, Commit | Rejection), decision
        return decision

    def commit(self, event: str, principal: Principal = RUNTIME, **fields: Any) -> None:
        pid = f"setup-{self.now}"
        decision = self.propose(_proposal(self.run_id, pid, event, **fields), principal)
        assert isinstance(decision, Commit), decision


def _outcome(decision: Commit | Rejection) -> str:
    return "committed" if isinstance(decision, Commit) else decision.code.value


def digests() -> dict[str, Any]:
    """What "the same proposal" is (docs/wire.md §3): each proposal's content digest
    (from the value as sent and the principal its key proves), and pairs of proposals
    sent under one proposal id to a fresh run, with what the engine answered the second:
    the first answer again ("same") or `proposal_id_reused` ("reused")."""
    unicode_metadata = {
        "text": '<tag> & "quotes" \\ / \u2028 \u007f \u0001 é 😀',
        "keys": {"\ue000": 1, "😀": 2, "a": 3, "B": 4, "é": 5},
    }
    floats = {"ratio": 1.0, "tiny": 1e-7, "big": 1e21, "neg_zero": -0.0, "third": 1 / 3}
    nested = {"a": [[], {}, [None, True, False, {"b": [1, {"c": "d"}]}]], "n": -9007199254740991}
    proposals: list[tuple[str, bytes, Principal]] = [
        ("no reason, payload or metadata", _proposal("r", "p", "start"), RUNTIME),
        ("the same, by another principal", _proposal("r", "p", "start"), RUNTIME_2),
        ("reason null", _proposal("r", "p", "start", reason=None), RUNTIME),
        ("a reason", _proposal("r", "p", "cancel", reason="user_requested"), RUNTIME),
        ("unicode", _proposal("r", "p", "note", reason="é😀", metadata=unicode_metadata), RUNTIME),
        ("floats", _proposal("r", "p", "note", metadata=floats), RUNTIME),
        ("nested", _proposal("r", "p", "note", payload=nested), RUNTIME),
        (
            "an approval decision",
            _proposal("r", "p", "approved", payload={"pause": 2, "expires_at_ms": T0}),
            APPROVER,
        ),
        (
            "escaped, spaced, reordered, with an expected revision",
            b'{ "event" : "note", "run_id": "r", "proposal_id": "p", "expected_revision": 3,'
            b' "reason": "\\u00e9\\ud83d\\ude00", "metadata": {"keys": {"B": 4, "a": 3}} }',
            RUNTIME,
        ),
    ]
    out = []
    for name, value, principal in proposals:
        proposal = _decoded(value)
        values = [
            proposal.event,
            proposal.reason,
            proposal.payload,
            proposal.metadata,
            principal.source,
            principal.authority,
        ]
        out.append(
            {
                "name": name,
                "value": value.decode(),
                "principal": _principal(principal),
                "canonical": canonical_text(values),
                "digest": digest_of(proposal, principal),
            }
        )

    def start(**fields: Any) -> bytes:
        return _proposal("pairs", "p-1", "start", **fields)

    def note(**fields: Any) -> bytes:  # `note` is no event of run_state: refused, remembered
        return _proposal("pairs", "p-1", "note", **fields)

    same_bytes = (
        b'{"proposal_id":"p-1","run_id":"pairs","event":"start","expected_revision":0,'
        b'"metadata":{"b":-0.0,"a":1.0,"s":"\\u00e9"},"payload":{},"reason":null}'
    )
    pairs: list[tuple[str, bytes, Principal, bytes, Principal]] = [
        ("byte for byte again", start(), RUNTIME, start(), RUNTIME),
        (
            "another encoding, member order and expected revision",
            start(metadata={"a": 1, "b": 0, "s": "é"}),
            RUNTIME,
            same_bytes,
            RUNTIME,
        ),
        ("a reason added", start(), RUNTIME, start(reason="user_requested"), RUNTIME),
        ("another principal", start(), RUNTIME, start(), RUNTIME_2),
        ("metadata changed", start(metadata={"a": 1}), RUNTIME, start(metadata={"a": 2}), RUNTIME),
        (
            "array order changed",
            start(payload={"a": [1, 2]}),
            RUNTIME,
            start(payload={"a": [2, 1]}),
            RUNTIME,
        ),
        ("another event", start(), RUNTIME, _proposal("pairs", "p-1", "cancel"), RUNTIME),
        ("a refusal, again", note(metadata={"x": 1}), RUNTIME, note(metadata={"x": 1.0}), RUNTIME),
        (
            "a refusal, then other content",
            note(metadata={"x": 1}),
            RUNTIME,
            note(metadata={"x": 1.5}),
            RUNTIME,
        ),
        (
            "a refusal, then another principal",
            note(reason="why"),
            RUNTIME,
            note(reason="why"),
            RUNTIME_2,
        ),
    ]
    pair_cases = []
    for name, first, first_by, second, second_by in pairs:
        run = _Run("pairs")
        run.commit("create", payload={"machine": "run_state"})
        first_outcome = run.propose(first, first_by)
        second_outcome = run.propose(second, second_by)
        reused = (
            isinstance(second_outcome, Rejection)
            and second_outcome.code is RejectionCode.PROPOSAL_ID_REUSED
        )
        if not reused:  # the first answer again
            again = (
                RejectionCode.DUPLICATE if isinstance(first_outcome, Commit) else first_outcome.code
            )
            assert isinstance(second_outcome, Rejection) and second_outcome.code is again
        pair_cases.append(
            {
                "name": name,
                "first": {"value": first.decode(), "principal": _principal(first_by)},
                "second": {"value": second.decode(), "principal": _principal(second_by)},
                "first_outcome": _outcome(first_outcome),
                "second_outcome": _outcome(second_outcome),
                "expect": "reused" if reused else "same",
            }
        )
    return {"proposals": out, "pairs": pair_cases}


def approvals() -> dict[str, Any]:
    """Bound approvals (docs/wire.md §3): a run of run_state waiting in a pause, an
    approver's decision for it, and what `decide` answers (`accepted`: committed)."""
    alice_runs = Principal(source="alice", authority="runtime")
    alice_approves = Principal(source="alice", authority="approver")

    def paused(asker: Principal, pauses: int = 1) -> _Run:
        run = _Run("approvals")
        run.commit("create", payload={"machine": "run_state"})
        run.commit("start")
        for n in range(pauses):
            if n:
                payload = {"pause": run.snapshot.revision if run.snapshot else 0}
                run.commit("approved", APPROVER, payload={**payload, "expires_at_ms": T0 * 2})
            run.commit("need_approval", asker)
        return run

    def legacy() -> _Run:
        """A run that entered its wait before pauses were recorded (no pause)."""
        run = paused(RUNTIME)
        assert run.snapshot is not None
        run.snapshot = run.snapshot.model_copy(update={"pause": None})
        return run

    later = T0 + 3_600_000
    # (name, run, event, payload, principal, broker time: None for the run's next)
    cases: list[tuple[str, _Run, str, Any, Principal, int | None]] = [
        (
            "grant",
            paused(RUNTIME),
            "approved",
            {"pause": 2, "expires_at_ms": later},
            APPROVER,
            None,
        ),
        ("deny", paused(RUNTIME), "rejected", {"pause": 2, "expires_at_ms": later}, APPROVER, None),
        (
            "an earlier pause",
            paused(RUNTIME, 2),
            "approved",
            {"pause": 2, "expires_at_ms": later},
            APPROVER,
            None,
        ),
        (
            "the second pause",
            paused(RUNTIME, 2),
            "approved",
            {"pause": 4, "expires_at_ms": later},
            APPROVER,
            None,
        ),
        (
            "a later pause",
            paused(RUNTIME),
            "approved",
            {"pause": 3, "expires_at_ms": later},
            APPROVER,
            None,
        ),
        (
            "expires at the broker time",
            paused(RUNTIME),
            "approved",
            {"pause": 2, "expires_at_ms": T0 + 10_000},
            APPROVER,
            T0 + 10_000,
        ),
        (
            "expires 1 ms after the broker time",
            paused(RUNTIME),
            "approved",
            {"pause": 2, "expires_at_ms": T0 + 10_001},
            APPROVER,
            T0 + 10_000,
        ),
        (
            "expired long ago",
            paused(RUNTIME),
            "rejected",
            {"pause": 2, "expires_at_ms": 0},
            APPROVER,
            None,
        ),
        (
            "asked and decided by one source",
            paused(alice_runs),
            "approved",
            {"pause": 2, "expires_at_ms": later},
            alice_approves,
            None,
        ),
        (
            "a denial by the asker's source",
            paused(alice_runs),
            "rejected",
            {"pause": 2, "expires_at_ms": later},
            alice_approves,
            None,
        ),
        (
            "another source",
            paused(alice_runs),
            "approved",
            {"pause": 2, "expires_at_ms": later},
            APPROVER,
            None,
        ),
        (
            "wrong pause and expired",
            paused(RUNTIME),
            "approved",
            {"pause": 1, "expires_at_ms": 0},
            APPROVER,
            None,
        ),
        (
            "wrong pause and self",
            paused(alice_runs),
            "approved",
            {"pause": 3, "expires_at_ms": later},
            alice_approves,
            None,
        ),
        (
            "expired and self",
            paused(alice_runs),
            "approved",
            {"pause": 2, "expires_at_ms": 0},
            alice_approves,
            None,
        ),
        (
            "no pause recorded: the run's revision",
            legacy(),
            "approved",
            {"pause": 2, "expires_at_ms": later},
            APPROVER,
            None,
        ),
        (
            "no pause recorded: another revision",
            legacy(),
            "approved",
            {"pause": 1, "expires_at_ms": later},
            APPROVER,
            None,
        ),
        (
            "the largest expiry",
            paused(RUNTIME),
            "approved",
            {"pause": 2, "expires_at_ms": 9007199254740991},
            APPROVER,
            None,
        ),
        ("no expires_at_ms", paused(RUNTIME), "approved", {"pause": 2}, APPROVER, None),
        ("no pause", paused(RUNTIME), "approved", {"expires_at_ms": later}, APPROVER, None),
        (
            "another field",
            paused(RUNTIME),
            "approved",
            {"pause": 2, "expires_at_ms": later, "note": "ok"},
            APPROVER,
            None,
        ),
        (
            "a negative pause",
            paused(RUNTIME),
            "approved",
            {"pause": -1, "expires_at_ms": later},
            APPROVER,
            None,
        ),
        (
            "a fractional expiry",
            paused(RUNTIME),
            "approved",
            {"pause": 2, "expires_at_ms": later + 0.5},
            APPROVER,
            None,
        ),
        (
            "a pause as text",
            paused(RUNTIME),
            "approved",
            {"pause": "2", "expires_at_ms": later},
            APPROVER,
            None,
        ),
        (
            "a pause as a boolean",
            paused(RUNTIME),
            "approved",
            {"pause": True, "expires_at_ms": later},
            APPROVER,
            None,
        ),
        (
            "a pause of null",
            paused(RUNTIME),
            "approved",
            {"pause": None, "expires_at_ms": later},
            APPROVER,
            None,
        ),
    ]
    out: list[dict[str, Any]] = []
    machine = builtin_machines()["run_state"]
    for name, run, event, payload, principal, at in cases:
        snapshot = run.snapshot
        assert snapshot is not None and snapshot.state == "waiting_approval"
        if at is not None:
            run.now = at
        now = run.now
        value = _proposal(run.run_id, f"decision-{len(out)}", event, payload=payload)
        decision = run.propose(value, principal)
        pause = snapshot.pause
        out.append(
            {
                "name": name,
                "run": {
                    "state": snapshot.state,
                    "revision": snapshot.revision,
                    "pause": None
                    if pause is None
                    else {
                        "revision": pause.revision,
                        "asked_by": _principal(pause.asked_by),
                        "at_ms": pause.at_ms,
                    },
                },
                "event": event,
                "approval": machine.spec.events[event].approval,
                "payload": payload,
                "principal": _principal(principal),
                "broker_time": now,
                "expect": "accepted" if isinstance(decision, Commit) else decision.code.value,
            }
        )
    return {"machine": "run_state", "cases": out}


def scopes() -> list[dict[str, Any]]:
    """Which run ids a key's run id prefix reaches (docs/wire.md §4)."""
    cases = [
        ("team-a", "team-a"),
        ("team-a", "team-a-7"),
        ("team-a", "team-a/7"),
        ("team-a", "team-ab-7"),
        ("team-a", "team-a7"),
        ("team-a", "team-"),
        ("team-a/", "team-a/7"),
        ("team-a/", "team-a"),
        ("team-a-", "team-a-7"),
        ("", "anything"),
        ("t", "t.1"),
        ("t", "t_1"),
        ("t", "t:1"),
        ("t", "t@1"),
        ("t", "t#1"),
        ("t", "t 1"),
        ("t", "t+1"),
        ("t", "T-1"),
        ("é", "é-1"),
        ("é", "éa"),
        ("😀", "😀/1"),
        ("e", "é"),
    ]
    return [
        {"prefix": prefix, "run_id": run_id, "reaches": reaches(prefix, run_id)}
        for prefix, run_id in cases
    ]


def continuations() -> dict[str, Any]:
    """The messages between runs (docs/wire.md §7): the proposal id of each for a new run
    and its create, and the digests a continuation's ask carries of the steps and
    checkpoint it claims (which the original compares with its own)."""
    ids = [
        {
            "event": event,
            "run_id": run_id,
            "proposal_id": proposal_id,
            "relay_id": relay_id(event, run_id, proposal_id),
        }
        for event, run_id, proposal_id in [
            (CONTINUED_BY, "task-2", "p1"),
            (GRANTED, "task-2", "p1"),
            (REFUSED, "task-2", "p1"),
            (GRANTED, "é/😀-2", "p" * 128),
        ]
    ]
    carried: list[dict[str, Any]] = [
        {"steps": {}, "checkpoint": {}},
        {
            "steps": {
                "s1": {"idempotency_key": "k-s1", "attempts": 1, "result": {"rows": 42}},
                "refund": {"attempts": 2, "result": None},
                "e.2": {"idempotency_key": "k", "attempts": 1, "result": [1.5, "😀"]},
            },
            "checkpoint": {"cursor": 42, "plan": ["s1", "s2"], "b": {"z": 1, "a": 2}},
        },
    ]
    digests = []
    for case in carried:
        create = CreatePayload.model_validate(
            {
                "machine": "task_lifecycle",
                "continues": {"run_id": "task-1", "revision": 3, "hash": "a" * 64},
                **case,
            }
        )
        steps_digest, checkpoint_digest = claimed(create)
        digests.append(
            {**case, "steps_digest": steps_digest, "checkpoint_digest": checkpoint_digest}
        )
    return {"relay_ids": ids, "digests": digests}


def render() -> dict[str, str]:
    files = {
        "partitions.json": partitions(),
        "signatures.json": signatures(),
        "verifications.json": verifications(),
        "chain.json": chain(),
        "ed25519.json": ed25519(),
        "digests.json": digests(),
        "approvals.json": approvals(),
        "scopes.json": scopes(),
        "continuations.json": continuations(),
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
