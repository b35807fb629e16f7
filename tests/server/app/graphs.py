"""The graphs the server tests deploy with ``langgraph dev`` (``langgraph.json`` beside).

A support agent refunds orders. Its model is deterministic (a `ScriptedChatModel`
policy over the conversation, as a real model would act): "refund X" calls
``refund(order=X)``; a follow-up re-issues a refund whose answer said it did not run;
otherwise it reports the answer. ``refund`` inserts one row per real effect into
``effects`` on ``EFFECTS_DSN``, writes a marker file in ``LGR_CONTROL``, then waits while
``LGR_CONTROL/hold`` exists, so a test can kill or cancel the run mid-effect.

- ``ours``: `add_resilience`, the default ledger (the server's saver decides);
- ``plain``: the same agent on LangGraph's `ToolNode`;
- ``middleware``: `create_agent` with `ResilienceMiddleware`;
- ``shared``: ``ours`` with the ledger and breakers of `ashared_postgres` on
  ``LGR_SHARED_DSN`` (a factory: opened once per process).
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import time
import uuid
from typing import Any

import psycopg
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from langgraph_resilience import (
    BreakerConfig,
    ResilienceMiddleware,
    ResiliencePolicy,
    ResilienceState,
    ToolProfile,
    add_resilience,
    current_idempotency_key,
)
from langgraph_resilience.stores import ashared_postgres
from langgraph_resilience.testing import FakeHTTPError, ScriptedChatModel, text, tool_calls

CONTROL = pathlib.Path(os.environ.get("LGR_CONTROL", "."))
EFFECTS_DSN = os.environ.get("EFFECTS_DSN", "")
OPENED = CONTROL / "opened"


class State(MessagesState, ResilienceState):
    """Messages and the resilience ledger."""


def _reissued_or_reported(messages: list[Any]) -> AIMessage:
    answers = {m.tool_call_id: m for m in messages if isinstance(m, ToolMessage)}
    for message in reversed(messages):
        if isinstance(message, AIMessage) and message.tool_calls:
            call = message.tool_calls[0]
            answer = answers.get(call["id"])
            if answer is None or "not run" in answer.text:
                return tool_calls((call["name"], call["args"]))
            return text(f"your {call['name']}: {answer.text[:80]}")
    return text("nothing to do")


MODEL_LATENCY = float(os.environ.get("LGR_MODEL_LATENCY") or 0)
"""Seconds each model call takes (a real model's latency), when a test sets it."""


def policy(messages: list[Any]) -> AIMessage:
    if MODEL_LATENCY:
        time.sleep(MODEL_LATENCY)  # the server's model thinking, not a test's clock
    last = messages[-1]
    if isinstance(last, HumanMessage):
        words = last.text.split()
        if words and words[0] in ("refund", "goodwill", "lookup"):
            args: dict[str, Any] = (
                {"amount": int(words[-1])} if words[0] == "goodwill" else {"order": words[-1]}
            )
            return tool_calls((words[0], args))
        return _reissued_or_reported(messages)
    if isinstance(last, ToolMessage):
        return text(f"done: {last.text[:80]}")
    return text("?")


def model() -> ScriptedChatModel:
    return ScriptedChatModel(responses=[policy] * 100_000)


async def _held() -> bool:
    return await asyncio.to_thread((CONTROL / "hold").exists)


@tool
async def refund(order: str) -> str:
    """Refund an order."""
    key = current_idempotency_key()  # sent to the payment service, as an Idempotency-Key
    async with await psycopg.AsyncConnection.connect(EFFECTS_DSN, autocommit=True) as conn:
        await conn.execute("INSERT INTO effects (order_id, key) VALUES (%s, %s)", (order, key))
    await asyncio.to_thread((CONTROL / f"effect-{order}").write_text, "x")
    for _ in range(2400):
        if not await _held():
            break
        await asyncio.sleep(0.05)
    return f"refunded {order}"


@tool
def lookup(order: str) -> str:
    """Look an order up (read-only); answers 503 while ``LGR_CONTROL/outage`` exists."""
    (CONTROL / f"lookup-{order}-{os.getpid()}-{uuid.uuid4().hex[:6]}").write_text("x")
    if (CONTROL / "outage").exists():
        raise FakeHTTPError(503, body="order service down")
    return f"order {order}: shipped"


@tool
def goodwill(amount: int) -> str:
    """Grant a goodwill credit; a supervisor must approve it."""
    if not (CONTROL / f"approved-{amount}").exists():
        raise FakeHTTPError(403, body="needs a supervisor's approval")
    return f"credited {amount}"


async def refunded(key: str) -> str | None:
    """The payment service's answer to "did the refund with this key happen?"."""
    async with await psycopg.AsyncConnection.connect(EFFECTS_DSN, autocommit=True) as conn:
        cursor = await conn.execute("SELECT order_id FROM effects WHERE key = %s", (key,))
        row = await cursor.fetchone()
    return None if row is None else f"refunded {row[0]}"


PROFILES = {"refund": ToolProfile(side_effect=True, status_check=refunded)}


def _agent_node(state: State) -> dict[str, Any]:
    return {"messages": [_MODEL.invoke(state["messages"])]}


_MODEL = model()


def _builder() -> StateGraph[Any]:
    builder = StateGraph(State)
    builder.add_node("agent", _agent_node)
    return builder


def _ours(**stores: Any) -> Any:
    builder = _builder()
    add_resilience(
        builder,
        tools=[refund, goodwill, lookup],
        agent="agent",
        profiles=PROFILES,
        escalate=True,
        **stores,
    )
    return builder.compile()


ours = _ours()

_plain = _builder()
_plain.add_edge(START, "agent")
_plain.add_node("tools", ToolNode([refund, goodwill]))
_plain.add_conditional_edges("agent", tools_condition)
_plain.add_edge("tools", "agent")
plain = _plain.compile()

middleware = create_agent(
    model(), [refund, goodwill], middleware=[ResilienceMiddleware(profiles=PROFILES)]
)


def _note_opened(stores_id: int) -> None:
    with OPENED.open("a") as out:
        out.write(f"{os.getpid()} {stores_id}\n")


async def shared(config: RunnableConfig) -> Any:
    """A graph factory: the server may call it per run; the stores open once."""
    stores = await ashared_postgres(os.environ["LGR_SHARED_DSN"])
    await asyncio.to_thread(_note_opened, id(stores))
    return _ours(idempotency=stores.idempotency, saga=stores.saga, breaker_store=stores.breakers)


TRIPPY = BreakerConfig(minimum_calls=1, window_size=1, open_duration=300)
"""Opens on one failed call: the outage test learns an outage at once."""


async def shared_trippy(config: RunnableConfig) -> Any:
    """`shared` with a breaker one failed call opens (the outage test)."""
    stores = await ashared_postgres(os.environ["LGR_SHARED_DSN"])
    return _ours(
        idempotency=stores.idempotency,
        saga=stores.saga,
        breaker_store=stores.breakers,
        breaker=TRIPPY,
        policy=ResiliencePolicy(max_attempts=2),
    )
