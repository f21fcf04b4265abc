"""An asyncio agent living one `task_lifecycle` task: steps, a checkpoint, a crash, a resume.

    python examples/agent/task_agent.py RUN_ID [--crash-in STEP]

The task refunds an order in three steps (validate, refund, notify). Each step is
recorded in the run's step ledger before and after it runs, and the agent's working
notes go into the run's checkpoint. Started again after a crash, the agent reads the
run's resume view and goes on from there: completed steps are not run again (their
results come back from the ledger), a step left `executing` (outcome unknown) is
checked and settled with what was found (succeeded with the result found, or failed,
then run again under the same idempotency key: an executing step is never started
twice), and the notes are read back from the checkpoint.

`--crash-in STEP` kills the process (SIGKILL, no cleanup) while STEP runs, to show it.

Settings, as for every runstate command: RUNSTATE_BOOTSTRAP_SERVERS, RUNSTATE_TOPIC_PREFIX,
RUNSTATE_WORKER_URL (the worker's HTTP API, for the resume view),
RUNSTATE_SIGNING_KEY_FILE (a key with the runtime authority), RUNSTATE_HTTP_TOKEN.
Prints one JSON line per thing it does.
"""

import argparse
import asyncio
import json
import os
import signal
from pathlib import Path

from processor.client import (
    AsyncRunstateClient,
    KafkaSettings,
    Rejection,
    TopicNames,
    Transition,
    load_signing_key,
)
from processor.history.resume import ResumeView

MACHINE = "task_lifecycle"
STEPS = ("validate", "refund", "notify")


def say(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


async def do_step(name: str, notes: dict[str, object]) -> dict[str, object]:
    """The outside world: what each step does (here: pretends to)."""
    await asyncio.sleep(0.05)
    if name == "validate":
        return {"order": notes["order"], "amount_cents": 1250}
    if name == "refund":
        return {"refund_id": f"rf-{notes['order']}", "amount_cents": 1250}
    return {"notified": True}


async def already_done(client: AsyncRunstateClient, key: str) -> dict[str, object] | None:
    """A step left `executing` by a crash: did its effect happen, and with what result?
    A real agent asks the system the step called, by the idempotency key; this one knows
    it did not."""
    return None


async def live(client: AsyncRunstateClient, run_id: str, crash_in: str | None) -> None:
    view = await client.resume(run_id)
    if view is None:
        created = await client.create_and_wait(run_id, MACHINE, raise_on_rejection=True)
        assert isinstance(created, Transition)
        await client.propose_and_wait(run_id, "start", raise_on_rejection=True)
        await client.propose_and_wait(
            run_id,
            "checkpoint",
            payload={"data": {"order": run_id, "plan": list(STEPS)}},
            raise_on_rejection=True,
        )
        say(event="started", run_id=run_id)
        view = await client.resume(run_id)
        assert view is not None
    else:
        say(event="resumed", **summary(view))
    notes: dict[str, object] = dict(view.checkpoint)
    for step in STEPS:
        key = f"{run_id}:{step}"
        if step in view.completed:
            notes[step] = view.completed[step].result
            continue
        if step in view.executing:  # settle it with what the outside world says
            found = await already_done(client, key)
            if found is not None:
                await client.propose_and_wait(
                    run_id,
                    "step_succeeded",
                    payload={"step": step, "result": found},
                    raise_on_rejection=True,
                )
                notes[step] = found
                continue
            await client.propose_and_wait(
                run_id,
                "step_failed",
                payload={"step": step, "error": "interrupted by a crash; not done"},
                raise_on_rejection=True,
            )
        await client.propose_and_wait(
            run_id,
            "step_started",
            payload={"step": step, "idempotency_key": key},
            raise_on_rejection=True,
        )
        if step == crash_in:
            say(event="crashing", step=step)
            os.kill(os.getpid(), signal.SIGKILL)
        result = await do_step(step, notes)
        await client.propose_and_wait(
            run_id,
            "step_succeeded",
            payload={"step": step, "result": result},
            raise_on_rejection=True,
        )
        notes[step] = result
        await client.propose_and_wait(
            run_id, "checkpoint", payload={"data": notes}, raise_on_rejection=True
        )
        say(event="step_done", step=step, result=result)
    done = await client.propose_and_wait(run_id, "complete")
    if isinstance(done, Rejection):
        say(event="refused", code=done.code.value, detail=done.detail)
    else:
        say(event="completed", run_id=run_id, revision=done.revision)


def summary(view: ResumeView) -> dict[str, object]:
    return {
        "run_id": view.run_id,
        "state": view.state,
        "completed": sorted(view.completed),
        "executing": sorted(view.executing),
        "checkpoint": sorted(view.checkpoint),
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_id")
    parser.add_argument("--crash-in", choices=STEPS, default=None)
    args = parser.parse_args()
    env = os.environ
    client = AsyncRunstateClient(
        KafkaSettings(env.get("RUNSTATE_BOOTSTRAP_SERVERS", "127.0.0.1:9092")),
        TopicNames.with_prefix(env.get("RUNSTATE_TOPIC_PREFIX", "runstate.")),
        signing_key=load_signing_key(Path(env["RUNSTATE_SIGNING_KEY_FILE"])),
        worker_urls=[env.get("RUNSTATE_WORKER_URL", "http://127.0.0.1:8080")],
    )
    async with client:
        await live(client, args.run_id, args.crash_in)


if __name__ == "__main__":
    asyncio.run(main())
