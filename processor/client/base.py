"""What both clients are made of, whichever way they wait: where Kafka is, the topics,
the key they sign with, the reader of committed runs, the timeout; and the proposals
they build. Each client adds its transport (`_open`) and its ways of waiting."""

from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

from processor.kafka.config import KafkaSettings
from processor.kafka.topics import TopicNames
from processor.observe import traces
from processor.trust.keyring import SigningKey

from .core import MAX_UNCLAIMED, ProposalRecord, create_payload, proposal_record
from .errors import InvalidArgument
from .reader import RunReader


class ClientBase:
    def __init__(
        self,
        settings: KafkaSettings,
        topics: TopicNames,
        *,
        signing_key: SigningKey | None = None,
        key_id: str | None = None,
        secret: str | None = None,
        worker_urls: Iterable[str] = (),
        http_token: str | None = None,
        timeout: float = 30.0,
        max_unclaimed: int = MAX_UNCLAIMED,
    ) -> None:
        """Sign with `signing_key` (an Ed25519 or HMAC key, `runstate keys add` writes
        one), or with the HMAC key `key_id` whose shared secret is `secret`. Reads ask
        the workers at `worker_urls` (one is enough when they are each other's peers),
        sending `http_token` (default: RUNSTATE_HTTP_TOKEN); Kafka never sees it."""
        self.settings = settings
        self.topics = topics
        if signing_key is None:
            if key_id is None or secret is None:
                raise InvalidArgument("give signing_key, or key_id and secret (an HMAC key)")
            signing_key = SigningKey.hmac(key_id, secret)
        self.signing_key = signing_key
        self.timeout = timeout
        self.max_unclaimed = max_unclaimed
        # A read may wait on a worker that asks the run's owner (up to 11 s): more here.
        self.reader = RunReader(worker_urls, http_token=http_token, timeout=min(timeout, 15.0))
        #: proposal id -> its `runstate propose` span's context, while its outcome is
        #: awaited (only when traces record; the oldest go first past max_unclaimed).
        self._proposed: OrderedDict[str, Any] = OrderedDict()
        self._open()

    def _open(self) -> None:
        """The client's own transport and waiting state."""
        raise NotImplementedError

    def _now_ms(self) -> int | None:
        """The time proposals are signed at and decisions expire from (None: this host's
        clock, now; a test environment's clients answer its clock)."""
        return None

    def _record(
        self,
        run_id: str,
        event: str,
        payload: dict[str, Any] | None = None,
        reason: str | None = None,
        expected_revision: int | None = None,
        metadata: dict[str, Any] | None = None,
        proposal_id: str | None = None,
    ) -> ProposalRecord:
        """The proposal's record, signed now, with the trace context of its `runstate
        propose` span when traces record (processor/observe/traces.py)."""
        record = proposal_record(
            self.topics,
            self.signing_key,
            run_id,
            event,
            payload=payload,
            reason=reason,
            expected_revision=expected_revision,
            metadata=metadata,
            proposal_id=proposal_id,
            now_ms=self._now_ms(),
        )
        headers, span = traces.proposed(run_id, event, record.proposal_id, self.topics.proposals)
        if span is not None:
            record.headers.extend(headers)
            self._proposed[record.proposal_id] = span
            while len(self._proposed) > self.max_unclaimed:
                self._proposed.popitem(last=False)
        return record

    def _awaiting(self, proposal_id: str) -> Any:
        """The `runstate outcome` span while the proposal's outcome is awaited."""
        return traces.awaiting(self._proposed.pop(proposal_id, None), proposal_id)

    def _create_record(
        self,
        run_id: str,
        machine: str,
        max_retries: int | None,
        success_criteria: list[str] | None,
        deadlines: dict[str, int] | None,
        proposal_id: str | None,
    ) -> ProposalRecord:
        """The record that creates the run on `machine`, signed now."""
        payload = create_payload(
            machine,
            max_retries=max_retries,
            success_criteria=success_criteria,
            deadlines=deadlines,
        )
        return self._record(run_id, "create", payload, proposal_id=proposal_id)
