"""Hostile records for the proposals topic, each with the outcome it must end as.

Every kind names what the processor must do with it: a DLQ record (not a proposal at
all) or a rejection with one code. `tests/unit/test_hostile_input.py` checks each kind
against the pure pipeline; the fault harness checks the workers publish exactly what
the pipeline decides, record for record.
"""

import json
import os
import random
from collections.abc import Callable
from dataclasses import dataclass

from processor.intake import HEADER_KEY_ID, HEADER_SIGNATURE, sign, signed_headers
from processor.keyring import Keyring
from schemas.codes import RejectionCode

Headers = list[tuple[str, str | bytes | None]]
DLQ = "dlq"


@dataclass(frozen=True)
class RawRecord:
    key: bytes | None
    value: bytes | None
    headers: Headers
    kind: str = "good"
    expect: str | None = None  # DLQ or a rejection code; None for the good workload


def _proposal(run_id: str, proposal_id: str, **fields: object) -> bytes:
    body: dict[str, object] = {"run_id": run_id, "proposal_id": proposal_id, "event": "start"}
    body.update(fields)
    return json.dumps(body).encode()


def hostile_records(
    run_ids: list[str], good: list[RawRecord], count: int, keyring: Keyring, seed: int = 3
) -> list[RawRecord]:
    """`count` hostile records over the given runs, a little of every kind."""
    rng = random.Random(seed)
    secret = keyring.keys["runtime"].secret

    def signed(run_id: str, value: bytes, kind: str, expect: str) -> RawRecord:
        return RawRecord(
            run_id.encode(), value, signed_headers(value, "runtime", secret), kind, expect
        )

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
                [
                    (HEADER_KEY_ID, b"nobody"),
                    (HEADER_SIGNATURE, sign(_proposal(run_id, pid), secret).encode()),
                ],
                "unknown key id",
                RejectionCode.UNAUTHENTICATED.value,
            ),
            lambda: RawRecord(
                key,
                _proposal(run_id, pid, event="cancel"),
                signed_headers(_proposal(run_id, pid), "runtime", secret),
                "signature over an altered value",
                RejectionCode.UNAUTHENTICATED.value,
            ),
            lambda: RawRecord(
                b"some-other-run",
                _proposal(run_id, pid),
                signed_headers(_proposal(run_id, pid), "runtime", secret),
                "key is not the run",
                RejectionCode.SCHEMA_INVALID.value,
            ),
        ]
        if good:  # replayed: an exact copy of a record already sent; the pipeline decides
            kinds.append(lambda: _replayed(rng.choice(good)))
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
