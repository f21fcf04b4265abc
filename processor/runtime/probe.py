"""`python -m processor.runtime.probe [livez|readyz]`: exit 0 when the worker on this
machine answers 200 there, else 1. For container health checks (the image has no curl):
the port is RUNSTATE_HTTP_PORT (8080 by default)."""

import os
import sys
import urllib.error
import urllib.request


def probe(path: str, port: int, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/{path}", timeout=timeout) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def main(argv: list[str]) -> int:
    path = argv[1] if len(argv) > 1 else "readyz"
    if path not in ("livez", "readyz"):
        print("usage: python -m processor.runtime.probe [livez|readyz]", file=sys.stderr)
        return 2
    return 0 if probe(path, int(os.environ.get("RUNSTATE_HTTP_PORT", "8080"))) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
