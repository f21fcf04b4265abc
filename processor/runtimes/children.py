"""Child processes (brokers, workers) that must not outlive whoever started them."""

import signal


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Run in the child before exec: send it `sig` when the starting thread dies,
    however it dies (Linux PR_SET_PDEATHSIG; elsewhere a no-op). The kernel watches the
    thread that forked, not the process: start children from a thread that lives as
    long as they should."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, sig)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
