"""Generate the JSON Schema files for producers in other languages.

Run `python -m schemas.export` after changing a model; a unit test fails while the
files in `schemas/json/` differ from what the models generate.
"""

import json
import sys
from pathlib import Path

from pydantic import BaseModel

from schemas.machine import MachineSpec
from schemas.messages import (
    ApprovalPayload,
    CheckpointPayload,
    CreatePayload,
    DeadLetter,
    FactPayload,
    Proposal,
    Rejection,
    RunSnapshot,
    StepFailedPayload,
    StepStartedPayload,
    StepSucceededPayload,
    Transition,
)

JSON_DIR = Path(__file__).parent / "json"

#: file stem -> model. Payload schemas let producers check event-specific data too.
EXPORTED: dict[str, type[BaseModel]] = {
    "proposal": Proposal,
    "transition": Transition,
    "rejection": Rejection,
    "run_snapshot": RunSnapshot,
    "machine_spec": MachineSpec,
    "dead_letter": DeadLetter,
    "payload.approval": ApprovalPayload,
    "payload.create": CreatePayload,
    "payload.fact": FactPayload,
    "payload.step_started": StepStartedPayload,
    "payload.step_succeeded": StepSucceededPayload,
    "payload.step_failed": StepFailedPayload,
    "payload.checkpoint": CheckpointPayload,
}


def render_all() -> dict[str, str]:
    """File name -> exact file text, as the models define them now."""
    return {
        f"{stem}.schema.json": json.dumps(
            model.model_json_schema(by_alias=True), indent=2, sort_keys=True
        )
        + "\n"
        for stem, model in EXPORTED.items()
    }


def main() -> int:
    JSON_DIR.mkdir(exist_ok=True)
    for name, text in render_all().items():
        (JSON_DIR / name).write_text(text, encoding="utf-8")
        print(f"wrote {JSON_DIR / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
