"""Child processes (brokers, workers) that must not outlive whoever started them."""

import signal


def die_with_parent() -> None:
    """Run in the child before exec: SIGTERM it when the starting process dies, however
    it dies (Linux PR_SET_PDEATHSIG; elsewhere a no-op)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
