"""Who may read a worker's HTTP API: bearer tokens, one rule for both runtimes
(`processor/serving/api.py` asks `refusal` before it routes a GET).

A worker accepts any of its tokens, several at once so that a rotation needs no
downtime (add the new token, move the clients over, drop the old one): those in
RUNSTATE_HTTP_TOKENS (comma-separated) and those in a file (RUNSTATE_HTTP_TOKENS_FILE or
--http-tokens-file: one token per line, `#` comments), which is read again whenever it
changes, so a rotation needs no restart either. A client sends one token, as
`Authorization: Bearer <token>` or as HTTP Basic with the token as the password (any
user name), so that a browser's own prompt opens the inspector. RUNSTATE_HTTP_TOKEN is
the token a client sends (the CLI, the SDK, the container probe).

With no token configured the API is open; a worker allows that only on loopback, or
when told so (`bind_refusal`). /livez is always open: a supervisor's liveness probe
carries no secret, and it says nothing about any run.
"""

import base64
import binascii
import hmac
import ipaddress
import logging
import os
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

log = logging.getLogger("runstate.http")

TOKENS_ENV = "RUNSTATE_HTTP_TOKENS"
TOKENS_FILE_ENV = "RUNSTATE_HTTP_TOKENS_FILE"
CLIENT_TOKEN_ENV = "RUNSTATE_HTTP_TOKEN"
#: Endpoints served without a token (as api.py routes them: the path, unquoted, no slashes
#: at either end).
OPEN_ENDPOINTS = frozenset({"livez"})
#: Sent with every 401, one header each: browsers read one challenge per header (Chromium
#: never splits WWW-Authenticate at commas, so in one header a Basic after a Bearer is
#: not seen, and its prompt never shows).
CHALLENGES = (
    ("WWW-Authenticate", 'Bearer realm="runstate"'),
    ("WWW-Authenticate", 'Basic realm="runstate"'),
)
#: A file changed this recently is read again at every request, even when its size and
#: time look the same: an editor's truncate-then-write can fall within one tick of the
#: file system's clock, and the half-written file must not be what is kept.
SETTLE_NS = 2_000_000_000
#: What a missing file "looks like" to the cache, so that its absence is logged once.
_MISSING = (-1, -1, -1)


class TokenError(ValueError):
    """A token, or a tokens file, that cannot be used; the message says what to fix."""


def _checked(token: str, where: str) -> str:
    if not token.isascii() or not token.isprintable() or any(c in token for c in " ,"):
        raise TokenError(
            f"{where}: a token is printable ASCII without spaces or commas "
            "(make one: python -c 'import secrets; print(secrets.token_urlsafe(32))')"
        )
    return token


def parse_tokens(text: str | None) -> tuple[str, ...]:
    """RUNSTATE_HTTP_TOKENS's value: tokens separated by commas (blanks ignored)."""
    parts = (t.strip() for t in (text or "").split(","))
    return tuple(_checked(t, TOKENS_ENV) for t in parts if t)


def parse_token_file(text: str, name: str) -> tuple[str, ...]:
    """A tokens file: one token per line; blank lines, `#` lines and a ` # ...` after a
    token are comments."""
    tokens = []
    for number, line in enumerate(text.splitlines(), 1):
        token = line.split(" #", 1)[0].split("\t#", 1)[0].strip()
        if token and not token.startswith("#"):
            tokens.append(_checked(token, f"{name}:{number}"))
    return tuple(tokens)


