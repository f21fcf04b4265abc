"""A worker asks, and sends its token to, configured peers only: whatever URL a member of
its consumer group advertises (another host or port, user-info tricks, paths, case and
trailing-dot variants, IPv6) and wherever a peer redirects, no request and no
Authorization header reaches an address that is not configured; its partitions are
reported missing, with a warning naming it."""

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from processor.kafka.partitioning import partition_for
from processor.serving import peers, run_reads
from processor.serving.peers import Peer, origin
from processor.trust.http_auth import HttpTokens
from tests.examples import examples
from tests.unit.test_api import FakeNode, get

pytestmark = pytest.mark.unit

TOKEN = "peer-token-0123456789"


@dataclass
class Recorder:
    """What an HTTP server was sent: each request's path and Authorization header. It
    answers as a peer owning partition 1, or redirects to `redirect_to`."""

    url: str = ""
    seen: list[tuple[str, str | None]] = field(default_factory=list)
    redirect_to: str | None = None
    redirect_code: int = 307


@contextmanager
def recording() -> Iterator[Recorder]:
    recorder = Recorder()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            recorder.seen.append((self.path, self.headers.get("Authorization")))
            if recorder.redirect_to is not None:
                self.send_response(recorder.redirect_code)
                self.send_header("Location", recorder.redirect_to + self.path)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            data = json.dumps({"items": [], "partitions": [1]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    recorder.url = f"http://127.0.0.1:{server.server_address[1]}"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield recorder
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def good() -> Iterator[Recorder]:
    """The configured peer."""
    with recording() as recorder:
        yield recorder


@pytest.fixture(scope="module")
def evil() -> Iterator[Recorder]:
    """An address a group member advertises, that no one configured."""
    with recording() as recorder:
        yield recorder


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def hostile_urls(good_port: int, evil_port: int) -> st.SearchStrategy[str]:
    """URLs that name the evil server, or the good one in a form that is no plain
    origin, or nothing at all."""
    hosts = st.sampled_from(
        ["127.0.0.1", "LOCALHOST", "localhost.", "127.1", "0x7f.1", "[::1]", "[::ffff:127.0.0.1]"]
    )
    schemes = st.sampled_from(["http", "HTTP", "https", "ftp", ""])
    userinfo = st.sampled_from(
        ["", f"127.0.0.1:{good_port}@", "user:pass@", "@", f"127.0.0.1%3A{good_port}@"]
    )
    suffixes = st.sampled_from(
        ["", "/", "/x", "/..", "?q=1", "#frag", f"#@127.0.0.1:{good_port}", "?", "#", "\\@x"]
    )
    built = st.builds(
        lambda scheme, info, host, port, suffix: f"{scheme}://{info}{host}:{port}{suffix}",
        schemes,
        userinfo,
        hosts,
        st.sampled_from([evil_port, good_port]),
        suffixes,
    )
    tricks = st.sampled_from(
        [
            f"http://127.0.0.1:{evil_port}",
            f"http://127.0.0.1:{good_port}@127.0.0.1:{evil_port}",
            f"http://127.0.0.1:{good_port}:{evil_port}",
            f"http://127.0.0.1:{evil_port}\\@127.0.0.1:{good_port}",
            f"http://127.0.0.1:{evil_port}#127.0.0.1:{good_port}",
            f" http://127.0.0.1:{evil_port} ",
            "http://evil%2e127.0.0.1",
            "",
            "not a url",
        ]
    )
    return st.one_of(built, tricks, st.text(max_size=40))


@settings(
    max_examples=examples(300),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_no_request_and_no_token_reach_an_address_not_configured(
    good: Recorder, evil: Recorder, data: st.DataObject, monkeypatch: pytest.MonkeyPatch
) -> None:
    good_origin = origin(good.url)
    advertised = data.draw(hostile_urls(_port(good.url), _port(evil.url)), "advertised")
    targets: list[str] = []
    real_ask = peers.ask

    def spying(url: str, *args: Any, **kwargs: Any) -> Any:
        targets.append(url)
        return real_ask(url, *args, **kwargs)

    monkeypatch.setattr(peers, "ask", spying)
    good.seen.clear()
    evil.seen.clear()
    node = FakeNode(
        owned_partitions=[0],
        peer_list=[Peer(advertised, (1, 2))],
        configured_peers=(good_origin,),
        http_tokens=HttpTokens([TOKEN]),
    )
    status, body, _ = get(node, "/stats", f"Bearer {TOKEN}")
    assert status == 200
    assert evil.seen == []
    assert set(targets) <= {good_origin}  # nothing but the configured URL is asked
    if targets:  # the advertised URL is the configured origin, spelled another way
        assert peers.configured_peer(advertised, (good_origin,)) == good_origin
        assert good.seen == [("/stats?local=1", f"Bearer {TOKEN}")]
        assert body["missing_partitions"] == [2]
    else:
        assert good.seen == []
        assert body["missing_partitions"] == [1, 2]


def test_an_advertised_url_not_configured_is_warned_about_and_missing(
    good: Recorder, evil: Recorder, caplog: pytest.LogCaptureFixture
) -> None:
    evil.seen.clear()
    node = FakeNode(
        owned_partitions=[0],
        peer_list=[Peer(evil.url, (1, 2))],
        configured_peers=(origin(good.url),),
        http_tokens=HttpTokens([TOKEN]),
    )
    with caplog.at_level("WARNING", logger="runstate.http"):
        _, body, _ = get(node, "/runs?state=paused", f"Bearer {TOKEN}")
    assert body["missing_partitions"] == [1, 2] and evil.seen == []
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == 1
    assert repr(evil.url) in warned[0] and "--peer" in warned[0] and "[1, 2]" in warned[0]


def test_members_advertising_one_configured_peer_get_it_asked_once(good: Recorder) -> None:
    """A member copying a configured peer's URL does not make its answer count twice."""
    good.seen.clear()
    node = FakeNode(
        owned_partitions=[0],
        partition_count=2,
        peer_list=[Peer(good.url, (1,)), Peer(good.url.upper(), (1,)), Peer(good.url + "/", ())],
        configured_peers=(origin(good.url),),
    )
    _, body, _ = get(node, "/stats")
    assert len(good.seen) == 1 and body["missing_partitions"] == []


@pytest.mark.parametrize("code", [301, 302, 303, 307, 308])
def test_a_redirect_from_a_configured_peer_is_not_followed(
    good: Recorder, evil: Recorder, code: int
) -> None:
    """urllib would carry the Authorization header to wherever a redirect points."""
    good.seen.clear()
    evil.seen.clear()
    good.redirect_to, good.redirect_code = evil.url, code
    try:
        node = FakeNode(
            owned_partitions=[0],
            peer_list=[Peer(good.url, (1,))],
            configured_peers=(origin(good.url),),
            http_tokens=HttpTokens([TOKEN]),
        )
        _, body, _ = get(node, "/stats", f"Bearer {TOKEN}")
    finally:
        good.redirect_to = None
    assert [auth for _, auth in good.seen] == [f"Bearer {TOKEN}"]
    assert evil.seen == []
    assert body["missing_partitions"] == [1, 2]  # as a peer that did not answer


@settings(max_examples=examples(200), deadline=None)
@given(advertised=hostile_urls(8080, 6666))
def test_the_inspector_redirects_a_browser_to_configured_peers_only(advertised: str) -> None:
    node = FakeNode(
        owned_partitions=[],
        peer_list=[Peer(advertised, (0, 1, 2))],
        configured_peers=("http://127.0.0.1:8080",),
    )
    status, _, answer = get(node, "/inspect?run=r1")
    if status == 307:
        location = dict(answer.headers)["Location"]
        assert location == "http://127.0.0.1:8080/inspect?run=r1"
        assert peers.configured_peer(advertised, node.configured_peers) is not None
    else:
        assert status == 503


@settings(max_examples=examples(300), deadline=None)
@given(
    scheme=st.sampled_from(["http", "HTTP", "Http"]),
    host=st.sampled_from(["worker-2", "WORKER-2", "worker-2."]),
    port=st.sampled_from(["", ":80"]),
    slash=st.sampled_from(["", "/"]),
)
def test_spellings_of_one_origin_are_one_peer(
    scheme: str, host: str, port: str, slash: str
) -> None:
    assert origin(f"{scheme}://{host}{port}{slash}") == "http://worker-2:80"


def test_origins_of_addresses_and_what_is_no_origin() -> None:
    assert origin("https://[0:0:0:0:0:0:0:1]") == "https://[::1]:443"
    assert origin("http://[::FFFF:7f00:1]:8080") == "http://[::ffff:7f00:1]:8080"
    assert origin("http://127.0.0.1:8080") == "http://127.0.0.1:8080"
    for bad in (
        "http://u@h:1",
        "http://u:p@h:1",
        "http://h:1/path",
        "http://h:1?x",
        "http://h:1#f",
        "http://h:1?",
        "ftp://h:1",
        "h:1",
        "http://:1",
        "http://h:99999",
        "http://ev%2eil:1",
        "http://h:1\\@x",
        "",
    ):
        with pytest.raises(ValueError, match="scheme://host:port"):
            origin(bad)


def _run_in(partition: int, count: int = 3) -> str:
    return next(f"r{i}" for i in range(1000) if partition_for(f"r{i}", count) == partition)


@settings(
    max_examples=examples(300),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(data=st.data(), history=st.booleans())
def test_a_read_of_a_run_owned_elsewhere_goes_to_configured_peers_only(
    good: Recorder, evil: Recorder, data: st.DataObject, history: bool
) -> None:
    """A worker asks the owner of a run it does not own for it, with its token, when the
    owner is a configured peer; otherwise it answers 421 naming the member that claims
    the run, and nothing reaches that member."""
    good_origin = origin(good.url)
    advertised = data.draw(hostile_urls(_port(good.url), _port(evil.url)), "advertised")
    good.seen.clear()
    evil.seen.clear()
    node = FakeNode(
        owned_partitions=[0],
        peer_list=[Peer(advertised, (1, 2))],
        configured_peers=(good_origin,),
        http_tokens=HttpTokens([TOKEN]),
    )
    run_id = _run_in(1)
    suffix = "/history" if history else ""
    status, body, _ = get(node, f"/runs/{run_id}{suffix}?min_revision=3", f"Bearer {TOKEN}")
    assert evil.seen == []
    if peers.configured_peer(advertised, (good_origin,)) == good_origin:
        # The owner's answer, passed on (this recorder answers every GET alike).
        assert status == 200 and body == {"items": [], "partitions": [1]}
        path = f"/runs/{run_id}{suffix}?min_revision=3&forwarded=1"
        assert good.seen == [(path, f"Bearer {TOKEN}")]
    else:
        assert good.seen == []
        assert status == 421 and body["partition"] == 1
        assert body["owner"] == advertised and "--peer" in body["error"]


def test_a_forwarded_read_is_not_forwarded_again(good: Recorder) -> None:
    """Two workers that disagree on an owner (a rebalance under way) do not bounce a
    read between them: the one asked on another's behalf answers 421, naming who it
    thinks owns the run."""
    good.seen.clear()
    node = FakeNode(
        owned_partitions=[0],
        peer_list=[Peer(good.url, (1, 2))],
        configured_peers=(origin(good.url),),
    )
    run_id = _run_in(2)
    status, body, _ = get(node, f"/runs/{run_id}?forwarded=1")
    assert good.seen == []
    assert status == 421 and body["owner"] == good.url and body["partition"] == 2
    status, body, _ = get(node, f"/runs/{run_id}")
    assert status == 200 and [path for path, _ in good.seen] == [f"/runs/{run_id}?forwarded=1"]


def test_an_owner_that_does_not_answer_is_named_in_a_503() -> None:
    gone = "http://127.0.0.1:9"  # discard: nothing listens
    node = FakeNode(owned_partitions=[0], peer_list=[Peer(gone, (1, 2))], configured_peers=(gone,))
    status, body, _ = get(node, f"/runs/{_run_in(1)}")
    assert status == 503 and body["owner"] == gone and "ask again" in body["error"]


def test_no_owner_known_is_a_421_without_one() -> None:
    node = FakeNode(owned_partitions=[0], peer_list=[])
    status, body, _ = get(node, f"/runs/{_run_in(1)}/history")
    assert status == 421 and "owner" not in body and body["partition"] == 1


def test_forwards_are_bounded_so_they_never_take_every_thread(good: Recorder) -> None:
    """Each forward holds a server thread while the owner answers: past MAX_FORWARDS at
    once a read is answered 503 at once, naming the owner, and nothing is sent."""
    good.seen.clear()
    node = FakeNode(
        owned_partitions=[0], peer_list=[Peer(good.url, (1, 2))], configured_peers=(good.url,)
    )
    held = 0
    try:
        while run_reads._FORWARDING.acquire(blocking=False):
            held += 1
        assert held == run_reads.MAX_FORWARDS
        status, body, _ = get(node, f"/runs/{_run_in(1)}")
        assert status == 503 and body["owner"] == good.url and good.seen == []
    finally:
        for _ in range(held):
            run_reads._FORWARDING.release()
    assert get(node, f"/runs/{_run_in(1)}")[0] == 200


def test_a_run_this_worker_claims_under_another_spelling_is_not_called_unconfigured() -> None:
    node = FakeNode(
        owned_partitions=[],
        advertised_url="http://worker-1:8080",
        peer_list=[Peer("HTTP://WORKER-1:8080/", (0, 1, 2))],
    )
    status, body, _ = get(node, f"/runs/{_run_in(1)}")
    assert status == 421 and "owner" not in body and "--peer" not in body["error"]
