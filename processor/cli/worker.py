"""`runstate worker`: the native exactly-once stream processor."""

import faulthandler
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable
from pathlib import Path

import click

from processor.cli.options import (
    KafkaContext,
    group_id_option,
    keyring_file_option,
    machine_path_option,
    max_proposal_bytes_option,
    max_state_bytes_option,
    option,
    pass_kafka,
    state_dir_option,
)
from processor.engine.parse import MachineFileError
from processor.history.versions import deployed_catalog, load_operator_key
from processor.kafka.config import WorkerConfig
from processor.observe.logs import FORMATS, setup_logging
from processor.runtimes.errors import ClientBroken, WorkerError
from processor.runtimes.native.heap import tune_collector
from processor.runtimes.native.http import serve
from processor.runtimes.native.worker import Worker
from processor.serving.peers import origin
from processor.trust.http_auth import HttpTokens, TokenError, bind_refusal, is_loopback
from processor.trust.keyring import KeyringError, load_keyring


class PeerUrl(click.ParamType):
    """A peer's URL, as its origin (`peers.origin`); RUNSTATE_PEERS separates them by
    commas."""

    name = "url"
    envvar_list_splitter = ","

    def split_envvar_value(self, rv: str) -> list[str]:
        return [item.strip() for item in rv.split(",") if item.strip()]

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> str:
        try:
            return origin(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


@click.command()
@option(
    "--runtime",
    env="RUNTIME",
    type=click.Choice(["native", "faust"]),
    default="native",
    help="native: confluent-kafka, exactly once. faust: a faust-streaming app over a "
    "rocksdict Table, at least once with recognisable duplicates (see docs/runtimes.md).",
)
@pass_kafka
@group_id_option
@state_dir_option
@option(
    "--worker-id",
    env="WORKER_ID",
    default=None,
    help="Stable id of this worker (transactional.id suffix); kept in the state dir.",
)
@keyring_file_option
@machine_path_option
@option(
    "--http-host",
    env="HTTP_HOST",
    default="127.0.0.1",
    help="HTTP API bind address. Anything but loopback (127.0.0.0/8, ::1, localhost) "
    "needs tokens (RUNSTATE_HTTP_TOKENS or --http-tokens-file) or --http-insecure.",
)
@option("--http-port", env="HTTP_PORT", type=int, default=8080, help="HTTP API port (0: free).")
@option(
    "--http-tokens-file",
    "--http-token-file",
    "http_tokens_file",
    env="HTTP_TOKENS_FILE",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="A file of the tokens the HTTP API accepts, one per line ('#' comments), read "
    "again when it changes (rotation without a restart). Every endpoint but /livez then "
    "wants 'Authorization: Bearer <token>' or HTTP Basic with the token as the password. "
    "RUNSTATE_HTTP_TOKENS may list tokens too (comma-separated); both count. Other "
    "workers of the group are asked with the first token: give them all the same list.",
)
@option(
    "--http-insecure",
    env="HTTP_INSECURE",
    is_flag=True,
    default=False,
    help="Serve the HTTP API without tokens on an address other machines can reach "
    "(refused otherwise). Anyone who reaches the port reads every run.",
)
@option(
    "--advertised-url",
    env="ADVERTISED_URL",
    default=None,
    help="The URL other workers reach this one's HTTP API at, for queries across the "
    "cluster (default: http://<http-host, or this host's name for 0.0.0.0>:<port>).",
)
@option(
    "--peer",
    "peers",
    env="PEERS",
    multiple=True,
    type=PeerUrl(),
    help="The HTTP URL (scheme://host:port) of another worker of the group, as it "
    "advertises it (repeatable; in the environment, comma-separated). Reads across the "
    "cluster ask these only, with the HTTP token: a group member advertising any other "
    "URL is not asked, and its partitions are reported missing.",
)
@option(
    "--commit-interval-ms",
    env="COMMIT_INTERVAL_MS",
    type=click.IntRange(min=1),
    default=100,
    help="Commit the transaction at least this often.",
)
@option(
    "--commit-max-records",
    env="COMMIT_MAX_RECORDS",
    type=click.IntRange(min=1),
    default=1000,
    help="...or after this many proposals, whichever comes first.",
)
@max_proposal_bytes_option
@max_state_bytes_option
@option(
    "--timer-interval-ms",
    env="TIMER_INTERVAL_MS",
    type=click.IntRange(min=10),
    default=200,
    help="How often due deadlines and alerts are looked for (they fire within about "
    "this plus one transaction of their due time).",
)
@option(
    "--timer-key-id",
    env="TIMER_KEY_ID",
    default=None,
    help="HMAC key of the keyring that signs deadline proposals (default: the first "
    "HMAC key with authority runtime).",
)
@option(
    "--timer-key-file",
    env="TIMER_KEY_FILE",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Signing key (a runtime key of the keyring; `runstate keys add` writes one) that "
    "signs deadline proposals: needed when the keyring holds ed25519 keys, whose private "
    "halves are not in it.",
)
@option(
    "--operator-key-file",
    env="OPERATOR_KEY_FILE",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="An operator's signing key (`runstate keys add KEY_ID --operator` writes one): "
    "with it the worker signs and publishes its machine files' versions at start, for "
    "every other worker and auditor. Without one (or --operator-key-id) it publishes "
    "nothing; `runstate machines publish` does, with an operator's key.",
)
@option(
    "--operator-key-id",
    env="OPERATOR_KEY_ID",
    default=None,
    help="An operator's HMAC key of the keyring, instead of --operator-key-file.",
)
@option(
    "--static-membership/--dynamic-membership",
    env="STATIC_MEMBERSHIP",
    default=False,
    help="Static: a worker restarted with the same state dir takes its partitions back at "
    "once, without waiting for the session timeout (best when workers restart in place); "
    "but a stopped one keeps them until that timeout, and rebalances are eager (every "
    "worker pauses while partitions move). Dynamic: cooperative rebalances; a stopped "
    "worker hands over at once, a crashed one after the session timeout.",
)
@option(
    "--log-level",
    env="LOG_LEVEL",
    type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
    default="info",
    help="debug: a line per committed transition and heartbeat, and internals; info: per "
    "rejection, and partitions assigned, restored, released; warning: per DLQ record; "
    "error: state that could not be persisted.",
)
@option(
    "--log-format",
    env="LOG_FORMAT",
    type=click.Choice(FORMATS),
    default="text",
    help="text: readable lines; json: one JSON object per line (fields: time, level, "
    "logger, message, and the record's run_id, event, code...).",
)
def worker(
    runtime: str,
    kafka: KafkaContext,
    group_id: str,
    state_dir: Path,
    worker_id: str | None,
    keyring_file: Path | None,
    machine_paths: tuple[Path, ...],
    http_host: str,
    http_port: int,
    http_tokens_file: Path | None,
    http_insecure: bool,
    advertised_url: str | None,
    peers: tuple[str, ...],
    commit_interval_ms: int,
    commit_max_records: int,
    max_proposal_bytes: int,
    max_state_bytes: int,
    timer_interval_ms: int,
    timer_key_id: str | None,
    timer_key_file: Path | None,
    operator_key_file: Path | None,
    operator_key_id: str | None,
    static_membership: bool,
    log_level: str,
    log_format: str,
) -> None:
    """Run a worker: decide proposals, publish transitions and rejections exactly once.

    Start more workers with the same --group-id (each with its own --state-dir) to
    share the partitions. SIGTERM or Ctrl-C commits what is in flight and leaves;
    SIGUSR1 writes every thread's stack to the log (for a worker that seems stuck).
    """
    # A crash inside librdkafka or RocksDB leaves the Python stacks in the log, and
    # `kill -USR1 <pid>` prints them for a worker that seems stuck.
    faulthandler.enable()
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    # SIGTERM or Ctrl-C from now on stops the worker cleanly, also one that comes while it
    # starts (seconds on a busy machine: the fault harness scaled workers down before
    # they had installed a handler, and they died of the signal).
    asked = StopRequest()
    if runtime == "native":  # (Faust handles the signals itself)
        for signum in STOP_SIGNALS:
            signal.signal(signum, asked.handle)
    setup_logging(log_level, log_format)  # either runtime: its worker leaves it alone
    # Before anything connects: a worker that would serve every run to anyone who
    # reaches its port does not start (exit 2, a usage error: a setting is missing).
    try:
        http_tokens = HttpTokens.from_env(http_tokens_file)
    except TokenError as exc:
        raise click.UsageError(str(exc)) from exc
    refused = bind_refusal(http_host, http_tokens, http_insecure)
    if refused is not None:
        raise click.UsageError(refused)
    if not http_tokens.configured and not is_loopback(http_host):
        logging.getLogger("runstate.http").warning(
            "the HTTP API on %s asks for no token (--http-insecure): whoever reaches it "
            "reads every run",
            http_host,
        )
    try:
        settings = kafka.settings
        keyring = load_keyring(keyring_file, os.environ.get("RUNSTATE_KEYRING"))
        signer = (
            None
            if operator_key_file is None and operator_key_id is None
            else load_operator_key(keyring, operator_key_id, operator_key_file)
        )
        # The versions new runs get (these files), and every operator-signed version
        # published before, for the runs pinned to them; with an operator's key, these
        # are published for the other workers.
        machines = deployed_catalog(machine_paths, settings, kafka.topics, keyring, signer)
        config = WorkerConfig(
            kafka=settings,
            topics=kafka.topics,
            keyring=keyring,
            machines=machines,
            state_dir=state_dir,
            group_id=group_id,
            worker_id=worker_id,
            commit_interval_ms=commit_interval_ms,
            commit_max_records=commit_max_records,
            max_proposal_bytes=max_proposal_bytes,
            max_state_bytes=max_state_bytes,
            timer_interval_ms=timer_interval_ms,
            timer_key_id=timer_key_id,
            timer_key_file=timer_key_file,
            keyring_file=keyring_file,
            static_membership=static_membership,
            http_host=http_host,
            http_tokens=http_tokens,
            peers=tuple(dict.fromkeys(peers)),
        )
        tune_collector()  # start-up is over: see heap.py
        if runtime == "faust":
            from processor.runtimes.faust import run_faust_worker

            # Faust binds its port later, so a free one is picked here (its URL is
            # advertised in the consumer's client id before the server listens).
            port = http_port or free_port(http_host)
            url = advertised_url or f"http://{shown_host(http_host)}:{port}"
            run_faust_worker(config, port, log_level, url)
            return
        running = Worker(config)
        asked.forward_to(running.stop)
        # The API first: its port goes into the consumer's client.id (cluster queries).
        server = serve(running, http_host, http_port)
        host, port = str(server.server_address[0]), int(server.server_address[1])
        running.advertised_url = advertised_url or f"http://{shown_host(host)}:{port}"
        running.start()
    except (ValueError, KeyringError, MachineFileError, WorkerError) as exc:
        raise click.ClickException(str(exc)) from exc
    logging.getLogger("runstate.worker").info(
        "HTTP API on http://%s:%s (advertised as %s)", host, port, running.advertised_url
    )
    # A restart in place blocked them across its exec: any that came meanwhile is
    # delivered now, to the handler, and this worker stops as asked.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    try:
        running.run()
    except ClientBroken as exc:
        server.shutdown()
        restart_in_place(lambda: running.stopping, str(exc))
    finally:
        server.shutdown()


STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}


