"""What a worker runs with: its settings (each a flag of `runstate worker`, a RUNSTATE_*
variable and a default, declared here once) and the objects resolved from them at start
(Kafka client settings, keyring, machines, HTTP tokens)."""

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, FilePath, field_validator
from pydantic_settings import NoDecode

from processor.engine import Machine
from processor.kafka.config import KafkaSettings
from processor.kafka.topics import TopicNames
from processor.records.intake import DEFAULT_MAX_PROPOSAL_BYTES
from processor.records.pipeline import DEFAULT_MAX_STATE_BYTES
from processor.serving.peers import origin
from processor.settings import Flag, NotAFlag, Settings, existing_paths, split_list
from processor.trust.http_auth import HttpTokens
from processor.trust.keyring import Keyring


class WorkerSettings(Settings):
    """The settings of a worker, either runtime (verify and replay take the ones that
    must match the workers': machines, keyring, limits)."""

    runtime: Literal["native", "faust"] = Field(
        "native",
        description="native: confluent-kafka, exactly once. faust: a faust-streaming app "
        "over a rocksdict Table, at least once with recognisable duplicates (see "
        "docs/runtimes.md).",
    )
    group_id: str = Field("runstate", description="Consumer group of the workers.")
    state_dir: Path = Field(
        Path("state"),
        description="A worker's RocksDB partition stores (one directory per worker; replay "
        "writes the stores there).",
    )
    worker_id: str | None = Field(
        None,
        description="Stable id of this worker (transactional.id suffix); kept in the state dir.",
    )
    keyring_file: Path | None = Field(
        None,
        description="Keyring JSON (key id -> public key or HMAC secret, source, authority, "
        "validity, scope; `runstate keys` manages it). A worker reads the file again when "
        "it changes. RUNSTATE_KEYRING may hold the JSON itself instead.",
    )
    machine_path: Annotated[tuple[Path, ...], NoDecode, Flag("--machine-path", exists=True)] = (
        Field(
            (),
            description="A machine file or a folder of *.yaml machine files to load besides "
            "the built-ins (repeatable; in the environment, separate paths with ':').",
        )
    )
    http_host: str = Field(
        "127.0.0.1",
        description="HTTP API bind address. Anything but loopback (127.0.0.0/8, ::1, "
        "localhost) needs tokens (RUNSTATE_HTTP_TOKENS or --http-tokens-file) or "
        "--http-insecure.",
    )
    http_port: int = Field(8080, ge=0, le=65535, description="HTTP API port (0: free).")
    http_tokens_file: Annotated[Path | None, Flag("--http-tokens-file", "--http-token-file")] = (
        Field(
            None,
            description="A file of the tokens the HTTP API accepts, one per line ('#' comments), "
            "read again when it changes (rotation without a restart). Every endpoint but /livez "
            "then wants 'Authorization: Bearer <token>' or HTTP Basic with the token as the "
            "password. RUNSTATE_HTTP_TOKENS may list tokens too (comma-separated); both count. "
            "Other workers of the group are asked with the first token: give them all the same "
            "list.",
        )
    )
    http_insecure: bool = Field(
        False,
        description="Serve the HTTP API without tokens on an address other machines can "
        "reach (refused otherwise). Anyone who reaches the port reads every run.",
    )
    advertised_url: str | None = Field(
        None,
        description="The URL other workers reach this one's HTTP API at, for queries "
        "across the cluster (default: http://<http-host, or this host's name for "
        "0.0.0.0>:<port>).",
    )
    peers: Annotated[tuple[str, ...], NoDecode, Flag("--peer")] = Field(
        (),
        description="The HTTP URL (scheme://host:port) of another worker of the group, as "
        "it advertises it (repeatable; in the environment, comma-separated). Reads across "
        "the cluster ask these only, with the HTTP token: a group member advertising any "
        "other URL is not asked, and its partitions are reported missing.",
    )
    commit_interval_ms: int = Field(
        100, ge=1, description="Commit the transaction at least this often."
    )
    commit_max_records: int = Field(
        1000, ge=1, description="...or after this many proposals, whichever comes first."
    )
    max_proposal_bytes: int = Field(
        DEFAULT_MAX_PROPOSAL_BYTES,
        ge=256,
        description="Larger proposals are refused schema_invalid (verify: the limit the "
        "workers ran with).",
    )
    max_state_bytes: int = Field(
        DEFAULT_MAX_STATE_BYTES,
        ge=4096,
        description="The largest snapshot or transition (JSON bytes) a commit may write; a "
        "proposal that would write more, or whose records to one topic would not fit one "
        "batch of it (its max.message.bytes), is refused state_too_large and the run stays "
        "as it was. The changelog and transitions topics must take records this large "
        "(workers check at start). verify: the limit the workers ran with.",
    )
    transaction_timeout_ms: Annotated[int, NotAFlag()] = Field(10_000, ge=1000)
    timer_interval_ms: int = Field(
        200,
        ge=10,
        description="How often due deadlines and alerts are looked for (they fire within "
        "about this plus one transaction of their due time).",
    )
    timer_key_id: str | None = Field(
        None,
        description="HMAC key of the keyring that signs deadline proposals (default: the "
        "first HMAC key with authority runtime).",
    )
    timer_key_file: FilePath | None = Field(
        None,
        description="Signing key (a runtime key of the keyring; `runstate keys add` writes "
        "one) that signs deadline proposals: needed when the keyring holds ed25519 keys, "
        "whose private halves are not in it.",
    )
    operator_key_file: FilePath | None = Field(
        None,
        description="An operator's signing key (`runstate keys add KEY_ID --operator` "
        "writes one): with it the worker signs and publishes its machine files' versions "
        "at start, for every other worker and auditor. Without one (or --operator-key-id) "
        "it publishes nothing; `runstate machines publish` does, with an operator's key.",
    )
    operator_key_id: str | None = Field(
        None,
        description="An operator's HMAC key of the keyring, instead of --operator-key-file.",
    )
    static_membership: Annotated[bool, Flag("--static-membership/--dynamic-membership")] = Field(
        False,
        description="Static: a worker restarted with the same state dir takes its "
        "partitions back at once, without waiting for the session timeout (best when "
        "workers restart in place); but a stopped one keeps them until that timeout, and "
        "rebalances are eager (every worker pauses while partitions move). Dynamic: "
        "cooperative rebalances; a stopped worker hands over at once, a crashed one after "
        "the session timeout.",
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "info",
        description="debug: a line per committed transition and heartbeat, and internals; "
        "info: per rejection, and partitions assigned, restored, released; warning: per DLQ "
        "record; error: state that could not be persisted.",
    )
    log_format: Literal["text", "json"] = Field(
        "text",
        description="text: readable lines; json: one JSON object per line (fields: time, "
        "level, logger, message, and the record's run_id, event, code...).",
    )

    traces: Literal["off", "otlp", "file"] = Field(
        "off",
        description="OpenTelemetry spans of each proposal that carries a trace context "
        "(the SDK adds one when the agent traces): decide and commit, children of the "
        "agent's propose span. otlp: to a collector, as the OTEL_EXPORTER_OTLP_* variables "
        "say; file: one JSON object per span and line to --traces-file. Needs "
        "'runstate[traces]'.",
    )
    traces_file: Path | None = Field(
        None,
        description="Where --traces file appends its spans ('-' or unset: stderr).",
    )

    @field_validator("machine_path", mode="before")
    @classmethod
    def _machine_paths(cls, value: Any) -> Any:
        return split_list(value, ":")

    @field_validator("machine_path")
    @classmethod
    def _machine_paths_exist(cls, value: tuple[Path, ...]) -> tuple[Path, ...]:
        return existing_paths(value)

    @field_validator("peers", mode="before")
    @classmethod
    def _peers(cls, value: Any) -> Any:
        """Each peer as its origin, once, in the order given."""
        value = split_list(value, ",")
        if isinstance(value, tuple | list):
            return tuple(dict.fromkeys(origin(str(item)) for item in value))
        return value

    @field_validator("log_level", mode="before")
    @classmethod
    def _lower(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value


@dataclass
class WorkerConfig:
    """What a worker runs with, either runtime: its settings and what they resolve to."""

    kafka: KafkaSettings
    topics: TopicNames
    keyring: Keyring
    machines: Mapping[str, Machine]
    settings: WorkerSettings
    #: What the HTTP API asks of every request but /livez (none: open, loopback only).
    http_tokens: HttpTokens = field(default_factory=HttpTokens)
