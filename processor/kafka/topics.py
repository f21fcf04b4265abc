"""The topics runstate reads and writes: their names, one per role."""

from dataclasses import dataclass

DEFAULT_PREFIX = "runstate."


@dataclass(frozen=True)
class TopicNames:
    proposals: str
    transitions: str
    rejections: str
    dlq: str
    changelog: str
    alerts: str
    heartbeats: str
    machines: str

    @classmethod
    def with_prefix(cls, prefix: str = DEFAULT_PREFIX) -> "TopicNames":
        return cls(
            proposals=f"{prefix}proposals",
            transitions=f"{prefix}transitions",
            rejections=f"{prefix}rejections",
            dlq=f"{prefix}dlq",
            changelog=f"{prefix}runs-changelog",
            alerts=f"{prefix}alerts",
            heartbeats=f"{prefix}heartbeats",
            machines=f"{prefix}machines",
        )


ROLES = (
    "proposals",
    "transitions",
    "rejections",
    "dlq",
    "changelog",
    "alerts",
    "heartbeats",
    "machines",
)
