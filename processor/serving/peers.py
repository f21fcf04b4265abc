"""Queries any worker answers for the whole cluster, whichever its runtime: it answers
for the partitions it owns and asks the other members of its consumer group for theirs.
Members are found by describing the group; each advertises its HTTP URL in its Kafka
client.id (as Kafka Streams advertises `application.server`; the Faust runtime through
its `broker_client_id`), so no registry of its own is needed. A worker asks the others
with the first of its HTTP tokens: the workers of a group share them.

Anyone who may join the group can advertise any URL, so an advertised URL only says
which configured peer (`--peer`, RUNSTATE_PEERS) a member claims to be: a worker asks
(and sends its token to) configured peers only, at the URL configured, and follows no
redirect."""

import ipaddress
import json
import logging
import re
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from confluent_kafka.admin import AdminClient

from processor.engine import Machine
from processor.kafka.config import KafkaSettings
from processor.trust.http_auth import TOKENS_ENV, TOKENS_FILE_ENV, bearer

_CLIENT_ID = "runstate-worker@"
log = logging.getLogger("runstate.http")
PEER_ADVICE = "give a peer as scheme://host:port, e.g. --peer http://worker-2:8080"
_HOST_NAME = re.compile(r"[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?(\.[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?)*")
_DEFAULT_PORTS = {"http": 80, "https": 443}


def client_id(url: str) -> str:
    return _CLIENT_ID + url


class RunInState(Protocol):
    """A run found in a state (a row of GET /runs?state=), as either runtime's index
    gives it: the native store's `InState`, the Faust runtime's `Entered`."""

    @property
    def entered_ms(self) -> int: ...

    @property
    def run_id(self) -> str: ...

    @property
    def machine(self) -> str: ...

    @property
    def state(self) -> str: ...


@dataclass(frozen=True)
class StateQuery:
    """Which runs GET /runs asks for: in `state` (any state: None) of `machine` (any:
    None), at most `limit` after the cursor (entered_ms, run_id) `after`, longest there
    first or, `newest`, the latest to enter first."""

    machine: str | None
    state: str | None
    after: tuple[int, str] | None
    limit: int
    newest: bool = False

    def beyond(self, entered_ms: int, run_id: str) -> bool:
        """Whether a run that entered at `entered_ms` comes after the cursor."""
        if self.after is None:
            return True
        return (
            (entered_ms, run_id) < self.after if self.newest else (entered_ms, run_id) > self.after
        )

    def states(self, machines: Mapping[str, Machine]) -> list[tuple[str, str]]:
        """The (machine, state) pairs it looks in."""
        names = [self.machine] if self.machine is not None else sorted(machines)
        if self.state is not None:
            return [(name, self.state) for name in names]
        return [(n, s) for n in names if n in machines for s in machines[n].spec.states]


#: (machine, state, runs, oldest entered_state_at_ms): a row of GET /stats?local=1.
StateStats = tuple[str, str, int, int | None]


@dataclass(frozen=True)
class Peer:
    url: str
    partitions: tuple[int, ...]


def group_members(admin: AdminClient, group_id: str, topic: str) -> list[Peer]:
    """The group's members that advertise a URL, with the partitions of `topic` each owns."""
    try:
        description = admin.describe_consumer_groups([group_id])[group_id].result(timeout=10)
    finally:
        admin.poll(0)  # hands librdkafka's log lines over (they wait for a poll)
    found = []
    for member in description.members:
        if not member.client_id.startswith(_CLIENT_ID):
            continue
        owned = tuple(
            sorted(tp.partition for tp in member.assignment.topic_partitions if tp.topic == topic)
        )
        found.append(Peer(member.client_id[len(_CLIENT_ID) :], owned))
    return found


class GroupMembers:
    """The group's members that advertise a URL (`group_members`), as described at most
    `ttl_s` ago: reads of runs owned elsewhere and cluster queries do not describe the
    group each time. Either runtime's `Node.peers`; thread-safe."""

    def __init__(self, settings: KafkaSettings, group_id: str, topic: str, ttl_s: float = 1.0):
        self._settings, self._group_id, self._topic, self._ttl_s = settings, group_id, topic, ttl_s
        self._admin: AdminClient | None = None  # made at the first query
        self._lock = threading.Lock()
        self._known: tuple[float, list[Peer]] | None = None

    def __call__(self) -> list[Peer]:
        with self._lock:
            if self._known is not None and self._known[0] > time.monotonic():
                return self._known[1]
            if self._admin is None:
                self._admin = AdminClient(self._settings.client())
            members = group_members(self._admin, self._group_id, self._topic)
            self._known = (time.monotonic() + self._ttl_s, members)
            return members


def origin(url: str) -> str:
    """`url` as the origin it names, scheme://host:port: scheme and host in lower case,
    a host name's trailing dot dropped, an IP address in its short form, the port always
    written. ValueError for anything that is not a plain origin (another scheme, user
    info, a path but "/", a query, a fragment, a host that is no name or address)."""
    try:
        parts = urllib.parse.urlsplit(url.strip())
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"'{url}' is not a URL ({exc}); {PEER_ADVICE}") from exc
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS:
        raise ValueError(f"'{url}' is not an http or https URL; {PEER_ADVICE}")
    if "@" in parts.netloc:
        raise ValueError(f"'{url}' has user info (before '@'); {PEER_ADVICE}")
    if parts.path not in ("", "/") or parts.query or parts.fragment or url.strip()[-1] in "?#":
        raise ValueError(f"'{url}' has a path, query or fragment; {PEER_ADVICE}")
    host = (parts.hostname or "").lower()
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        host = host.removesuffix(".")
        if not _HOST_NAME.fullmatch(host):
            raise ValueError(f"'{url}' has no valid host; {PEER_ADVICE}") from None
    else:
        host = f"[{address.compressed}]" if address.version == 6 else address.compressed
    return f"{scheme}://{host}:{port if port is not None else _DEFAULT_PORTS[scheme]}"


