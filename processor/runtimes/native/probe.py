"""`python -m processor.runtimes.native.probe [livez|readyz]`: exit 0 when the worker on this
machine answers 200 there, else 1. For container health checks (the image has no curl):
the port is RUNSTATE_HTTP_PORT (8080 by default). /readyz wants a token when the worker
has some: the probe sends RUNSTATE_HTTP_TOKEN, else the first of the worker's own
(RUNSTATE_HTTP_TOKENS, RUNSTATE_HTTP_TOKENS_FILE), as it runs beside the worker with the
worker's environment."""

import os
import sys
import urllib.error
import urllib.request

from processor.trust.http_auth import CLIENT_TOKEN_ENV, HttpTokens, TokenError, bearer


def token() -> str | None:
    try:
        return os.environ.get(CLIENT_TOKEN_ENV) or HttpTokens.from_env().first()
    except TokenError as exc:  # the worker refuses to start on it too
        print(f"probe: {exc}", file=sys.stderr)
        return None


def probe(path: str, port: int, timeout: float = 2.0) -> bool:
    url = f"http://127.0.0.1:{port}/{path}"
    request = urllib.request.Request(url, headers=bearer(token()) if path != "livez" else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def main(argv: list[str]) -> int:
    path = argv[1] if len(argv) > 1 else "readyz"
    if path not in ("livez", "readyz"):
        print("usage: python -m processor.runtimes.native.probe [livez|readyz]", file=sys.stderr)
        return 2
    return 0 if probe(path, int(os.environ.get("RUNSTATE_HTTP_PORT", "8080"))) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
