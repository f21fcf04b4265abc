"""A consumed batch's Ed25519 signatures, verified in parallel before a runtime decides
it (the native worker's loop and the Faust agent alike).

Verifying an Ed25519 signature takes about 65 us here with libsodium (about 120 with
`cryptography`), against 1.2 us for an HMAC, and both let the GIL go while they do: on
the deciding thread, one at a time, that was both slow and a convoy (winning the GIL back
from another thread that wants it takes up to the switch interval, 5 ms). Made here, a
batch's verifications run in three shares at once, two on a pool's threads and one on
the deciding thread's, and
`decide_record` gets their answers (`verified`), which are the very answers it would
have computed: nothing about a decision changes. Batches with few Ed25519 signatures,
and HMAC keyrings, are left to each decision.
"""

import logging
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor

from processor.records.intake import Headers, Verified, ed25519_claim
from processor.trust.keyring import Keyring
from processor.trust.signatures import verify_ed25519

log = logging.getLogger("runstate.worker")

#: Fewer signatures than this in a batch are verified by each decision in turn.
MIN_BATCH = 8
THREADS = 2

Claim = tuple[str, bytes, str]
#: A record as read: its key, value and headers.
Read = tuple[bytes | None, bytes | None, Headers]


def _verify_all(claims: Sequence[Claim]) -> list[bool]:
    return [verify_ed25519(public_key, base, signature) for public_key, base, signature in claims]


class BatchVerifier:
    def __init__(self, threads: int = THREADS) -> None:
        self.threads = threads
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="runstate-verify")

    def verify(self, topic: str, batch: Iterable[Read], keyring: Keyring) -> Verified:
        """The answers for the Ed25519 signatures of `batch` (read from `topic`), or
        none when there are too few to be worth the threads. Whatever goes wrong here
        leaves the answers to the decisions, record by record, where a record's own error
        is that record's outcome (an exception here would stop the worker)."""
        if not keyring.has_ed25519:
            return {}
        try:
            return self._verify(topic, batch, keyring)
        except Exception:
            log.exception("verifying a batch's signatures beforehand failed; left to each decision")
            return {}

    def _verify(self, topic: str, batch: Iterable[Read], keyring: Keyring) -> Verified:
        claims = []
        for key, value, headers in batch:
            claim = ed25519_claim(topic, key, value, headers, keyring)
            if claim is not None:
                claims.append(claim)
        if len(claims) < MIN_BATCH:
            return {}
        # A share per thread, and one for the deciding thread, which would only wait:
        # a task per share, not per signature (a future costs about what a signature
        # saves in Python's own work).
        share = -(-len(claims) // (self.threads + 1))
        mine, *theirs = [claims[at : at + share] for at in range(0, len(claims), share)]
        answers = [self._pool.submit(_verify_all, chunk) for chunk in theirs]
        found = dict(zip(mine, _verify_all(mine), strict=True))
        for chunk, answer in zip(theirs, answers, strict=True):
            found.update(zip(chunk, answer.result(), strict=True))
        return found

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