def origin_or_none(url: str | None) -> str | None:
    """`origin(url)`, or None for no URL or one that is not an origin."""
    try:
        return None if url is None else origin(url)
    except ValueError:
        return None


def configured_peer(advertised: str, configured: Iterable[str]) -> str | None:
    """The configured peer (an `origin`) that an advertised URL names; None when it
    names none, or is no plain origin: it is then asked nothing and sent no token."""
    try:
        wanted = origin(advertised)
    except ValueError:
        return None
    return wanted if wanted in configured else None


def unconfigured(peer: Peer) -> str:
    """The warning for a group member whose advertised URL is no configured peer."""
    return (
        f"a member of the consumer group advertises {peer.url!r} (partitions "
        f"{list(peer.partitions)}), which is not a configured peer: not asked (its "
        "partitions are reported missing); if it is a worker of this cluster, add its "
        "URL to every worker's --peer (RUNSTATE_PEERS, comma-separated)"
    )


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is an error: urllib would send the Authorization header along to
    wherever it points."""

    def redirect_request(
        self,
        req: urllib.request.Request,
        fp: Any,
        code: int,
        msg: str,
        headers: Any,
        newurl: str,
    ) -> urllib.request.Request | None:
        raise urllib.error.HTTPError(
            req.full_url,
            code,
            f"redirects to {newurl!r}, not followed: a peer is asked at its configured URL",
            headers,
            fp,
        )


_OPENER = urllib.request.build_opener(_NoRedirect)


def ask(url: str, path: str, params: dict[str, str], token: str | None = None) -> Any:
    """GET a peer's answer for its own partitions only (local=1), sending `token`.
    `url` is a configured peer's (`configured_peer`); a redirect is not followed.
    OSError when it cannot be reached or does not answer 200."""
    answer = fetch(url, path, {**params, "local": "1"}, token, timeout=10)
    if answer.status != 200:
        raise OSError(f"{answer.status}: {answer.body[:200]!r}")
    return json.loads(answer.body)


@dataclass(frozen=True)
class Forwarded:
    """A peer's answer, passed on as it came."""

    status: int
    content_type: str
    body: bytes


#: Set on a read forwarded to a run's owner: the owner answers it itself or says 421,
#: and never forwards it again (no loop while two workers disagree on an owner).
FORWARDED = "forwarded"


def fetch(
    url: str, path: str, params: dict[str, str], token: str | None, timeout: float
) -> Forwarded:
    """GET `path`?`params` of the configured peer at `url`, sending `token`; its answer
    whatever its status. OSError when it cannot be reached, refuses the token or
    redirects (a redirect is not followed)."""
    query = urllib.parse.urlencode(params)
    request = urllib.request.Request(f"{url}{path}?{query}", headers=bearer(token))
    try:
        with _OPENER.open(request, timeout=timeout) as response:
            return Forwarded(response.status, response.headers.get_content_type(), response.read())
    except urllib.error.HTTPError as exc:
        with exc:  # its socket goes back whatever it said
            if exc.code == 401:
                raise OSError(
                    "401: it does not accept this worker's token; every worker of the group "
                    f"needs the same {TOKENS_ENV} / {TOKENS_FILE_ENV}"
                ) from exc
            if 300 <= exc.code < 400:
                raise OSError(f"{exc.code}: {exc.reason}") from exc
            return Forwarded(exc.code, exc.headers.get_content_type(), exc.read())


def merge_runs(
    pages: Iterable[list[dict[str, Any]]], limit: int, newest: bool = False
) -> tuple[list[dict[str, Any]], str | None]:
    """Pages of runs (each ordered longest in state first, or with `newest` the latest
    to enter first) as one page of `limit`, and the cursor of the page after it (None at
    the end)."""
    runs = sorted(
        (run for page in pages for run in page),
        key=lambda r: (r["entered_state_at_ms"], r["run_id"]),
        reverse=newest,
    )[:limit]
    cursor = None
    if len(runs) == limit and runs:
        cursor = f"{runs[-1]['entered_state_at_ms']}:{runs[-1]['run_id']}"
    return runs, cursor


def parse_cursor(text: str | None) -> tuple[int, str] | None:
    if not text:
        return None
    entered, sep, run_id = text.partition(":")
    if not sep or not entered.isdigit() or int(entered) >= 2**63:
        raise ValueError(f"after={text!r} is not a cursor from a previous page")
    return int(entered), run_id


def merge_stats(pages: Iterable[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per (machine, state): runs summed, the oldest entry kept."""
    merged: dict[tuple[str, str], dict[str, Any]] = {}
    for page in pages:
        for row in page:
            key = (row["machine"], row["state"])
            into = merged.setdefault(key, {**row, "runs": 0, "oldest_entered_ms": None})
            into["runs"] += row["runs"]
            oldest = row["oldest_entered_ms"]
            if oldest is not None and (
                into["oldest_entered_ms"] is None or oldest < into["oldest_entered_ms"]
            ):
                into["oldest_entered_ms"] = oldest
    return [merged[key] for key in sorted(merged)]