class HttpTokens:
    """The tokens a worker accepts now: the given ones, then its file's as last read.
    Safe to share between server threads."""

    def __init__(self, tokens: Iterable[str] = (), file: Path | None = None) -> None:
        self._given = tuple(tokens)
        self._file = file
        self._lock = threading.Lock()
        self._from_file: tuple[str, ...] = ()
        self._seen: tuple[int, int, int] | None = None  # inode, size, mtime of the last read
        self._reported: tuple[int, int, int] | None = None  # the last problem logged
        if file is not None:
            self._read_first(file)
        if self.configured and not self.current():
            raise TokenError(f"{file} holds no token: put one per line, or unset {TOKENS_FILE_ENV}")

    @classmethod
    def from_env(
        cls, file: Path | None = None, environ: Mapping[str, str] | None = None
    ) -> "HttpTokens":
        """A worker's tokens: RUNSTATE_HTTP_TOKENS, and `file` (a flag's) or else
        RUNSTATE_HTTP_TOKENS_FILE's."""
        environ = os.environ if environ is None else environ
        named = environ.get(TOKENS_FILE_ENV)
        file = file or (Path(named) if named else None)
        return cls(parse_tokens(environ.get(TOKENS_ENV)), file)

    @property
    def configured(self) -> bool:
        """Tokens are asked for (a file counts even while it is empty: never open up)."""
        return bool(self._given) or self._file is not None

    def current(self) -> tuple[str, ...]:
        """Every token accepted now, the file read again if it changed."""
        if self._file is not None:
            with self._lock:
                self._refresh(self._file)
        return self._given + self._from_file

    def first(self) -> str | None:
        """The token this worker sends when it asks the others (they share the list)."""
        tokens = self.current()
        return tokens[0] if tokens else None

    def admits(self, presented: str) -> bool:
        """`presented` is one of the tokens, compared in constant time: every token is
        compared, all the way through, whichever matches."""
        # surrogatepass: whatever a server decoded the header to encodes (never raises),
        # and never to the bytes of another string ("replace" could make a "?")
        given = presented.encode("utf-8", "surrogatepass")
        matches = [hmac.compare_digest(given, t.encode()) for t in self.current()]
        return any(matches)

    def _read_first(self, file: Path) -> None:
        try:
            stat = file.stat()
            self._from_file = parse_token_file(file.read_text(), str(file))
        except OSError as exc:
            raise TokenError(
                f"cannot read the tokens file {file} ({exc.strerror or exc}): "
                f"fix {TOKENS_FILE_ENV} / --http-tokens-file"
            ) from exc
        except UnicodeDecodeError as exc:
            raise TokenError(f"{file} is not text: one token per line") from exc
        self._seen = (stat.st_ino, stat.st_size, stat.st_mtime_ns)

    def _refresh(self, file: Path) -> None:
        try:
            stat = file.stat()
        except OSError as exc:
            self._report(_MISSING, f"cannot read {file} ({exc.strerror or exc})")
            return
        seen = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
        settled = time.time_ns() - stat.st_mtime_ns > SETTLE_NS
        if seen == self._seen and settled:
            return
        try:
            tokens = parse_token_file(file.read_text(), str(file))
        except (OSError, UnicodeDecodeError, TokenError) as exc:
            self._report(seen, str(exc))
            return
        if tokens != self._from_file:
            log.info("%s changed: %d tokens accepted now", file, len(self._given + tokens))
            if not self._given + tokens:
                log.warning("%s holds no token: every request but /livez is refused", file)
        self._from_file, self._seen = tokens, seen

    def _report(self, seen: tuple[int, int, int], problem: str) -> None:
        """A file that cannot be used keeps the tokens read before (a rotation half
        done must not lock every client out); said once per version of the file."""
        if seen != self._reported:
            log.error("%s; the tokens read before are still accepted", problem)
        self._reported = seen


def bearer(token: str | None) -> dict[str, str]:
    """The header a client sends with `token` (none without one)."""
    return {"Authorization": f"Bearer {token}"} if token else {}


def presented_token(authorization: str | None) -> str | None:
    """The token in an Authorization header: Bearer, or Basic's password."""
    scheme, _, credentials = (authorization or "").strip().partition(" ")
    credentials = credentials.strip()
    if scheme.lower() == "bearer":
        return credentials or None
    if scheme.lower() == "basic":
        try:
            decoded = base64.b64decode(credentials, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return None
        _, colon, password = decoded.partition(":")
        return password if colon and password else None
    return None


def refusal(tokens: HttpTokens, endpoint: str, authorization: str | None) -> str | None:
    """None when a request for `endpoint` may be answered; else why not and what to do,
    for a 401's body."""
    if endpoint in OPEN_ENDPOINTS or not tokens.configured:
        return None
    presented = presented_token(authorization)
    if presented is None:
        return (
            "this worker's HTTP API needs a token: send 'Authorization: Bearer <token>' "
            "(or HTTP Basic with the token as the password); runstate's CLI and SDK send "
            f"{CLIENT_TOKEN_ENV} (or --http-token / http_token=)"
        )
    if not tokens.admits(presented):
        return (
            "the token sent is not one this worker accepts (it may have been rotated): "
            f"send a current one, as the worker's {TOKENS_ENV} or {TOKENS_FILE_ENV} lists"
        )
    return None


def is_loopback(host: str) -> bool:
    """`host` binds to this machine only: localhost, 127.0.0.0/8, ::1."""
    if host.lower() == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False  # a name, or "" (every address): it may be reached from elsewhere
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


def bind_refusal(host: str, tokens: HttpTokens, insecure: bool) -> str | None:
    """None when a worker may serve its API on `host` with these tokens; else why not
    and what to set. Open (no token) is allowed on loopback, or when asked for."""
    if tokens.configured or insecure or is_loopback(host):
        return None
    return (
        f"the HTTP API would listen on {host or 'every address'}, which other machines "
        f"can reach, with no token: set {TOKENS_ENV} (comma-separated) or "
        f"{TOKENS_FILE_ENV} / --http-tokens-file to the tokens clients must send; or "
        "bind to loopback (--http-host 127.0.0.1); or pass --http-insecure "
        "(RUNSTATE_HTTP_INSECURE=1) to serve it without authentication on purpose"
    )
