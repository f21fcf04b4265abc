"""The controller quorum: its voters when a cluster is formatted, and its membership
changed while it runs."""

import json
import time
from pathlib import Path

from processor.broker.jars import BrokerError
from processor.broker.server import LOOPBACK, Jvm, ServerConfig, run_tool


def initial_controllers(configs: list[ServerConfig], directory_ids: list[str]) -> str:
    """`--initial-controllers`: id@host:port:directory-id of every voter; the same
    string formats every node, and a node's own directory id becomes its metadata log
    directory's (so the voter set is known before anything starts)."""
    return ",".join(
        f"{c.node_id}@{LOOPBACK}:{c.controller_port}:{d}"
        for c, d in zip(configs, directory_ids, strict=True)
    )


class Quorum:
    """The controller quorum's membership, through kafka-metadata-quorum (the tools
    jar: librdkafka has no AddRaftVoter or RemoveRaftVoter)."""

    def __init__(self, jvm: Jvm, tools: Path, bootstrap: str) -> None:
        self.jvm, self.tools, self.bootstrap = jvm, tools, bootstrap

    def voters(self) -> set[tuple[int, str]]:
        """(node id, directory id) of every voter."""
        out = self._run("describe", "--status")
        for line in out.splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "CurrentVoters":
                return {(v["id"], v["directoryId"]) for v in json.loads(value)}
        raise BrokerError(f"kafka-metadata-quorum describe printed no voters:\n{out}")

    def discard(self, node_id: int, directory_id: str) -> None:
        """Remove that voter from the quorum, if it is one."""
        if (node_id, directory_id) not in self.voters():
            return
        self._run(
            "remove-controller",
            "--controller-id",
            str(node_id),
            "--controller-directory-id",
            directory_id,
        )

    def add(self, config: Path, deadline: float) -> None:
        """Add the controller `config` describes; the leader refuses one that has not
        caught up yet, so this retries until `deadline`."""
        while True:
            try:
                self._run("add-controller", command_config=config)
                return
            except BrokerError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1.0)

    def _run(self, *args: str, command_config: Path | None = None) -> str:
        config = ["--command-config", str(command_config)] if command_config else []
        result = run_tool(
            self.jvm,
            "org.apache.kafka.tools.MetadataQuorumCommand",
            "--bootstrap-server",
            self.bootstrap,
            *config,
            *args,
            tools=self.tools,
        )
        if result.returncode != 0:
            raise BrokerError(
                f"kafka-metadata-quorum {' '.join(args)} failed (exit {result.returncode}):"
                f"\n{result.stdout}{result.stderr}"
            )
        return result.stdout
