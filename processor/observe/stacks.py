"""`kill -USR1 <pid>`: every thread's Python stack, written to the log (stderr).

faulthandler's own registration dumps from inside the signal handler while the other
threads run on, and reading their frames as they change crashed a worker (SIGSEGV,
beside a busy HTTP thread). Here a thread of its own waits for the signal, blocked in
every thread started after it, and dumps while it holds the GIL, so no frame it reads
moves: it answers also while the main thread is stuck in a call that let the GIL go. A
thread started before still takes the signal: the main thread then dumps, between two
bytecodes.
"""

import faulthandler
import signal
import threading

_waiting: list[threading.Thread] = []


def dump_stacks_on(sig: signal.Signals = signal.SIGUSR1) -> None:
    """Call from the main thread, before other threads start; again after whatever took
    the signal's handler (it sets the main thread's fallback again, one waiter kept)."""
    signal.signal(sig, _dump_from_main)
    if not _waiting:
        signal.pthread_sigmask(signal.SIG_BLOCK, {sig})  # inherited by threads from now on
        waiter = threading.Thread(target=_wait, args=(sig,), name="runstate-stacks", daemon=True)
        waiter.start()
        _waiting.append(waiter)


def _wait(sig: signal.Signals) -> None:
    while True:
        signal.sigwait({sig})
        faulthandler.dump_traceback(all_threads=True)


def _dump_from_main(_signum: int, _frame: object) -> None:
    faulthandler.dump_traceback(all_threads=True)
