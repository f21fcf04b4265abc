"""Testing agents without Kafka: `RunstateEnvironment` decides proposals in process, with
the workers' own rules, and a clock the test moves; its clients are the SDK's.

    from processor.testing import RunstateEnvironment

    async def test_an_unanswered_approval_times_out() -> None:
        env = RunstateEnvironment()
        agent, approver = env.client(), env.client("approver")
        ...
        await env.advance(hours=2)
"""

from .clients import AsyncTestClient, TestClient
from .environment import RunstateEnvironment

__all__ = ["AsyncTestClient", "RunstateEnvironment", "TestClient"]
