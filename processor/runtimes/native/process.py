"""`runstate worker` as a child process: how the demo (and the tests) run workers."""

import http.client
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from processor.broker.launcher import free_port
from processor.runtimes.children import die_with_parent
from processor.trust.http_auth import TOKENS_ENV, bearer


class WorkerProcess:
    def __init__(
        self,
        *,
        bootstrap: str,
        topic_prefix: str,
        group_id: str,
        state_dir: Path,
        keyring_file: Path,
        log_path: Path,
        extra_args: tuple[str, ...] = (),
        http_token: str | None = None,
        port: int | None = None,
    ) -> None:
        self.port = port or free_port()  # known before it starts: other workers' --peer
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.headers = bearer(http_token)  # what this object sends to the worker's API
        command = [
            sys.executable,
            "-m",
            "processor.cli.main",
            "worker",
            "--bootstrap-servers",
            bootstrap,
            "--topic-prefix",
            topic_prefix,
            "--group-id",
            group_id,
            "--state-dir",
            str(state_dir),
            "--keyring-file",
            str(keyring_file),
            "--http-port",
            str(self.port),
            *extra_args,
        ]
        # Only the flags above configure it, not whatever RUNSTATE_* the caller has set.
        env = {k: v for k, v in os.environ.items() if not k.startswith("RUNSTATE_")}
        env["COLUMNS"] = "160"
        if http_token is not None:  # in the environment: a flag would show it in `ps`
            env[TOKENS_ENV] = http_token
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in wait()
        self.proc = subprocess.Popen(
            command,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=die_with_parent,  # a killed demo or test run leaves no worker behind
        )

    def health(self) -> dict[str, Any] | None:
        try:
            with urllib.request.urlopen(self._request("/health"), timeout=2) as response:
                data: dict[str, Any] = json.loads(response.read())
                return data
        # A worker killed mid-answer cuts its response short: IncompleteRead, an
        # HTTPException (a soak's reader thread died of one).
        except (OSError, ValueError, http.client.HTTPException):
            return None

    def wait_ready(self, partitions: int | None = None, timeout: float = 90.0) -> None:
        """Until the HTTP API answers (and owns `partitions` partitions, if given)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker exited {self.proc.returncode}:\n{self.log()}")
            health = self.health()
            if health is not None and (
                partitions is None or len(health["partitions"]) == partitions
            ):
                return
            time.sleep(0.2)
        raise TimeoutError(f"worker not ready within {timeout:.0f}s:\n{self.log()}")

    def get(self, path: str) -> Any:
        """GET a path of the worker's API; None on 404."""
        try:
            with urllib.request.urlopen(self._request(path), timeout=5) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise

    def _request(self, path: str) -> urllib.request.Request:
        return urllib.request.Request(self.url + path, headers=self.headers)

    def run_path(self, run_id: str, suffix: str = "") -> str:
        return f"/runs/{urllib.parse.quote(run_id, safe='')}{suffix}"

    def terminate(self, timeout: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.wait(timeout)

    def kill(self) -> int:
        self.proc.kill()
        return self.wait(30)

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            self._log.close()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]
