"""A support agent deployed on LangGraph Server: ``langgraph dev`` in this folder.

The server compiles nothing itself: it calls `make_graph` (a graph factory, named
in ``langgraph.json``) and runs the graph with its own checkpointer. The agent is
LangChain's `create_agent` with `ResilienceMiddleware`; its refund is a side effect
that must happen once, also when the server restarts mid-run (it re-queues the run)
or the user double-texts (the first run is cancelled).

With ``LANGGRAPH_RESILIENCE_DSN`` set, the idempotency ledger, saga log and breakers
are our Postgres tables, opened once per process by `ashared_postgres` (the factory
may be called for every run; no checkpoint tables are created: the server owns
them), so every server process shares one ledger and one breaker per tool. Unset,
the ledger follows the server's checkpointer (a file beside ``langgraph dev``'s).

The model is a `ScriptedChatModel` so that the example runs offline; use yours, e.g.
``init_chat_model("openai:gpt-4o")``. See ``client.py`` for the other side.
"""

from __future__ import annotations

import os
from typing import Any

from langchain.agents import create_agent
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool

from langgraph_resilience import (
    ResilienceMiddleware,
    ToolProfile,
    current_idempotency_key,
)
from langgraph_resilience.stores import ashared_postgres
from langgraph_resilience.testing import ScriptedChatModel, text, tool_calls

REFUNDS: dict[str, str] = {}
"""The payment service's records, by idempotency key (a stand-in for a real API)."""


@tool
def refund(order: str) -> str:
    """Refund an order."""
    key = current_idempotency_key() or order  # sent as the service's Idempotency-Key
    REFUNDS.setdefault(key, f"refunded {order}")
    return REFUNDS[key]


def refunded(key: str) -> str | None:
    """Ask the payment service whether the refund with this key happened."""
    return REFUNDS.get(key)


def _policy(messages: list[Any]) -> AIMessage:
    """The scripted model: "refund X" calls the refund tool, then it reports."""
    last = messages[-1]
    if isinstance(last, HumanMessage) and last.text.startswith("refund"):
        return tool_calls(("refund", {"order": last.text.split()[-1]}))
    if isinstance(last, ToolMessage):
        return text(f"Done: {last.text}")
    return text("How can I help?")


async def make_graph(config: RunnableConfig) -> Any:
    """The graph factory the server calls (per run, per state read)."""
    stores: dict[str, Any] = {}
    dsn = os.environ.get("LANGGRAPH_RESILIENCE_DSN")
    if dsn:
        shared = await ashared_postgres(dsn)
        stores = {
            "idempotency": shared.idempotency,
            "saga": shared.saga,
            "breaker_store": shared.breakers,
        }
    profiles = {"refund": ToolProfile(side_effect=True, status_check=refunded)}
    model = ScriptedChatModel(responses=[_policy] * 1000)
    return create_agent(
        model, [refund], middleware=[ResilienceMiddleware(profiles=profiles, **stores)]
    )
