"""The probes: GET /livez (the worker's loop turns, else restart it) and GET /readyz
(it serves every partition it was assigned, else what it waits for)."""

from processor.serving.answers import Answer, json_answer
from processor.serving.node import Node

#: /livez fails when the worker's loop has not turned for this long, /readyz sooner.
LIVE_WITHIN_S = 60.0
READY_WITHIN_S = 15.0


def livez(node: Node) -> Answer:
    """Alive: the worker's loop turned lately (a restart is the cure otherwise)."""
    idle = node.loop_idle_seconds()
    alive = idle < LIVE_WITHIN_S
    return json_answer(200 if alive else 503, {"alive": alive, "loop_idle_seconds": round(idle, 1)})


def readyz(node: Node) -> Answer:
    """Ready: what the runtime waits for, and a loop that turns."""
    waiting = node.waiting()
    idle = node.loop_idle_seconds()
    if idle >= READY_WITHIN_S:
        waiting.append(f"its loop has not turned for {idle:.0f} s")
    body = {"ready": not waiting, "partitions": node.owned(), "waiting": waiting}
    return json_answer(200 if not waiting else 503, body)
