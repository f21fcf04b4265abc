"""`runstate worker`: the native exactly-once stream processor."""

import faulthandler
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable

import click

from processor.cli.flags import settings_options
from processor.cli.options import KafkaContext, pass_kafka
from processor.engine.parse import MachineFileError
from processor.history.versions import deployed_catalog, load_operator_key
from processor.observe.logs import setup_logging
from processor.observe.stacks import dump_stacks_on
from processor.observe.traces import configure_worker
from processor.runtimes.errors import ClientBroken, WorkerError
from processor.runtimes.native.heap import tune_collector
from processor.runtimes.native.http import serve
from processor.runtimes.native.worker import Worker
from processor.runtimes.settings import WorkerConfig, WorkerSettings
from processor.trust.http_auth import HttpTokens, TokenError, bind_refusal, is_loopback
from processor.trust.keyring import KeyringError, load_keyring

#: A worker waits longer than a command for Kafka's first answer (a broker may be
#: starting beside it), and says in one line that none came within 10 s.
WORKER_REACH_S = 10.0


@click.command()
@pass_kafka
@settings_options(WorkerSettings)
def worker(kafka: KafkaContext, settings: WorkerSettings) -> None:
    """Run a worker: decide proposals, publish transitions and rejections exactly once.

    Start more workers with the same --group-id (each with its own --state-dir) to
    share the partitions. SIGTERM or Ctrl-C commits what is in flight and leaves;
    SIGUSR1 writes every thread's stack to the log (for a worker that seems stuck).
    """
    # A crash inside librdkafka or RocksDB leaves the Python stacks in the log, and
    # `kill -USR1 <pid>` prints them for a worker that seems stuck (stacks.py).
    faulthandler.enable()
    dump_stacks_on(signal.SIGUSR1)
    # SIGTERM or Ctrl-C from now on stops the worker cleanly, also one that comes while it
    # starts (seconds on a busy machine: the fault harness scaled workers down before
    # they had installed a handler, and they died of the signal).
    asked = StopRequest()
    if settings.runtime == "native":  # (Faust handles the signals itself)
        for signum in STOP_SIGNALS:
            signal.signal(signum, asked.handle)
    setup_logging(
        settings.log_level, settings.log_format
    )  # either runtime: its worker leaves it alone
    refused = configure_worker(
        settings.traces, settings.traces_file, "runstate-worker", settings.worker_id
    )
    if refused is not None:
        raise click.UsageError(refused)
    # Before anything connects: a worker that would serve every run to anyone who
    # reaches its port does not start (exit 2, a usage error: a setting is missing).
    try:
        http_tokens = HttpTokens.from_env(settings.http_tokens_file)
    except TokenError as exc:
        raise click.UsageError(str(exc)) from exc
    http_host = settings.http_host
    refused = bind_refusal(http_host, http_tokens, settings.http_insecure)
    if refused is not None:
        raise click.UsageError(refused)
    if not http_tokens.configured and not is_loopback(http_host):
        logging.getLogger("runstate.http").warning(
            "the HTTP API on %s asks for no token (--http-insecure): whoever reaches it "
            "reads every run",
            http_host,
        )
    try:
        keyring = load_keyring(settings.keyring_file, os.environ.get("RUNSTATE_KEYRING"))
        signer = (
            None
            if settings.operator_key_file is None and settings.operator_key_id is None
            else load_operator_key(keyring, settings.operator_key_id, settings.operator_key_file)
        )
        # The versions new runs get (these files), and every operator-signed version
        # published before, for the runs pinned to them; with an operator's key, these
        # are published for the other workers.
        machines = deployed_catalog(
            settings.machine_path, kafka.reached(WORKER_REACH_S), kafka.topics, keyring, signer
        )
        config = WorkerConfig(
            kafka=kafka.settings,
            topics=kafka.topics,
            keyring=keyring,
            machines=machines,
            settings=settings,
            http_tokens=http_tokens,
        )
        tune_collector()  # start-up is over: see heap.py
        if settings.runtime == "faust":
            from processor.runtimes.faust import run_faust_worker

            # Faust binds its port later, so a free one is picked here (its URL is
            # advertised in the consumer's client id before the server listens).
            port = settings.http_port or free_port(http_host)
            url = settings.advertised_url or f"http://{shown_host(http_host)}:{port}"
            run_faust_worker(config, port, settings.log_level, url)
            return
        running = Worker(config)
        asked.forward_to(running.stop)
        # The API first: its port goes into the consumer's client.id (cluster queries).
        server = serve(running, http_host, settings.http_port)
        host, port = str(server.server_address[0]), int(server.server_address[1])
        running.advertised_url = settings.advertised_url or f"http://{shown_host(host)}:{port}"
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
