"""The HTTP API's tokens (processor/trust/http_auth.py) as both runtimes apply them through
processor/serving/api.py: who is answered, the 401's headers and words, a tokens file rotated
under a running worker, and the bind rule a worker starts by (no broker)."""

import base64
import json
import logging
import os
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from processor.cli.main import cli
from processor.client import NotServed, RunReader
from processor.runtimes.native import probe
from processor.serving.answers import JSON
from processor.trust.http_auth import (
    HttpTokens,
    TokenError,
    bind_refusal,
    is_loopback,
    parse_token_file,
    presented_token,
)
from tests.unit.test_api import FakeNode, get, owned_run, served_over_http

TOKEN = "tok-current-0123456789"
OLD = "tok-old-abcdefghijklmn"


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


@pytest.fixture
def node() -> FakeNode:
    return FakeNode(runs={"r1": owned_run("r1")}, http_tokens=HttpTokens([TOKEN, OLD]))


def test_every_endpoint_but_livez_wants_a_token(node: FakeNode) -> None:
    for path in ("/runs/r1", "/runs/r1/history", "/metrics", "/inspect?run=r1", "/", "/readyz"):
        status, body, answer = get(node, path)
        assert status == 401 and answer.content_type == JSON, path
        assert answer.headers == (
            ("WWW-Authenticate", 'Bearer realm="runstate"'),
            ("WWW-Authenticate", 'Basic realm="runstate"'),
        )
        assert "Authorization: Bearer <token>" in body["error"]
        assert "RUNSTATE_HTTP_TOKEN" in body["error"]
    # nothing about what is there: an unknown path is refused the same way
    assert get(node, "/no/such/thing")[0] == 401
    status, body, _ = get(node, "/livez")
    assert status == 200 and body["alive"] is True
    assert get(node, "/livez/")[0] == 200


def test_a_wrong_token_is_refused_and_says_it_may_have_been_rotated(node: FakeNode) -> None:
    for authorization in (
        "Bearer nope",
        f"Bearer {TOKEN}x",
        f"Bearer {TOKEN[:-1]}",
        basic("me", "nope"),
        basic(TOKEN, ""),  # the token as the user name is not the password
        f"Token {TOKEN}",  # an unknown scheme
        "Basic !!!",  # not base64
        "Bearer",
    ):
        status, _, answer = get(node, "/runs/r1", authorization)
        assert status == 401 and len(answer.headers) == 2, authorization
    assert "rotated" in get(node, "/runs/r1", "Bearer nope")[1]["error"]


def test_a_right_token_is_served_as_bearer_or_as_basic_password(node: FakeNode) -> None:
    for authorization in (
        f"Bearer {TOKEN}",
        f"bearer   {OLD}",  # the scheme in any case; the old token until it is dropped
        basic("anyone", TOKEN),
        basic("", OLD),
    ):
        status, body, _ = get(node, "/runs/r1", authorization)
        assert status == 200 and body["run_id"] == "r1", authorization
    # Basic splits at the first colon: this password is "b:<token>", not the token
    assert get(node, "/runs/r1", basic("a:b", TOKEN))[0] == 401
    assert get(node, "/metrics", f"Bearer {TOKEN}")[0] == 200
    assert get(node, "/inspect?run=r1", basic("u", TOKEN))[0] == 200


def test_without_tokens_the_api_is_open() -> None:
    node = FakeNode(runs={"r1": owned_run("r1")})
    assert get(node, "/runs/r1")[0] == 200
    assert get(node, "/runs/r1", "Bearer anything")[0] == 200


def test_a_header_with_what_no_token_holds_is_refused_not_an_error(node: FakeNode) -> None:
    for authorization in ("Bearer tok-\ud800", "Bearer tok-\udcff", "Bearer tok-é"):
        assert get(node, "/runs/r1", authorization)[0] == 401


def test_presented_token() -> None:
    assert presented_token(None) is None and presented_token("") is None
    assert presented_token("Bearer  abc ") == "abc"
    assert presented_token(basic("u", "p:q")) == "p:q"
    assert presented_token("Basic " + base64.b64encode(b"no colon").decode()) is None
    assert presented_token("Basic " + base64.b64encode(b"u:\xff").decode()) is None


@pytest.fixture
def served(node: FakeNode) -> Iterator[str]:
    with served_over_http(node) as url:
        yield url


