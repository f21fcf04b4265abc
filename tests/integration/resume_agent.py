"""An agent that dies mid-step, for tests/integration/test_resume.py: it creates a
task_lifecycle run, starts it, does step s1 (with a result), writes a checkpoint,
starts step s2, says so in a file, and sleeps until it is killed.

    python -m tests.integration.resume_agent BOOTSTRAP TOPIC_PREFIX KEYRING RUN_ID READY_FILE
"""

import sys
import time
from pathlib import Path

from processor.client import RunstateClient
from processor.kafka.config import KafkaSettings
from processor.kafka.topics import TopicNames
from processor.trust.keyring import load_keyring, signing_key_from
from schemas.messages import Transition

CHECKPOINT = {"cursor": 42, "plan": ["s1", "s2"], "notes": "s1 found 42 rows"}


def main(bootstrap: str, prefix: str, keyring_path: str, run_id: str, ready: str) -> None:
    keyring = load_keyring(Path(keyring_path), None)
    client = RunstateClient(
        KafkaSettings(bootstrap),
        TopicNames.with_prefix(prefix),
        signing_key=signing_key_from(keyring, "runtime"),
    )
    steps: list[tuple[str, dict[str, object]]] = [
        ("start", {}),
        ("step_started", {"step": "s1", "idempotency_key": f"{run_id}/s1"}),
        ("step_succeeded", {"step": "s1", "result": {"rows": 42}}),
        ("checkpoint", {"data": CHECKPOINT}),
        ("step_started", {"step": "s2", "idempotency_key": f"{run_id}/s2"}),
    ]
    created = client.create_and_wait(run_id, "task_lifecycle", timeout=60)
    assert isinstance(created, Transition), created
    for event, payload in steps:
        outcome = client.propose_and_wait(run_id, event, payload=payload, timeout=60)
        assert isinstance(outcome, Transition), outcome
    Path(ready).write_text(str(outcome.revision))
    while True:  # "doing" s2 until SIGKILL
        time.sleep(1)


if __name__ == "__main__":
    main(*sys.argv[1:6])
