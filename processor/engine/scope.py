"""A credential's scope: which runs its authority reaches (machines, run id prefixes),
whether it is an operator's (operators publish machine versions and migrate runs), and
whether it is the workers' own (processor keys carry messages between runs)."""

from dataclasses import dataclass

#: Where a run id prefix may end: a prefix reaches a run id equal to it, or one that goes
#: on with one of these after it (or the prefix ends with one). `team-a` reaches
#: `team-a-7` and `team-a/7`, never `team-ab-7`.
SEPARATORS = frozenset("-_.:/@#")


@dataclass(frozen=True, slots=True)
class Scope:
    """What a signing key may touch, beyond what its authority may send: runs of these
    machines only, and runs whose id starts with one of these prefixes (one team's runs).
    None is no limit. `operator`: the keyring gives the key operator authority, which
    alone moves a run to another machine version and signs machine versions.
    `processor`: a key of the workers themselves, which alone sends the messages runs
    exchange (processor/engine/continuation.py); never an agent's. A refusal
    names the key and its limit, never the run's machine, state or revision: the key
    may not know them."""

    key_id: str
    machines: frozenset[str] | None = None
    run_prefixes: tuple[str, ...] | None = None
    operator: bool = False
    processor: bool = False

    def refuses(self, machine: str, run_id: str) -> str | None:
        """Why a run of `machine` with id `run_id` is out of this scope, or None."""
        return self.refuses_run(run_id) or self.refuses_machine(machine, run_id)

    def refuses_run(self, run_id: str) -> str | None:
        """Why run id `run_id` is out of this scope's prefixes, or None."""
        if self.run_prefixes is not None and not any(
            reaches(prefix, run_id) for prefix in self.run_prefixes
        ):
            return (
                f"key '{self.key_id}' is limited to runs whose id starts with "
                f"{', '.join(repr(p) for p in self.run_prefixes) or '(none)'}"
            )
        return None

    def refuses_machine(self, machine: str, run_id: str) -> str | None:
        """Why a run of `machine` is out of this scope's machines, or None."""
        if self.machines is not None and machine not in self.machines:
            return (
                f"key '{self.key_id}' is limited to machines "
                f"{', '.join(sorted(self.machines)) or '(none)'}; it may not act on "
                f"run '{run_id}'"
            )
        return None


def reaches(prefix: str, run_id: str) -> bool:
    """Whether scope prefix `prefix` reaches `run_id`, on a separator boundary."""
    if not run_id.startswith(prefix):
        return False
    return (
        len(run_id) == len(prefix)
        or prefix == ""
        or prefix[-1] in SEPARATORS
        or run_id[len(prefix)] in SEPARATORS
    )
