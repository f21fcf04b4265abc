"""An audit of the whole topics: every check of `audit.py` over every partition.

Pure, like the checks: the records are read by the caller (`runstate verify` reads the
proposals and transitions topics to their end), the machines and keyring given.
"""

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from processor.engine.machine import Catalog
from processor.history.audit import (
    Finding,
    Record,
    verify_continuations,
    verify_migrations,
    verify_partition,
    verify_runs_across_partitions,
)
from processor.history.versions import RefusedVersion
from processor.records.outputs import CommitLimits
from processor.trust.keyring import Keyring


@dataclass(frozen=True)
class Verification:
    partitions: int
    #: The transitions and proposals checked, over all partitions.
    transitions: int
    proposals: int
    findings: list[Finding] = field(default_factory=list)


def verify_topics(
    proposals: Mapping[int, Sequence[Record]],
    transitions: Mapping[int, Sequence[Record]],
    *,
    partitions: int,
    topic: str,
    machines: Catalog,
    keyring: Keyring,
    max_bytes: int,
    max_state_bytes: int,
    commit_limits: CommitLimits | None = None,
    refused: Sequence[RefusedVersion] = (),
    on_partition: Callable[[int], None] | None = None,
) -> Verification:
    """Every partition's transitions against its proposals (`topic`) and its
    migrations against the operators' keys, then the runs and continuations across
    partitions. The machine versions `refused` (on the machines topic, not signed by an
    operator) come first in the findings; `on_partition` is told each partition as it
    is done."""
    findings = [Finding(r.partition, r.offset, str(r), "machines") for r in refused]
    checked = 0
    for p in range(partitions):
        findings += verify_partition(
            p,
            proposals.get(p, []),
            transitions.get(p, []),
            topic=topic,
            machines=machines,
            keyring=keyring,
            partitions=partitions,
            max_bytes=max_bytes,
            max_state_bytes=max_state_bytes,
            commit_limits=commit_limits,
        )
        findings += verify_migrations(
            p, proposals.get(p, []), transitions.get(p, []), topic=topic, keyring=keyring
        )
        checked += len(transitions.get(p, []))
        if on_partition is not None:
            on_partition(p)
    findings += verify_runs_across_partitions(transitions)
    findings += verify_continuations(transitions, machines)
    proposed = sum(len(records) for records in proposals.values())
    return Verification(partitions, checked, proposed, findings)
