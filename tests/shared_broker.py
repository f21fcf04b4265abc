"""One broker for every pytest-xdist process of a run. The controller starts it in a
thread while the processes run their unit tests, and writes its address (or why there
is none) to a file the processes' `kafka_bootstrap` fixture reads; it stops the broker
when the run ends. Tests keep apart by their own topic prefix and group ids."""

import json
import shutil
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path

import pytest

from processor.broker.provide import broker_source, provide_broker

#: The key under which the controller hands the address file to each process.
WORKER_INPUT_KEY = "runstate_shared_broker"

#: Generous: a first run may fetch the launcher's jars from Maven Central.
START_TIMEOUT_S = 900.0


class SharedBroker:
    """The controller's side: a broker started in a thread, stopped at `close()`. The
    thread lives as long as the broker: the broker's process dies with the thread that
    started it (its parent-death signal is per thread)."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="runstate-shared-broker-"))
        self.address_file = self.dir / "address.json"
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="shared-broker", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        with ExitStack() as stack:
            try:
                source = broker_source()
                bootstrap = stack.enter_context(provide_broker(self.dir / "data", source=source))
                answer = {"bootstrap": bootstrap, "said": f"{source.kind}, {source.why}"}
            except Exception as exc:  # written for the processes, which fail on it
                answer = {"error": f"{type(exc).__name__}: {exc}"}
            partial = self.address_file.with_suffix(".partial")
            partial.write_text(json.dumps(answer))
            partial.replace(self.address_file)  # whole or absent, never half written
            self._done.wait()

    def close(self) -> None:
        self._done.set()
        self._thread.join()
        shutil.rmtree(self.dir, ignore_errors=True)


def wants_broker(config: pytest.Config) -> bool:
    """False when the run selects only unit tests, by marker or by path."""
    if (config.option.markexpr or "").strip() == "unit":
        return False
    unit = (Path(str(config.rootpath)) / "tests" / "unit").resolve()
    paths = [Path(arg.split("::")[0]).resolve() for arg in config.args]
    return not paths or not all(p == unit or unit in p.parents for p in paths)


def shared_address(address_file: Path) -> tuple[str, str]:
    """A process's side: the broker's address and where it came from, once the
    controller has written them."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while not address_file.exists():
        if time.monotonic() > deadline:
            pytest.fail(f"the shared broker did not start within {START_TIMEOUT_S:.0f} s")
        time.sleep(0.2)  # polling a file another process writes
    answer = json.loads(address_file.read_text())
    if "error" in answer:
        pytest.fail(f"the shared broker could not start: {answer['error']}")
    return answer["bootstrap"], answer["said"]
