"""Semantic-fault benchmark: how much do cheap fixes and reflection repair recover?

Runs a seeded set of semantic faults (wrong enum case, string-typed numbers, wrong
enum value, missing field, unknown field, malformed JSON) through a real graph
built with `add_resilience(..., repair_model=...)` and reports the share fixed by
coercion alone, by one repair, by two repairs and unfixed, the LLM calls spent
per recovered failure, and whether any call exceeded MAX_REPAIR.

The repair model is scripted (no LLM is reachable here): on each attempt it
proposes the intended arguments with probability ``--competence`` (default
0.75), otherwise a wrong value or the same failed arguments. The numbers
therefore measure the machinery (coercion coverage, budgets, rejection of
repeated arguments), not a particular model's skill.

    python benchmarks/semantic_repair.py [--scenarios 240] [--seed 1] [--competence 0.75]
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import uuid
from typing import Any, Literal

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.runnables import RunnableLambda
from langchain_core.tools import StructuredTool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import MessagesState, StateGraph
from pydantic import BaseModel, ConfigDict

from langgraph_resilience import ResiliencePolicy, ResilienceState, add_resilience
from langgraph_resilience.testing import FakeClock, ScriptedChatModel, text, tool_calls


class State(MessagesState, ResilienceState):
    pass


class RefundArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    order_id: int
    amount: float
    currency: Literal["USD", "EUR", "GBP"]


class BookArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    city: str
    nights: int
    room: Literal["single", "double", "suite"]


def _refund(order_id: int, amount: float, currency: str) -> str:
    return f"refunded {amount:.2f} {currency} on {order_id}"


def _book(city: str, nights: int, room: str) -> str:
    return f"booked {nights} nights, {room}, in {city}"


TOOLS = {
    "refund": StructuredTool.from_function(
        _refund, name="refund", description="Refund an order.", args_schema=RefundArgs
    ),
    "book": StructuredTool.from_function(
        _book, name="book", description="Book a hotel.", args_schema=BookArgs
    ),
}
WRONG = {"currency": ["dollars", "euro", "pounds", "usd$"], "room": ["king", "twin", "studio"]}
KINDS = ("enum_case", "numeric_string", "wrong_enum", "missing_field", "unknown_field", "bad_json")


def intended(rng: random.Random) -> tuple[str, dict[str, Any]]:
    if rng.random() < 0.5:
        return "refund", {
            "order_id": rng.randint(1000, 9999),
            "amount": round(rng.uniform(1, 500), 2),
            "currency": rng.choice(["USD", "EUR", "GBP"]),
        }
    return "book", {
        "city": rng.choice(["Oslo", "Lima", "Kyoto", "Porto"]),
        "nights": rng.randint(1, 9),
        "room": rng.choice(["single", "double", "suite"]),
    }


def corrupt(kind: str, tool: str, args: dict[str, Any], rng: random.Random) -> Any:
    """The faulty arguments the agent emits (a str means unparseable JSON)."""
    bad = dict(args)
    enum_field = "currency" if tool == "refund" else "room"
    number_field = "amount" if tool == "refund" else "nights"
    if kind == "enum_case":
        bad[enum_field] = rng.choice([str.lower, str.title, lambda s: f" {s.lower()} "])(
            args[enum_field]
        )
    elif kind == "numeric_string":
        bad[number_field] = str(args[number_field])
    elif kind == "wrong_enum":
        bad[enum_field] = rng.choice(WRONG[enum_field])
    elif kind == "missing_field":
        del bad[enum_field]
    elif kind == "unknown_field":
        bad["priority"] = "high"
    elif kind == "bad_json":
        return json.dumps(args)[:-3]
    return bad


def repairer(
    tool: str, good: dict[str, Any], rng: random.Random, competence: float
) -> ScriptedChatModel:
    """A scripted repair model: right with probability `competence` per attempt."""

    def attempt(_: list[BaseMessage]) -> AIMessage:
        if rng.random() < competence:
            return tool_calls((tool, good))
        wrong = dict(good)
        field = "currency" if tool == "refund" else "room"
        wrong[field] = rng.choice(WRONG[field])
        return tool_calls((tool, wrong))

    return ScriptedChatModel(responses=[attempt] * 4)


def run_one(kind: str, rng: random.Random, competence: float) -> dict[str, Any]:
    tool, good = intended(rng)
    bad = corrupt(kind, tool, good, rng)
    if isinstance(bad, str):
        first: AIMessage = AIMessage(
            content="",
            invalid_tool_calls=[
                {
                    "name": tool,
                    "args": bad,
                    "id": "c1",
                    "error": "bad JSON",
                    "type": "invalid_tool_call",
                }
            ],
        )
    else:
        first = tool_calls((tool, bad))
    agent_model = ScriptedChatModel(responses=[first, text("done")])
    repair_model = repairer(tool, good, rng, competence)
    builder = StateGraph(State)
    builder.add_node(
        "agent", RunnableLambda(lambda s: {"messages": [agent_model.invoke(s["messages"])]})
    )
    add_resilience(
        builder,
        agent="agent",
        tools=list(TOOLS.values()),
        policy=ResiliencePolicy(max_repair=2),
        clock=FakeClock(),
        repair_model=repair_model,
    )
    app = builder.compile(checkpointer=InMemorySaver())
    out = app.invoke(
        {"messages": [("user", f"please {tool} with {json.dumps(good)}")]},
        {"configurable": {"thread_id": uuid.uuid4().hex}},
    )
    [message] = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    expected = TOOLS[tool].invoke(good)
    ledger = out["resilience"]
    record = next(iter(ledger["calls"].values()))
    return {
        "kind": kind,
        "fixed": message.status == "success" and message.content == expected,
        "repairs": record.get("repairs", 0),
        "llm_calls": ledger.get("llm_calls", 0),
        "coerced": bool(record.get("coercions")),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", type=int, default=240)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--competence", type=float, default=0.75)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    results = [run_one(KINDS[i % len(KINDS)], rng, args.competence) for i in range(args.scenarios)]
    buckets: collections.Counter[str] = collections.Counter()
    per_kind: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for r in results:
        if not r["fixed"]:
            bucket = "unfixed"
        elif r["llm_calls"] == 0:
            bucket = "coercion"
        else:
            bucket = f"{r['llm_calls']} repair" + ("s" if r["llm_calls"] > 1 else "")
        buckets[bucket] += 1
        per_kind[r["kind"]][bucket] += 1
    recovered = [r for r in results if r["fixed"]]
    llm_total = sum(r["llm_calls"] for r in results)
    summary = {
        "scenarios": len(results),
        "share": {k: round(v / len(results), 3) for k, v in sorted(buckets.items())},
        "per_kind": {k: dict(v) for k, v in per_kind.items()},
        "llm_calls_per_recovered": round(llm_total / max(1, len(recovered)), 3),
        "llm_calls_per_repaired": round(
            llm_total / max(1, sum(1 for r in recovered if r["llm_calls"])), 3
        ),
        "max_repairs_seen": max(r["repairs"] for r in results),
        "exceeded_max_repair": sum(1 for r in results if r["repairs"] > 2),
    }
    print(json.dumps(summary, indent=2))
    return summary


if __name__ == "__main__":
    main()
