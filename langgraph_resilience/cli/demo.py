"""The demo: a support agent whose tools fail in every way the taxonomy knows.

A customer's lamp arrived broken. The agent (a scripted model) looks the order
up, checks the refund policy, finds a replacement, books a return, offers a
goodwill credit and refunds the order; each tool fails the way real ones do:

========================  ==========================================  =====================
tool                      what goes wrong                             recovered by
========================  ==========================================  =====================
lookup_order              HTTP 429 with ``Retry-After: 2``            retry (waits 2 s)
track_shipment            timeout                                     retry (backoff)
check_refund_policy       the model sends ``currency="dollars"``      reflection repair
quote_replacement         the model sends ``currency="usd"``          coercion (no LLM)
check_stock               warehouse API down (503 on every retry)     fallback tool
create_return_label       endpoint removed (410 Gone)                 verified replan
goodwill_credit           above the agent's limit: a policy refusal   a human (interrupt)
refund                    money moves, then the response is lost      status check, once
========================  ==========================================  =====================

It is an ordinary user graph (an ``agent`` node, then `add_resilience`), so
what it prints is what a user's graph does. Every model is a *function of the
messages* it is shown, never of a call counter, so a thread started in one
process continues correctly in another (``--crash-at``, then ``resume``). The
clock is a `FakeClock` anchored at the real time: backoff is simulated, yet the
due times stored in the checkpoint are wall-clock times.

The simulated back office (`DemoStore`, in `langgraph_resilience.cli.back_office`)
lives next to the checkpoints and logs every executed side effect. The demo uses
the package's public API, as a user's graph would.
"""

from __future__ import annotations

import dataclasses
import json
import random
import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from langchain_core.messages import AIMessage, AnyMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableLambda
from langchain_core.tools import BaseTool, tool
from langgraph.config import get_config
from langgraph.graph import MessagesState, StateGraph

from langgraph_resilience import (
    BreakerConfig,
    FailureClass,
    ResiliencePolicy,
    ResilienceState,
    ToolProfile,
    add_resilience,
    current_idempotency_key,
    tool_error_of,
)
from langgraph_resilience.cli.back_office import DemoStore, open_demo_store
from langgraph_resilience.core.effects import SagaLog
from langgraph_resilience.core.validation import parsed_content
from langgraph_resilience.errors import ToolFailure
from langgraph_resilience.stores import EffectStatus, IdempotencyStore
from langgraph_resilience.testing import FakeClock, Fault, FaultyTool, ScriptedChatModel

__all__ = [
    "CUSTOMER_REQUEST",
    "SIDE_EFFECTS",
    "AfterEffect",
    "DemoState",
    "DemoStore",
    "SupportDemo",
    "build_demo",
    "is_demo_thread",
    "open_demo_store",
]

CUSTOMER_REQUEST = (
    "Hi, my order 1042 (a desk lamp) arrived broken. Where is the rest of it, can I get a "
    "replacement, and please refund the USD 80. Some credit for the trouble would be nice."
)
ORDER_ID = 1042
CUSTOMER_ID = "C-2231"
SKU = "LAMP-7"
GOODWILL_LIMIT = 10.0
"""Goodwill credit an agent may grant alone; above it a supervisor must approve."""

SIDE_EFFECTS = ("goodwill_credit", "refund")
"""The side-effecting tools: run under idempotency keys, logged in the back office."""

Currency = Literal["USD", "EUR", "GBP"]

AfterEffect = Callable[[str, str], None]
"""``after_effect(tool, idempotency_key)``: called inside a side-effecting tool right
after the effect is durable in the back office, before the tool returns (the CLI's
``--crash-at refund`` kills the process there)."""


class DemoState(MessagesState, ResilienceState):
    """The demo graph's state: messages plus the resilience tally."""


# ------------------------------------------------------------------ the tools


@tool
def lookup_order(order_id: int) -> dict[str, Any]:
    """Look up an order by id."""
    return {
        "order_id": order_id,
        "customer_id": CUSTOMER_ID,
        "item": "desk lamp",
        "sku": SKU,
        "total": 80.0,
        "currency": "USD",
        "parcels": 2,
    }


@tool
def track_shipment(order_id: int) -> dict[str, Any]:
    """Tracking status of an order's parcels."""
    return {
        "order_id": order_id,
        "parcels": [
            {"parcel": 1, "status": "delivered 27 Nov, signed by R. Ito"},
            {"parcel": 2, "status": "in transit, due 2 Dec"},
        ],
    }


@tool
def check_refund_policy(order_id: int, amount: float, currency: Currency) -> dict[str, Any]:
    """Is a refund of `amount` `currency` on the order allowed?"""
    return {"eligible": True, "amount": amount, "currency": currency, "reason": "damaged, 9 days"}


