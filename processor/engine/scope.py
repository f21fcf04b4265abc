"""A credential's scope: which runs its authority reaches (machines, run id prefixes), and
whether it is an operator's (operators publish machine versions and migrate runs)."""

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Scope:
    """What a signing key may touch, beyond what its authority may send: runs of these
    machines only, and runs whose id starts with one of these prefixes (one team's runs).
    None is no limit. `operator`: the keyring gives the key operator authority, which
    alone moves a run to another machine version and signs machine versions."""

    key_id: str
    machines: frozenset[str] | None = None
    run_prefixes: tuple[str, ...] | None = None
    operator: bool = False

    def refuses(self, machine: str, run_id: str) -> str | None:
        """Why a run of `machine` with id `run_id` is out of this scope, or None."""
        if self.machines is not None and machine not in self.machines:
            return (
                f"key '{self.key_id}' is limited to machines "
                f"{', '.join(sorted(self.machines)) or '(none)'}; run '{run_id}' uses '{machine}'"
            )
        if self.run_prefixes is not None and not run_id.startswith(self.run_prefixes):
            return (
                f"key '{self.key_id}' is limited to runs whose id starts with "
                f"{', '.join(repr(p) for p in self.run_prefixes) or '(none)'}"
            )
        return None
