"""A worker that pauses a `create_agent` turn in LangChain's `HumanInTheLoopMiddleware`
(a node of the user's, not ours) and then stays alive and idle, as a web worker does
after answering: ``python hitl_worker.py DSN THREAD``. It prints ``paused`` once the
turn waits for the reviewer, and exits when its stdin closes. The test answers the
reviewer's question from another process (itself)."""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable
from typing import Any

from langchain.agents import create_agent
from langchain.agents.middleware import HumanInTheLoopMiddleware
from langchain_core.tools import tool
from langgraph.checkpoint.postgres import PostgresSaver

from langgraph_resilience import ResilienceMiddleware, ToolProfile
from langgraph_resilience.testing import ScriptedChatModel, text, tool_calls


def reviewed_agent(
    checkpointer: Any,
    paid: list[int],
    *,
    resumed: bool = False,
    paying: Callable[[], None] = lambda: None,
) -> Any:
    """create_agent whose payment a reviewer approves first, then our middleware runs;
    its model asks to pay 5, then says "paid" (only that, in the resuming process).
    `paying` runs inside the payment, before it is made."""

    @tool
    def pay(amount: int) -> str:
        """Pay."""
        paying()
        paid.append(amount)
        return f"paid {amount}"

    asks = [] if resumed else [tool_calls(("pay", {"amount": 5}))]
    model = ScriptedChatModel(responses=[*asks, text("paid")])
    return create_agent(
        model,
        [pay],
        middleware=[
            ResilienceMiddleware(profiles={"pay": ToolProfile(side_effect=True)}),
            HumanInTheLoopMiddleware(interrupt_on={"pay": True}),
        ],
        checkpointer=checkpointer,
    )


def main(dsn: str, thread: str) -> None:
    with PostgresSaver.from_conn_string(dsn) as saver:
        saver.setup()
        paid: list[int] = []
        agent = reviewed_agent(saver, paid)
        config: Any = {"configurable": {"thread_id": thread}}
        agent.invoke({"messages": [("user", "pay 5")]}, config)
        assert agent.get_state(config).interrupts
        assert not paid
        gc.disable()  # idle: nothing allocates, so nothing would collect the run
        print("paused", flush=True)
        sys.stdin.read()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