@tool
def quote_replacement(sku: str, currency: Currency) -> dict[str, Any]:
    """Price of a replacement for `sku`."""
    return {"sku": sku, "price": 80.0, "currency": currency}


@tool
def check_stock(sku: str) -> dict[str, Any]:
    """Live warehouse stock of `sku` (the warehouse API)."""
    return {"sku": sku, "available": 12, "source": "warehouse API"}


@tool
def check_stock_cached(sku: str) -> dict[str, Any]:
    """Stock of `sku` from the catalogue cache (refreshed every 5 minutes)."""
    return {"sku": sku, "available": 12, "source": "catalogue cache, 5 min old"}


@tool
def create_return_label(order_id: int) -> str:
    """Create a prepaid return label (the v1 labels endpoint)."""
    return f"label for order {order_id}"


@tool
def find_carrier(order_id: int) -> dict[str, Any]:
    """The carrier that serves returns for an order."""
    return {"order_id": order_id, "carrier": "UPS"}


@tool
def book_pickup(order_id: int, carrier: str) -> dict[str, Any]:
    """Book a pickup of the return with a carrier."""
    return {"pickup_id": f"PU-{order_id}", "carrier": carrier, "window": "tomorrow 9-12"}


def _thread_id() -> str:
    return str((get_config().get("configurable") or {}).get("thread_id", ""))


def _refund_text(row: Mapping[str, Any]) -> str:
    d = row["detail"]
    return (
        f"refund R-{row['id']}: {d['currency']} {d['amount']:.2f} back to the card "
        f"for order {d['order_id']}"
    )


def _credit_text(row: Mapping[str, Any]) -> str:
    d = row["detail"]
    return f"credit G-{row['id']}: {d['currency']} {d['amount']:.2f} added to {d['customer_id']}"


def _effect_tools(
    store: DemoStore, after_effect: AfterEffect | None
) -> tuple[list[BaseTool], dict[str, ToolProfile]]:
    """The side-effecting tools (they write to the back office) and their profiles."""

    def done(kind: str, key: str, detail: dict[str, Any]) -> dict[str, Any]:
        thread_id = _thread_id()
        ref = store.record_effect(thread_id=thread_id, kind=kind, key=key, detail=detail)
        if after_effect is not None:
            after_effect(kind, key)  # e.g. the process dies here: effect done, nothing recorded
        return {"id": ref, "detail": detail}

    @tool
    def goodwill_credit(customer_id: str, amount: float, currency: Currency) -> str:
        """Add goodwill credit to a customer's account."""
        if amount > GOODWILL_LIMIT and not store.approved(_thread_id(), "goodwill_credit"):
            raise ToolFailure(
                FailureClass.POLICY,
                f"goodwill credit above {currency} {GOODWILL_LIMIT:.0f} needs a supervisor's "
                "approval",
                context={"limit": GOODWILL_LIMIT, "requested": amount},
            )
        key = current_idempotency_key() or ""
        detail = {"customer_id": customer_id, "amount": amount, "currency": currency}
        return _credit_text(done("goodwill_credit", key, detail))

    @tool
    def refund(order_id: int, amount: float, currency: Currency) -> str:
        """Refund an order to the customer's card."""
        key = current_idempotency_key() or ""
        detail = {"order_id": order_id, "amount": amount, "currency": currency}
        return _refund_text(done("refund", key, detail))

    def status(render: Callable[[Mapping[str, Any]], str]) -> Callable[[str], EffectStatus]:
        def check(key: str) -> EffectStatus:
            row = store.effect(key)
            return EffectStatus(done=row is not None, result=render(row) if row else None)

        return check

    lost_response = FaultyTool(refund, [Fault.timeout(after_effect=True)])
    profiles = {
        "goodwill_credit": ToolProfile(side_effect=True, status_check=status(_credit_text)),
        "refund": ToolProfile(side_effect=True, status_check=status(_refund_text)),
    }
    return [goodwill_credit, lost_response], profiles


# ------------------------------------------------------------------ the models

Turn = tuple[str, tuple[tuple[str, str, dict[str, Any]], ...]]

