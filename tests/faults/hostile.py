"""Hostile records for the proposals topic, each with the outcome it must end as.

Every kind names what the processor must do with it: a DLQ record (not a proposal at
all), a rejection with one code, a commit (hostile-looking but valid: arbitrary Unicode,
identifiers exactly at their byte limits) or, where the run's state decides, at least
"well-formed" (neither DLQ nor schema_invalid). `tests/unit/test_hostile_input.py`
checks each kind against the pure pipeline; the fault harness checks the workers publish
exactly what the pipeline decides, record for record.

Poison is generated, not listed: a seeded `random.Random` picks every control character,
lone surrogate, multi-byte character, invalid UTF-8 sequence and size, so each record of
a kind differs from the last.
"""

import json
import os
import random
import time
from collections.abc import Callable

from benchmarks.records import Headers, RawRecord
from processor.engine.timers import timer_proposal_id
from processor.machines import builtin_machines
from processor.records.changelog_keys import FIRED_CHANGELOG_PREFIX
from processor.trust.keyring import Keyring, SigningKey, signing_key_from
from processor.trust.signatures import HEADER_KEY_ID, HEADER_SIGNATURE
from schemas.codes import RejectionCode
from schemas.identifiers import MAX_PROPOSAL_ID_BYTES, MAX_RUN_ID_BYTES

DLQ = "dlq"
#: Must be committed (on a run that does not exist yet: every such record creates one).
COMMIT = "commit"
#: Passes the schema (not DLQ, not schema_invalid); the run's state decides the rest.
WELL_FORMED = "well-formed"
SCHEMA_INVALID = RejectionCode.SCHEMA_INVALID.value
#: Records near the broker's default record limit (1 MB): only this share of the
#: hostile records (at least two), so the harness stays fast.
HEAVY_EVERY = 300


def _proposal(run_id: str, proposal_id: str, **fields: object) -> bytes:
    body: dict[str, object] = {"run_id": run_id, "proposal_id": proposal_id, "event": "start"}
    body.update(fields)
    return json.dumps(body).encode()


# -- generators of poison --------------------------------------------------------------
_C0_C1 = [*range(0x00, 0x20), *range(0x7F, 0xA0)]
_MACHINES = sorted(builtin_machines())


def _control(rng: random.Random) -> str:
    return chr(rng.choice(_C0_C1))


def _lone_surrogate(rng: random.Random) -> str:
    """One surrogate that is not half of a pair where it stands: a lead alone, a trail
    alone, or a trail then a lead (a pair the wrong way round)."""
    lead, trail = chr(rng.randint(0xD800, 0xDBFF)), chr(rng.randint(0xDC00, 0xDFFF))
    return rng.choice([lead, trail, trail + lead, lead + rng.choice("x-é\u4e2d")])


def _wide_char(rng: random.Random, max_width: int = 4) -> str:
    """A random non-control character of 2, 3 or 4 bytes in UTF-8 (no surrogates)."""
    width = rng.randint(2, max_width)
    if width == 2:
        return chr(rng.randint(0xA0, 0x7FF))
    if width == 3:
        return chr(rng.choice([rng.randint(0x800, 0xD7FF), rng.randint(0xE000, 0xFFFD)]))
    return chr(rng.choice([rng.randint(0x1F300, 0x1FAFF), rng.randint(0x10000, 0x10FFFF)]))


def _text_of_bytes(rng: random.Random, prefix: str, size: int) -> str:
    """`prefix` then random multi-byte characters: exactly `size` bytes in UTF-8."""
    text = prefix
    room = size - len(prefix.encode())
    while room >= 2:
        char = _wide_char(rng, min(4, room))
        text += char
        room -= len(char.encode())
    return text + "z" * room


