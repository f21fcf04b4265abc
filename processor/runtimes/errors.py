"""What a runtime raises when it cannot go on, shared by both runtimes and the CLI."""

import threading


class WorkerError(RuntimeError):
    """The worker cannot run as configured; the message says what to change."""


class ClientBroken(WorkerError):
    """The transactional producer cannot go on (a fatal error, e.g. after a broker
    restart the coordinator ended its transaction: INVALID_TXN_STATE). Nothing is
    half-applied: the stores move only after a commit returned. The process should
    start again (the CLI restarts it in place)."""


class ClientHung(ClientBroken):
    """A transactional call of librdkafka did not return long after its timeout
    (librdkafka #5456, #5511: send_offsets_to_transaction can block forever when the
    group coordinator goes away, as in a broker restart). `returned` is set when the
    call does return at last (None: no call is left running, e.g. a queue that stayed
    full)."""

    def __init__(self, message: str, returned: threading.Event | None = None) -> None:
        super().__init__(message)
        self.returned = returned