TURNS: tuple[Turn, ...] = (
    (
        "Let me look up your order and where its parcels are.",
        (
            ("call_lookup", "lookup_order", {"order_id": ORDER_ID}),
            ("call_track", "track_shipment", {"order_id": ORDER_ID}),
        ),
    ),
    (
        "Checking the refund policy, a replacement's price and stock.",
        (
            (
                "call_policy",
                "check_refund_policy",
                {"order_id": ORDER_ID, "amount": 80.0, "currency": "dollars"},
            ),
            ("call_quote", "quote_replacement", {"sku": SKU, "currency": "usd"}),
            ("call_stock", "check_stock", {"sku": SKU}),
        ),
    ),
    (
        "Creating a return label for the broken lamp.",
        (("call_label", "create_return_label", {"order_id": ORDER_ID}),),
    ),
    (
        "Adding a goodwill credit for the trouble.",
        (
            (
                "call_credit",
                "goodwill_credit",
                {"customer_id": CUSTOMER_ID, "amount": 15.0, "currency": "USD"},
            ),
        ),
    ),
    (
        "Refunding the lamp.",
        (("call_refund", "refund", {"order_id": ORDER_ID, "amount": 80.0, "currency": "USD"}),),
    ),
)
"""The agent's turns: each is issued once the previous one's calls are in the history."""


def _answers(messages: Sequence[BaseMessage]) -> dict[str, ToolMessage]:
    return {m.tool_call_id: m for m in messages if isinstance(m, ToolMessage)}


def _ok(message: ToolMessage | None) -> Any:
    """A successful tool result (parsed when JSON), or None."""
    if message is None or message.status == "error":
        return None
    return parsed_content(message.content)


def _final_answer(messages: Sequence[BaseMessage]) -> str:
    answers = _answers(messages)
    by_tool = {m.name: m for m in answers.values() if m.name}
    parts = ["Thanks for your patience!"]
    tracking = _ok(answers.get("call_track"))
    if isinstance(tracking, dict):
        first, second = tracking["parcels"]
        parts.append(f"Parcel 1 was {first['status']}; parcel 2 is {second['status']}.")
    refund = _ok(answers.get("call_refund"))
    if refund:
        parts.append(f"I issued the refund ({refund}).")
    else:
        parts.append("I could not confirm the refund yet; a colleague will check it today.")
    pickup = _ok(by_tool.get("book_pickup"))
    if isinstance(pickup, dict):
        parts.append(
            f"{pickup['carrier']} will collect the broken lamp {pickup['window']} "
            f"(pickup {pickup['pickup_id']})."
        )
    stock = _ok(answers.get("call_stock"))
    quote = _ok(answers.get("call_quote"))
    if isinstance(stock, dict) and isinstance(quote, dict):
        parts.append(
            f"A replacement is in stock ({stock['available']} left) at "
            f"{quote['currency']} {quote['price']:.2f}."
        )
    credit = answers.get("call_credit")
    parts.append(_credit_sentence(credit))
    return " ".join(parts)


def _credit_sentence(credit: ToolMessage | None) -> str:
    """What the customer hears of the goodwill credit: granted, or what a human decided."""
    if _ok(credit):
        return f"For the trouble: {_ok(credit)}."
    error = tool_error_of(credit) if credit is not None else None
    decided = error.context.get("human_decision") if error is not None else None
    if decided == "skip":
        return "A goodwill credit above USD 10 needs a supervisor, who declined it this time."
    if decided == "abort":
        return "The goodwill credit was not granted: the request was stopped."
    return "I could not grant a goodwill credit for the trouble."


def agent_reply(messages: Sequence[BaseMessage]) -> AIMessage:
    """The scripted agent: the first turn whose calls are not in the history yet, else
    the final answer. A pure function of the messages, so any process continues a thread."""
    issued = {
        call["id"]
        for m in messages
        if isinstance(m, AIMessage) and m.name is None
        for call in m.tool_calls
    }
    for content, calls in TURNS:
        if not all(call_id in issued for call_id, _, _ in calls):
            return AIMessage(
                content=content,
                tool_calls=[
                    {"name": name, "args": dict(args), "id": call_id, "type": "tool_call"}
                    for call_id, name, args in calls
                ],
            )
    return AIMessage(content=_final_answer(messages))


_CURRENCY_WORDS = {"dollars": "USD", "dollar": "USD", "euros": "EUR", "pounds": "GBP"}
_FAILED_CALL = re.compile(r"^Failed call: (?P<tool>\w+)\((?P<args>.*)\)$", re.MULTILINE)


def repair_reply(messages: Sequence[BaseMessage]) -> AIMessage:
    """The scripted repair model: reads the failed call from the repair prompt and maps
    currency words to ISO codes (what a real model does with ``fix_arg:currency``)."""
    prompt = "\n".join(m.text for m in messages if isinstance(m, HumanMessage))
    found = _FAILED_CALL.search(prompt)
    if found is None:
        return AIMessage(content="I cannot tell which call failed.")
    args = json.loads(found["args"])
    if isinstance(args.get("currency"), str):
        args["currency"] = _CURRENCY_WORDS.get(args["currency"].lower(), args["currency"])
    return AIMessage(
        content="",
        tool_calls=[{"name": found["tool"], "args": args, "id": "repair", "type": "tool_call"}],
    )