def _over_long(rng: random.Random, prefix: str, limit: int) -> str:
    """An id over `limit` UTF-8 bytes but under `limit` characters (a character count
    such as JSON Schema's maxLength would pass it)."""
    size = rng.choice([limit + 1, rng.randint(limit + 2, limit + limit // 2)])
    text = _text_of_bytes(rng, prefix, size)
    assert len(text) < limit < len(text.encode()), (len(text), len(text.encode()))
    return text


def _with_controls(rng: random.Random, base: str) -> str:
    """`base` with control characters: inserted at random places, or spelling one of the
    store's internal key shapes (its fired-mark prefix, its NUL-separated index keys)."""
    fired = FIRED_CHANGELOG_PREFIX.decode()
    shape = rng.randrange(4)
    if shape == 0:
        return fired + base
    if shape == 1:
        return f"{base}\x00{rng.choice(_MACHINES)}\x00{rng.choice(['pending', 'running'])}"
    if shape == 2:
        return "".join(_control(rng) for _ in range(rng.randint(1, 8)))
    chars = list(base)
    for _ in range(rng.randint(1, 3)):
        chars.insert(rng.randint(0, len(chars)), _control(rng))
    return "".join(chars)


def _with_surrogate(rng: random.Random, base: str) -> str:
    at = rng.randint(0, len(base))
    return base[:at] + _lone_surrogate(rng) + base[at:]


_INVALID_UTF8: list[Callable[[random.Random], bytes]] = [
    lambda r: bytes([r.randint(0x80, 0xBF)]),  # a continuation byte alone
    lambda r: bytes([r.choice([0xC0, 0xC1]), r.randint(0x80, 0xBF)]),  # overlong, 2 bytes
    lambda r: bytes([0xE0, r.randint(0x80, 0x9F), r.randint(0x80, 0xBF)]),  # overlong, 3
    lambda r: bytes([r.randint(0xF5, 0xFF)]),  # never in UTF-8
    lambda r: bytes([r.randint(0xC2, 0xF4)]),  # a lead byte without its continuation
    lambda r: bytes([0xED, r.randint(0xA0, 0xBF), r.randint(0x80, 0xBF)]),  # a surrogate
    lambda r: bytes([0xF4, r.randint(0x90, 0xBF), 0x80, 0x80]),  # over U+10FFFF
]


def _invalid_utf8_key(rng: random.Random, run_id: str) -> tuple[bytes, str]:
    """The run id's bytes with an invalid sequence appended, inserted or replacing a
    byte, and how: a key equal to the run id under a lossy decoding."""
    raw = run_id.encode()
    while True:
        bad = rng.choice(_INVALID_UTF8)(rng)
        how = rng.choice(["appended", "inserted", "replacing a byte"])
        at = rng.randint(0, len(raw) - 1)
        if how == "appended":
            key = raw + bad
        elif how == "inserted":
            key = raw[:at] + bad + raw[at:]
        else:
            key = raw[:at] + bad + raw[at + 1 :]
        try:
            key.decode()
        except UnicodeDecodeError:
            return key, how


def _unicode_text(rng: random.Random, n: int) -> str:
    """`n` random Unicode scalar values (any but surrogates; controls, noncharacters,
    combining marks, bidi overrides and astral characters included)."""
    pools: list[Callable[[], int]] = [
        lambda: rng.randint(0x20, 0x7E),
        lambda: rng.choice(_C0_C1),
        lambda: rng.randint(0xA0, 0xD7FF),
        lambda: rng.randint(0xE000, 0xFFFF),  # private use, BOM, U+FFFE/U+FFFF
        lambda: rng.choice([0x200D, 0x202E, 0x2028, 0x2029, 0xFEFF, 0x0301, 0x20E3]),
        lambda: rng.randint(0x1F300, 0x1FAFF),  # emoji: JSON escapes them as pairs
        lambda: rng.randint(0x10000, 0x10FFFF),
    ]
    return "".join(chr(rng.choice(pools)()) for _ in range(n))


def _unicode_json(rng: random.Random, depth: int = 3) -> object:
    """A random JSON value whose strings (keys too) are arbitrary Unicode."""
    roll = rng.random()
    if depth == 0 or roll < 0.4:
        return rng.choice(
            [
                _unicode_text(rng, rng.randint(0, 40)),
                rng.randint(-(2**53 - 1), 2**53 - 1),
                None,
                True,
            ]
        )
    if roll < 0.7:
        return [_unicode_json(rng, depth - 1) for _ in range(rng.randint(0, 4))]
    return {
        _unicode_text(rng, rng.randint(1, 12)): _unicode_json(rng, depth - 1)
        for _ in range(rng.randint(1, 4))
    }


def _plant(rng: random.Random, value: object, poison: str) -> object:
    """`value` (a JSON object) with `poison` as a key or string somewhere inside it."""
    if isinstance(value, dict) and value and rng.random() < 0.6:
        k = rng.choice(list(value))
        out = dict(value)
        out[k] = _plant(rng, value[k], poison)
        return out
    if isinstance(value, list) and value and rng.random() < 0.6:
        i = rng.randrange(len(value))
        return [*value[:i], _plant(rng, value[i], poison), *value[i + 1 :]]
    if isinstance(value, dict):
        return {**value, poison: "x"} if rng.random() < 0.5 else {**value, "s": poison}
    return {"s": poison, "was": value}


def _dumps(rng: random.Random, body: dict[str, object]) -> bytes:
    """JSON, ASCII-escaped or raw UTF-8 at random (a lone surrogate is always escaped:
    json.dumps writes `\\udXXX`; raw UTF-8 could not hold it)."""
    try:
        return json.dumps(body, ensure_ascii=rng.random() < 0.5).encode()
    except UnicodeEncodeError:
        return json.dumps(body).encode()


def hostile_records(
    run_ids: list[str],
    good: list[RawRecord],
    count: int,
    keyring: Keyring,
    topic: str,
    seed: int = 3,
    signed_at_ms: int | None = None,
) -> list[RawRecord]:
    """`count` hostile records over the given runs, a little of every kind, signed for
    proposals topic `topic` at `signed_at_ms` (default now: they are sent within
    minutes)."""
    rng = random.Random(seed)
    runtime = signing_key_from(keyring, "runtime")
    now = int(time.time() * 1000) if signed_at_ms is None else signed_at_ms

    def headers_for(key: bytes | None, value: bytes, at_ms: int = now) -> Headers:
        return runtime.headers(topic, key, value, at_ms)

    def signed(run_id: str, value: bytes, kind: str, expect: str) -> RawRecord:
        return RawRecord(run_id.encode(), value, headers_for(run_id.encode(), value), kind, expect)

    def record(
        key: bytes | None, value: bytes, kind: str, expect: str, sign_it: bool = True
    ) -> RawRecord:
        headers = headers_for(key, value) if sign_it else []
        return RawRecord(key, value, headers, kind, expect)

    def well_formed(run_id: str, pid: str) -> dict[str, object]:
        """A proposal that passes the schema (a create, an event, or a step result)."""
        body: dict[str, object] = {"run_id": run_id, "proposal_id": pid}
        roll = rng.randrange(4)
        if roll == 0:
            body.update(event="create", payload={"machine": rng.choice(_MACHINES)})
        elif roll == 1:
            body.update(event=rng.choice(["start", "run_started", "complete"]))
        elif roll == 2:
            body.update(event="cancel", reason="hostile", expected_revision=rng.randint(0, 9))
        else:
            body.update(event="step_succeeded", payload={"step": "charge", "result": {"n": 1}})
        return body

    def bad_id(run_id: str, pid: str, what: str, field: str) -> RawRecord:
        """A well-formed proposal but for one identifier, signed or not: schema_invalid
        either way (the schema is checked before the signature)."""
        sign_it = rng.random() < 0.5
        body = well_formed(run_id, pid)
        limit = MAX_RUN_ID_BYTES if field == "run_id" else MAX_PROPOSAL_ID_BYTES
        base = str(body[field])
        raw_surrogate = False
        if what == "lone surrogate":
            body[field] = _with_surrogate(rng, base)
            raw_surrogate = rng.random() < 0.3
        elif what == "control character":
            body[field] = _with_controls(rng, base)
        else:
            body[field] = _over_long(rng, f"{base[:24]}-", limit)
        spoiled = str(body["run_id"])
        try:  # the key the run id would be: byte for byte the same when it can be
            key = spoiled.encode()
        except UnicodeEncodeError:
            key = rng.choice(
                [
                    spoiled.encode("utf-8", "surrogatepass"),
                    run_id.encode(),
                    spoiled.encode("utf-8", "replace"),
                ]
            )
        signing = "signed" if sign_it else "unsigned"
        if raw_surrogate:  # WTF-8: the surrogate as three raw bytes, not UTF-8 at all
            value = json.dumps(body, ensure_ascii=False).encode("utf-8", "surrogatepass")
            return record(key, value, f"{what} (raw bytes) in {field}, {signing}", DLQ, sign_it)
        value = _dumps(rng, body)
        return record(key, value, f"{what} in {field}, {signing}", SCHEMA_INVALID, sign_it)

    def key_invalid_utf8(run_id: str, pid: str) -> RawRecord:
        """A signed, well-formed proposal whose key is its run id but for invalid UTF-8
        (its run id sometimes the key decoded with replacement characters)."""
        key, how = _invalid_utf8_key(rng, run_id)
        lossy = rng.choice([run_id, key.decode(errors="replace")])
        value = _dumps(rng, well_formed(lossy, pid))
        return record(key, value, f"key is the run id with invalid UTF-8 {how}", SCHEMA_INVALID)

    def huge_key(run_id: str, pid: str) -> RawRecord:
        size = rng.randint(5_000, 50_000)
        key = rng.choice(
            [
                rng.randbytes(size),
                (run_id.encode() * (size // len(run_id) + 1))[:size],
                _text_of_bytes(rng, run_id, size).encode(),
            ]
        )
        if rng.random() < 0.3:  # a proposal, but the key is not its run
            value = _dumps(rng, well_formed(run_id, pid))
            return record(key, value, "huge key, signed proposal", SCHEMA_INVALID)
        junk: list[bytes | None] = [
            rng.randbytes(rng.randint(1, 300)),
            _proposal(run_id, pid)[:-1],
            b"[]",
            None,
        ]
        return RawRecord(key, rng.choice(junk), [], "huge key, not a proposal", DLQ)

    def heavy(n: int) -> RawRecord:
        """A value of 200 to 900 KB that is not a proposal (near the 1 MB record limit)."""
        size = rng.randint(200_000, 900_000)
        key = rng.choice(run_ids).encode()
        variant = n % 3
        if variant == 0:
            return RawRecord(key, rng.randbytes(size), [], "large value, random bytes", DLQ)
        if variant == 1:
            value = b"[" + b"7," * (size // 2) + b"7]"
            return RawRecord(key, value, [], "large value, JSON array", DLQ)
        start = _proposal(key.decode(), f"heavy-{seed}-{n}")[:-1] + b', "payload": {"blob": "'
        value = start + _unicode_text(rng, size // 3).encode(errors="ignore")
        return RawRecord(key, value, [], "large value, proposal cut short", DLQ)

    def fresh_run(run_id: str, n: int) -> str:
        """A run id no record used before, in plain ASCII or with multi-byte characters."""
        fresh = f"{run_id}~{seed}-{n}"
        if rng.random() < 0.5:
            fresh += "~" + "".join(_wide_char(rng) for _ in range(rng.randint(1, 12)))
        return fresh

    def unicode_create(run_id: str, pid: str, n: int) -> RawRecord:
        """A create whose reason, success criteria and metadata are arbitrary Unicode (emoji
        JSON-escaped as surrogate pairs): valid, so committed."""
        fresh = fresh_run(run_id, n)
        reason = _unicode_text(rng, rng.randint(1, 200))
        machine = rng.choice(_MACHINES)
        criteria = [_unicode_text(rng, rng.randint(1, 30)) for _ in range(rng.randint(0, 3))]
        # with the machine's own: a run adds criteria, never drops its machine's
        criteria += builtin_machines()[machine].spec.default_success_criteria
        body: dict[str, object] = {
            "run_id": fresh,
            "proposal_id": pid,
            "event": "create",
            "reason": reason,
            "payload": {"machine": machine, "options": {"success_criteria": criteria}},
            "metadata": {_unicode_text(rng, 8): _unicode_json(rng) for _ in range(3)},
        }
        return record(fresh.encode(), _dumps(rng, body), "arbitrary Unicode in a create", COMMIT)

    def at_limits(run_id: str, n: int) -> RawRecord:
        """A create whose run id is exactly 256 UTF-8 bytes and proposal id exactly 128, of
        multi-byte characters: valid, so committed."""
        fresh = _text_of_bytes(rng, f"{run_id}~{seed}-{n}~", MAX_RUN_ID_BYTES)
        pid = _text_of_bytes(rng, f"limit-{seed}-{n}~", MAX_PROPOSAL_ID_BYTES)
        body: dict[str, object] = {"run_id": fresh, "proposal_id": pid, "event": "create"}
        body["payload"] = {"machine": rng.choice(_MACHINES)}
        return record(fresh.encode(), _dumps(rng, body), "ids at their byte limits", COMMIT)

    def unicode_step(run_id: str, pid: str) -> RawRecord:
        """A step result and metadata of arbitrary Unicode on a workload run: well-formed;
        what the run's state makes of it is the pipeline's to decide."""
        body: dict[str, object] = {
            "run_id": run_id,
            "proposal_id": pid,
            "event": "step_succeeded",
            "payload": {"step": rng.choice(["charge", "notify"]), "result": _unicode_json(rng)},
            "metadata": {"note": _unicode_text(rng, rng.randint(1, 100))},
        }
        return record(
            run_id.encode(), _dumps(rng, body), "arbitrary Unicode in a step", WELL_FORMED
        )

    def surrogate_inside(run_id: str, pid: str, n: int) -> RawRecord:
        """A lone surrogate planted somewhere in a payload or metadata: schema_invalid."""
        sign_it = rng.random() < 0.5
        poison = _with_surrogate(rng, _unicode_text(rng, rng.randint(0, 20)))
        where = rng.choice(["payload", "metadata"])
        if where == "payload":
            result = _plant(rng, {"r": _unicode_json(rng)}, poison)
            body: dict[str, object] = {
                "run_id": run_id,
                "proposal_id": pid,
                "event": "step_succeeded",
                "payload": {"step": "charge", "result": result},
            }
            key = run_id.encode()
        else:
            fresh = fresh_run(run_id, n)
            body = well_formed(fresh, pid)
            body["metadata"] = _plant(rng, {"m": _unicode_json(rng)}, poison)
            key = fresh.encode()
        signing = "signed" if sign_it else "unsigned"
        kind = f"lone surrogate in {where}, {signing}"
        return record(key, _dumps(rng, body), kind, SCHEMA_INVALID, sign_it)

    def too_deep(run_id: str, pid: str) -> RawRecord:
        """A step result or metadata nested past 64 levels (and up to near the parser's
        own limit, where a snapshot holding it could no longer be read): schema_invalid."""
        nested: object = rng.choice([1, "x", None, [], {}])
        for _ in range(rng.randint(64, 190)):
            nested = [nested] if rng.random() < 0.5 else {rng.choice("abc"): nested}
        body: dict[str, object] = {"run_id": run_id, "proposal_id": pid}
        if rng.random() < 0.5:
            body.update(event="step_succeeded", payload={"step": "charge", "result": nested})
            where = "step result"
        else:
            body.update(event=rng.choice(["start", "complete"]), metadata={"m": nested})
            where = "metadata"
        return signed(run_id, _dumps(rng, body), f"{where} nested too deeply", SCHEMA_INVALID)

    def timer_metadata(run_id: str, pid: str) -> RawRecord:
        """metadata.timer, which names a deadline's timer, as any JSON (once a list made
        deciding raise): well-formed; the run's state decides."""
        body = well_formed(run_id, pid)
        body["metadata"] = {"timer": rng.choice([[], {}, 7, None, True, "heartbeat", "x"])}
        if body["event"] == "create":
            body.update(event="start", payload={})
        return signed(run_id, _dumps(rng, body), "metadata.timer of any type", WELL_FORMED)

    def borrowed_deadline_id(run_id: str, n: int) -> RawRecord:
        """A create whose proposal id is one a deadline of the run would have: refused
        unauthorized (else that deadline would be a duplicate), even from the runtime."""
        fresh = fresh_run(run_id, n)
        timer = rng.choice(["heartbeat", "approval", "retention"])
        body: dict[str, object] = {
            "run_id": fresh,
            "proposal_id": timer_proposal_id(fresh, 0, timer),
            "event": "create",
            "payload": {"machine": rng.choice(_MACHINES)},
        }
        if rng.random() < 0.5:  # dressed as the deadline itself
            body.update(expected_revision=0, metadata={"timer": timer})
        kind = "a deadline's proposal id on a create"
        return signed(fresh, _dumps(rng, body), kind, RejectionCode.UNAUTHORIZED.value)

    heavy_slots = set(rng.sample(range(count), min(count, max(3, count // HEAVY_EVERY))))

    def one(n: int) -> RawRecord:
        run_id = rng.choice(run_ids)
        pid = f"hostile-{seed}-{n}"
        key = run_id.encode()
        kinds: list[Callable[[], RawRecord]] = [
            lambda: RawRecord(key, os.urandom(rng.randint(1, 300)), [], "random bytes", DLQ),
            lambda: RawRecord(
                key, _proposal(run_id, pid)[: rng.randint(1, 30)], [], "truncated JSON", DLQ
            ),
            lambda: RawRecord(key, b"[" * 50_000 + b"]" * 50_000, [], "deeply nested JSON", DLQ),
            lambda: RawRecord(
                key, b'{"run_id": "\xff\xfe", "event": "start"}', [], "invalid UTF-8", DLQ
            ),
            lambda: RawRecord(
                key,
                rng.choice([b"[1, 2]", b'"start"', b"null", b"42"]),
                [],
                "JSON not an object",
                DLQ,
            ),
            lambda: RawRecord(key, None, [], "tombstone", DLQ),
            lambda: signed(
                run_id,
                _proposal(run_id, pid, expected_revision="seven"),
                "wrong types",
                RejectionCode.SCHEMA_INVALID.value,
            ),
            lambda: signed(
                run_id,
                _proposal(run_id, pid, payload={"blob": "x" * 70_000}),
                "payload over the limit",
                RejectionCode.SCHEMA_INVALID.value,
            ),
            lambda: signed(
                run_id,
                _proposal(run_id, pid, expected_revision=10**15),
                "absurd revision",
                RejectionCode.REVISION_CONFLICT.value,
            ),
            lambda: signed(
                run_id,
                _proposal(run_id, pid, expected_revision=-3),
                "negative revision",
                RejectionCode.SCHEMA_INVALID.value,
            ),
            lambda: signed(
                run_id,
                _proposal(run_id, pid, event="no_such_event"),
                "unknown event",
                RejectionCode.UNKNOWN_EVENT.value,
            ),
            lambda: signed(
                f"{run_id}-new",
                _proposal(
                    f"{run_id}-new", pid, event="create", payload={"machine": "no_such_machine"}
                ),
                "unknown machine",
                RejectionCode.UNKNOWN_MACHINE.value,
            ),
            lambda: RawRecord(
                key,
                _proposal(run_id, pid),
                [],
                "missing headers",
                RejectionCode.UNAUTHENTICATED.value,
            ),
            lambda: RawRecord(
                key,
                _proposal(run_id, pid),
                [
                    (HEADER_KEY_ID, os.urandom(8)),
                    (HEADER_SIGNATURE, os.urandom(40)),
                    ("junk", None),
                ],
                "garbage headers",
                RejectionCode.UNAUTHENTICATED.value,
            ),
            lambda: RawRecord(
                key,
                _proposal(run_id, pid),
                SigningKey.hmac("nobody", runtime.secret or "").headers(
                    topic, key, _proposal(run_id, pid), now
                ),
                "unknown key id",
                RejectionCode.UNAUTHENTICATED.value,
            ),
            lambda: RawRecord(
                key,
                _proposal(run_id, pid, event="cancel"),
                headers_for(key, _proposal(run_id, pid)),
                "signature over an altered value",
                RejectionCode.UNAUTHENTICATED.value,
            ),
            lambda: RawRecord(
                b"some-other-run",
                _proposal(run_id, pid),
                headers_for(b"some-other-run", _proposal(run_id, pid)),
                "key is not the run",
                RejectionCode.SCHEMA_INVALID.value,
            ),
            lambda: RawRecord(
                key,
                _proposal(run_id, pid),
                headers_for(b"some-other-run", _proposal(run_id, pid)),
                "signed for another run",
                RejectionCode.UNAUTHENTICATED.value,
            ),
            lambda: RawRecord(
                key,
                _proposal(run_id, pid),
                runtime.headers("another.proposals", key, _proposal(run_id, pid), now),
                "signed for another topic",
                RejectionCode.UNAUTHENTICATED.value,
            ),
            lambda: RawRecord(
                key,
                _proposal(run_id, pid),
                headers_for(key, _proposal(run_id, pid), now - 24 * 3600 * 1000),
                "captured a day ago, sent again",
                RejectionCode.STALE_SIGNATURE.value,
            ),
            lambda: RawRecord(
                key,
                _proposal(run_id, pid),
                [(HEADER_KEY_ID, b"runtime"), (HEADER_SIGNATURE, b"0" * 64)],
                "signature without its time",
                RejectionCode.UNAUTHENTICATED.value,
            ),
        ]
        kinds += [
            lambda: bad_id(run_id, pid, "lone surrogate", "run_id"),
            lambda: bad_id(run_id, pid, "lone surrogate", "proposal_id"),
            lambda: bad_id(run_id, pid, "control character", "run_id"),
            lambda: bad_id(run_id, pid, "control character", "proposal_id"),
            lambda: bad_id(run_id, pid, "over-long id", "run_id"),
            lambda: bad_id(run_id, pid, "over-long id", "proposal_id"),
            lambda: key_invalid_utf8(run_id, pid),
            lambda: huge_key(run_id, pid),
            lambda: unicode_create(run_id, pid, n),
            lambda: at_limits(run_id, n),
            lambda: unicode_step(run_id, pid),
            lambda: surrogate_inside(run_id, pid, n),
            lambda: too_deep(run_id, pid),
            lambda: timer_metadata(run_id, pid),
            lambda: borrowed_deadline_id(run_id, n),
        ]
        if good:  # replayed: an exact copy of a record already sent; the pipeline decides
            kinds.append(lambda: _replayed(rng.choice(good)))
        if n in heavy_slots:
            return heavy(len([s for s in heavy_slots if s < n]))
        return kinds[n % len(kinds)]()

    return [one(n) for n in range(count)]


def _replayed(original: RawRecord) -> RawRecord:
    return RawRecord(original.key, original.value, original.headers, "replayed record", None)


def mix(good: list[RawRecord], hostile: list[RawRecord], seed: int = 3) -> list[RawRecord]:
    """Hostile records spread at random through the good ones (good order kept)."""
    rng = random.Random(seed)
    slots = sorted(rng.randrange(len(good) + 1) for _ in hostile)
    out: list[RawRecord] = []
    g = 0
    for slot, record in zip(slots, hostile, strict=True):
        out.extend(good[g:slot])
        g = max(g, slot)
        out.append(record)
    out.extend(good[g:])
    return out