class StopRequest:
    """SIGTERM or SIGINT, as a signal handler: remembered until there is a worker to
    stop, then passed on to it (at once, if it came first)."""

    def __init__(self) -> None:
        self.asked = False
        self._stop: Callable[[], None] | None = None

    def handle(self, signum: int, frame: object) -> None:
        self.asked = True
        if self._stop is not None:
            self._stop()

    def forward_to(self, stop: Callable[[], None]) -> None:
        self._stop = stop
        if self.asked:
            stop()


def shown_host(host: str) -> str:
    """The bind address as other machines reach it: this host's name for a wildcard."""
    return socket.gethostname() if host in ("0.0.0.0", "::") else host


def free_port(host: str) -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def restart_in_place(stopping: Callable[[], bool], why: str) -> None:
    """The same command again, as a new process image: a restart that needs no
    supervisor, from state that is consistent (stores move only after commits).

    Unless the worker was asked to stop: then it just ends. SIGTERM and SIGINT stay
    blocked across the exec, so one that comes while the new image starts (before its
    handlers exist) waits for them instead of killing it half-started."""
    log = logging.getLogger("runstate.worker")
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    if stopping():  # asked before the block: the handler has run
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        log.error("%s; stopping as asked (nothing half-applied)", why)
        return
    log.error("%s; restarting the worker in place", why)
    os.execv(sys.executable, sys.orig_argv)