RETURN_PLAN: dict[str, Any] = {
    "diagnosis": {
        "failed_tool": "create_return_label",
        "failure_class": "structural",
        "cause": "create_return_label answered 410 Gone: the v1 labels endpoint was removed",
    },
    "rationale": "find_carrier picks the order's return carrier, then book_pickup books a "
    "pickup with it; neither uses the removed labels endpoint",
    "steps": [
        {"id": "carrier", "tool": "find_carrier", "args": {"order_id": ORDER_ID}},
        {
            "id": "pickup",
            "tool": "book_pickup",
            "args": {"order_id": ORDER_ID, "carrier": "$steps.carrier.output.carrier"},
            "depends_on": ["carrier"],
        },
    ],
}


def planner_reply(messages: Sequence[BaseMessage]) -> AIMessage:
    """The scripted planner: the return goes through a pickup instead of a label."""
    return AIMessage(
        content="",
        tool_calls=[{"name": "Plan", "args": RETURN_PLAN, "id": "plan", "type": "tool_call"}],
    )


def _scripted(reply: Callable[[list[BaseMessage]], AIMessage]) -> ScriptedChatModel:
    """A `ScriptedChatModel` whose every answer is `reply(messages)`."""
    return ScriptedChatModel(responses=[reply] * 64)


# ------------------------------------------------------------------ the graph


@dataclasses.dataclass
class SupportDemo:
    """The demo graph builder and its doubles."""

    builder: StateGraph[Any, Any, Any, Any]
    model: ScriptedChatModel
    repair_model: ScriptedChatModel
    planner_model: ScriptedChatModel
    clock: FakeClock
    tools: dict[str, BaseTool]
    store: DemoStore


POLICY = ResiliencePolicy(max_attempts=3, base_delay=0.5, max_delay=10)
BREAKER = BreakerConfig(window_size=1, minimum_calls=1, open_duration=60)
"""A demo-sized breaker: it opens once a tool's last call failed (a call counts once,
after its retries), so the rest of the thread skips the warehouse API."""


def _read_tools() -> list[BaseTool]:
    """The read-only tools, with their deterministic faults."""
    return [
        FaultyTool(lookup_order, [Fault.status(429, retry_after="2")]),
        FaultyTool(track_shipment, [Fault.timeout()]),
        check_refund_policy,
        quote_replacement,
        FaultyTool(check_stock, then=Fault.status(503)),
        check_stock_cached,
        FaultyTool(create_return_label, then=Fault.status(410)),
        find_carrier,
        book_pickup,
    ]


def build_demo(
    *,
    store: DemoStore,
    seed: int = 7,
    idempotency: IdempotencyStore | None = None,
    saga: SagaLog | None = None,
    after_effect: AfterEffect | None = None,
) -> SupportDemo:
    """Build the support-agent graph with deterministic faults on its tools.

    Pass `Persistence.idempotency` / `.saga` so a crashed thread resumed by another
    process never repeats a side effect; `after_effect` is the crash hook.
    """
    clock = FakeClock(epoch=time.time())
    effect_tools, profiles = _effect_tools(store, after_effect)
    profiles["check_stock"] = ToolProfile(fallback="check_stock_cached")
    demo = SupportDemo(
        builder=StateGraph(DemoState),
        model=_scripted(agent_reply),
        repair_model=_scripted(repair_reply),
        planner_model=_scripted(planner_reply),
        clock=clock,
        tools={t.name: t for t in [*_read_tools(), *effect_tools]},
        store=store,
    )
    model = demo.model

    def agent(state: DemoState) -> dict[str, list[AnyMessage]]:
        return {"messages": [model.invoke(state["messages"])]}

    async def aagent(state: DemoState) -> dict[str, list[AnyMessage]]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    demo.builder.add_node("agent", RunnableLambda(agent, afunc=aagent))
    add_resilience(
        demo.builder,
        agent="agent",
        tools=list(demo.tools.values()),
        policy=POLICY,
        profiles=profiles,
        clock=clock,
        rng=random.Random(seed),
        repair_model=demo.repair_model,
        planner_model=demo.planner_model,
        escalate=True,
        breaker=BREAKER,
        idempotency=idempotency,
        saga=saga,
    )
    return demo


def is_demo_thread(values: Mapping[str, Any]) -> bool:
    """Was this thread started by the demo (its first message is the customer's)?"""
    messages = values.get("messages") or []
    return (
        bool(messages)
        and isinstance(messages[0], HumanMessage)
        and (messages[0].text == CUSTOMER_REQUEST)
    )
