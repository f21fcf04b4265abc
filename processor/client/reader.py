"""Reads committed runs from the workers' HTTP API (blocking; the asyncio client calls it
in a thread)."""

import json
import os
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

from processor.trust.http_auth import CLIENT_TOKEN_ENV, bearer
from schemas.messages import RunSnapshot, Transition

from .errors import InvalidArgument, NotServed, Unavailable


def worker_url(url: str) -> str:
    """`url` as a base the reader's paths are added to: http or https, a host, an optional
    port and path (a proxy's prefix); InvalidArgument for anything else."""
    advice = "give a worker's URL as http(s)://host:port, e.g. http://127.0.0.1:8080"
    try:
        parts = urllib.parse.urlsplit(url.strip())
        parts.port  # noqa: B018 (parsed on access: a bad port raises here)
    except ValueError as exc:
        raise InvalidArgument(f"worker URL {url!r} is not a URL ({exc}); {advice}") from None
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        raise InvalidArgument(f"worker URL {url!r} is not an http(s) URL with a host; {advice}")
    if parts.query or parts.fragment or "@" in parts.netloc:
        raise InvalidArgument(
            f"worker URL {url!r} has a query, fragment or user info; {advice} (a token goes "
            "in http_token= or RUNSTATE_HTTP_TOKEN)"
        )
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))


class RunReader:
    """Reads committed runs from the workers' HTTP API; the owning worker answers. It
    sends `http_token` (default: RUNSTATE_HTTP_TOKEN) to the workers, which ask for one
    when they have tokens configured. `Unavailable` when no given worker could be
    reached at all; `NotServed` when they answered but none could serve the read.

    Reads are read-your-writes: a run's read is never older than the latest transition
    of it this reader was shown (`saw`). A worker moves its state just after the
    transaction that committed the transition, so it is asked for at least that revision
    (of the same run, not an older one the id once named) and waits for it. The latest
    `SEEN_RUNS` runs are remembered; `min_revision=` asks for a revision explicitly."""

    SEEN_RUNS = 10_000

    def __init__(
        self, worker_urls: Iterable[str], *, http_token: str | None = None, timeout: float = 10.0
    ) -> None:
        self._worker_urls = [worker_url(u) for u in worker_urls]
        self._headers = bearer(http_token or os.environ.get(CLIENT_TOKEN_ENV))
        self.timeout = timeout
        #: run id -> (revision, at_ms) of its latest transition shown
        self._seen: OrderedDict[str, tuple[int, int]] = OrderedDict()
        self._seen_lock = threading.Lock()  # a sync client may be shared by threads

    def saw(self, outcome: object) -> None:
        """Remember a transition the caller was given, if it is the run's latest yet: a
        later revision, or the create of a run of that id made anew after the one this
        reader knew was forgotten. An older one shown late (a retry's answer) changes
        nothing."""
        if not isinstance(outcome, Transition):
            return
        run_id = outcome.run_id
        with self._seen_lock:
            known = self._seen.get(run_id)
            if (
                known is None
                or outcome.revision > known[0]
                or (outcome.from_state is None and outcome.at_ms > known[1])
            ):
                self._seen[run_id] = (outcome.revision, outcome.at_ms)
            self._seen.move_to_end(run_id)
            while len(self._seen) > self.SEEN_RUNS:
                self._seen.popitem(last=False)

    def _run_path(self, run_id: str, suffix: str, min_revision: int | None) -> str:
        path = f"/runs/{urllib.parse.quote(run_id, safe='')}{suffix}"
        if min_revision is not None:
            return f"{path}?min_revision={min_revision}"
        with self._seen_lock:
            known = self._seen.get(run_id)
        if known is None:
            return path
        revision, at_ms = known
        return f"{path}?min_revision={revision}&at_ms={at_ms}"

    def _get(self, path: str, timeout: float | None = None) -> Any:
        if not self._worker_urls:
            raise ValueError("no worker URL given (worker_urls=..., RUNSTATE_WORKER_URL)")
        errors = []
        unreachable = 0
        for base in self._worker_urls:
            try:
                request = urllib.request.Request(base + path, headers=self._headers)
                with urllib.request.urlopen(request, timeout=timeout or self.timeout) as response:
                    return json.loads(response.read())
            except urllib.error.HTTPError as exc:
                if exc.code == 404:
                    return None
                if exc.code == 401:
                    errors.append(f"{base}: 401, {self._unauthorized()}")
                    continue
                errors.append(f"{base}: {exc.code}{_said(exc)}")  # 421: not owned here
            except OSError as exc:
                unreachable += 1
                errors.append(f"{base}: {exc}")
        if unreachable == len(self._worker_urls):
            raise Unavailable(
                f"no worker could be reached for {path}: {'; '.join(errors)}; are the "
                "workers running, with --http-port, at these URLs (worker_urls=, "
                "RUNSTATE_WORKER_URL)?"
            )
        raise NotServed(f"no worker could answer {path}: {'; '.join(errors)}")

    def _unauthorized(self) -> str:
        if not self._headers:
            return f"the worker wants a token: set {CLIENT_TOKEN_ENV} (http_token=, --http-token)"
        return "the worker does not accept the token sent: is it a current one?"

    def snapshot(
        self, run_id: str, timeout: float | None = None, *, min_revision: int | None = None
    ) -> RunSnapshot | None:
        """The run's committed snapshot, from whichever given worker owns it, at
        `min_revision` or later (default: the latest this reader saw)."""
        data = self._get(self._run_path(run_id, "", min_revision), timeout)
        return None if data is None else RunSnapshot.model_validate_json(json.dumps(data))

    def history(
        self, run_id: str, timeout: float | None = None, *, min_revision: int | None = None
    ) -> list[Transition]:
        """The run's transitions, oldest first, up to `min_revision` or later (default:
        the latest this reader saw)."""
        data = self._get(self._run_path(run_id, "/history", min_revision), timeout) or []
        return [Transition.model_validate_json(json.dumps(t)) for t in data]

    def runs_in_state(
        self, state: str, machine: str | None = None, limit: int = 100, after: str | None = None
    ) -> dict[str, Any]:
        """One page of runs in `state` across the cluster, longest there first:
        {"runs": [...], "next": cursor or None, "missing_partitions": [...]}."""
        params = {"state": state, "limit": str(limit)}
        if machine is not None:
            params["machine"] = machine
        if after is not None:
            params["after"] = after
        result: dict[str, Any] = self._get("/runs?" + urllib.parse.urlencode(params))
        return result

    def stats(self) -> dict[str, Any]:
        """Runs per machine and state across the cluster, with the oldest entry in each."""
        result: dict[str, Any] = self._get("/stats")
        return result


def _said(refusal: urllib.error.HTTPError) -> str:
    """What a worker's JSON error body says, if anything."""
    try:
        said = json.loads(refusal.read()).get("error")
    except (OSError, ValueError, AttributeError):
        return ""
    return f" ({said})" if isinstance(said, str) else ""