def test_the_native_server_sends_both_challenges_and_reads_the_header(served: str) -> None:
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(served + "/runs/r1", timeout=5)
    assert refused.value.code == 401
    assert refused.value.headers.get_all("WWW-Authenticate") == [
        'Bearer realm="runstate"',
        'Basic realm="runstate"',
    ]
    request = urllib.request.Request(
        served + "/runs/r1", headers={"Authorization": basic("x", TOKEN)}
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        assert json.loads(response.read())["run_id"] == "r1"


def test_the_sdk_sends_its_token_and_says_what_to_do_without_one(
    served: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RUNSTATE_HTTP_TOKEN", raising=False)
    with pytest.raises(NotServed, match="401, the worker wants a token: set RUNSTATE_HTTP_TOKEN"):
        RunReader([served]).snapshot("r1")
    with pytest.raises(NotServed, match="does not accept the token sent"):
        RunReader([served], http_token="nope").snapshot("r1")
    snapshot = RunReader([served], http_token=OLD).snapshot("r1")
    assert snapshot is not None and snapshot.run_id == "r1"
    monkeypatch.setenv("RUNSTATE_HTTP_TOKEN", TOKEN)
    assert RunReader([served]).history("r1")


def test_the_cli_sends_its_token(served: str, runner: CliRunner) -> None:
    result = runner.invoke(cli, ["get", "r1", "--worker-url", served])
    assert result.exit_code == 1 and "set RUNSTATE_HTTP_TOKEN" in result.output
    result = runner.invoke(cli, ["get", "r1", "--worker-url", served, "--http-token", TOKEN])
    assert result.exit_code == 0 and json.loads(result.output)["run_id"] == "r1"
    env = {"RUNSTATE_HTTP_TOKEN": OLD, "RUNSTATE_WORKER_URL": served}
    result = runner.invoke(cli, ["history", "r1"], env=env)
    assert result.exit_code == 0 and len(result.output.splitlines()) == 2
    result = runner.invoke(cli, ["stats"], env=env)
    assert result.exit_code == 0 and "paused" in result.output


def test_the_container_probe_sends_the_workers_first_token(
    served: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = int(served.rsplit(":", 1)[1])
    for name in ("RUNSTATE_HTTP_TOKEN", "RUNSTATE_HTTP_TOKENS", "RUNSTATE_HTTP_TOKENS_FILE"):
        monkeypatch.delenv(name, raising=False)
    assert probe.probe("livez", port)  # open
    assert not probe.probe("readyz", port)
    monkeypatch.setenv("RUNSTATE_HTTP_TOKENS", f"{OLD}, {TOKEN}")  # the worker's own
    assert probe.probe("readyz", port)
    monkeypatch.setenv("RUNSTATE_HTTP_TOKEN", "nope")  # a client's token goes first
    assert not probe.probe("readyz", port)


# -- tokens from the environment and a file ---------------------------------------------
def test_tokens_from_the_environment_and_a_file(tmp_path: Path) -> None:
    file = tmp_path / "tokens"
    file.write_text(f"# rotated 2026-12\n\n{TOKEN}   # the new one\n  {OLD}\n")
    tokens = HttpTokens.from_env(environ={"RUNSTATE_HTTP_TOKENS": " a1, ,b2 "})
    assert tokens.current() == ("a1", "b2") and tokens.first() == "a1"
    tokens = HttpTokens.from_env(environ={"RUNSTATE_HTTP_TOKENS_FILE": str(file)})
    assert tokens.current() == (TOKEN, OLD)
    tokens = HttpTokens.from_env(file, environ={"RUNSTATE_HTTP_TOKENS": "a1"})
    assert tokens.current() == ("a1", TOKEN, OLD) and tokens.configured
    assert not HttpTokens.from_env(environ={"RUNSTATE_HTTP_TOKENS": ""}).configured
    with pytest.raises(TokenError, match="printable ASCII without spaces"):
        HttpTokens.from_env(environ={"RUNSTATE_HTTP_TOKENS": "tok\tx"})
    with pytest.raises(TokenError, match=":2: a token is printable"):
        parse_token_file("ok\ntwo words\n", "f")
    with pytest.raises(TokenError, match="cannot read the tokens file"):
        HttpTokens(file=tmp_path / "missing")
    (tmp_path / "empty").write_text("# nothing yet\n")
    with pytest.raises(TokenError, match="holds no token"):
        HttpTokens(file=tmp_path / "empty")


def _age(file: Path, seconds: float) -> None:
    """Set the file's times `seconds` in the past (past the settling time)."""
    then = time.time_ns() - int(seconds * 1e9)
    os.utime(file, ns=(then, then))


def test_a_rotation_in_the_file_is_picked_up_without_a_restart(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    file = tmp_path / "tokens"
    file.write_text(f"{OLD}\n")
    _age(file, 60)
    tokens = HttpTokens(file=file)
    node = FakeNode(runs={"r1": owned_run("r1")}, http_tokens=tokens)
    assert get(node, "/runs/r1", f"Bearer {OLD}")[0] == 200
    assert get(node, "/runs/r1", f"Bearer {TOKEN}")[0] == 401
    # 1. the new token is added: both are accepted
    file.write_text(f"{OLD}\n{TOKEN}\n")
    _age(file, 30)
    assert get(node, "/runs/r1", f"Bearer {TOKEN}")[0] == 200
    assert get(node, "/runs/r1", f"Bearer {OLD}")[0] == 200
    # 2. the old one is dropped, same size and (as far as the cache can tell) same time:
    # a file this fresh is read again anyway
    file.write_text(f"{TOKEN}\n{TOKEN[::-1]}\n")
    assert get(node, "/runs/r1", f"Bearer {OLD}")[0] == 401
    assert get(node, "/runs/r1", f"Bearer {TOKEN}")[0] == 200
    # 3. a file that cannot be used keeps the tokens read before; an empty one locks out
    file.write_text("not one token\n")
    # Only what this block logs, at ERROR: the INFO lines of the rotations above are
    # captured too whenever an earlier test of the process set the root logger to INFO.
    caplog.clear()
    with caplog.at_level(logging.ERROR, "runstate.http"):
        assert get(node, "/runs/r1", f"Bearer {TOKEN}")[0] == 200
        file.unlink()
        for _ in range(3):
            assert get(node, "/runs/r1", f"Bearer {TOKEN}")[0] == 200
    # each problem logged once, not at every request
    logged = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(logged) == 2 and "a token is printable ASCII" in logged[0]
    assert "cannot read" in logged[1] and "still accepted" in logged[1]
    file.write_text("")
    assert get(node, "/runs/r1", f"Bearer {TOKEN}")[0] == 401
    assert tokens.configured and get(node, "/livez")[0] == 200


def test_an_unchanged_settled_file_is_not_read_again(tmp_path: Path) -> None:
    file = tmp_path / "tokens"
    file.write_text(f"{TOKEN}\n")
    _age(file, 60)
    tokens = HttpTokens(file=file)
    stat = file.stat()
    assert tokens.admits(TOKEN)
    file.write_text(f"{OLD}\n")  # same size, same inode; its old times put back
    os.utime(file, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert tokens.admits(TOKEN) and not tokens.admits(OLD)


# -- the bind rule ---------------------------------------------------------------------
def test_loopback_addresses() -> None:
    for host in ("127.0.0.1", "127.1.2.3", "localhost", "LOCALHOST", "::1", "[::1]"):
        assert is_loopback(host), host
    for host in ("0.0.0.0", "::", "", "10.0.0.5", "worker", "::ffff:10.0.0.1"):
        assert not is_loopback(host), host
    assert is_loopback("::ffff:127.0.0.1")


def test_a_worker_reachable_from_elsewhere_needs_a_token_or_says_so() -> None:
    none, some = HttpTokens(), HttpTokens([TOKEN])
    refused = bind_refusal("0.0.0.0", none, insecure=False)
    assert refused is not None and "RUNSTATE_HTTP_TOKENS" in refused
    assert "--http-insecure" in refused and "--http-host 127.0.0.1" in refused
    assert bind_refusal("0.0.0.0", some, insecure=False) is None
    assert bind_refusal("0.0.0.0", none, insecure=True) is None
    assert bind_refusal("127.0.0.1", none, insecure=False) is None


@pytest.fixture
def runner() -> CliRunner:
    """No RUNSTATE_* of the caller's in the way."""
    return CliRunner(env={k: None for k in os.environ if k.startswith("RUNSTATE_")})


def test_the_worker_refuses_to_start_open_beyond_loopback(
    runner: CliRunner, tmp_path: Path
) -> None:
    # exit 2 before it connects to anything (no broker here)
    result = runner.invoke(cli, ["worker", "--http-host", "0.0.0.0"])
    assert result.exit_code == 2, result.output
    assert "RUNSTATE_HTTP_TOKENS" in result.output and "--http-insecure" in result.output
    result = runner.invoke(cli, ["worker"], env={"RUNSTATE_HTTP_HOST": "10.1.2.3"})
    assert result.exit_code == 2 and "listen on 10.1.2.3" in result.output
    result = runner.invoke(cli, ["worker", "--http-tokens-file", str(tmp_path / "missing")])
    assert result.exit_code == 2 and "cannot read the tokens file" in result.output
    result = runner.invoke(
        cli, ["worker"], env={"RUNSTATE_HTTP_TOKENS": "two words", "RUNSTATE_HTTP_HOST": "::"}
    )
    assert result.exit_code == 2 and "without spaces" in result.output
