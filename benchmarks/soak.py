"""A soak: 10,000 turns in one process, its resident memory sampled as it goes.

Each turn is a task on a new thread: the model asks for a read (``t1``) and a side
effect (``pay``, ``ToolProfile(side_effect=True)``), both succeed, the model answers;
the thread is then deleted from the saver (``delete_thread``, as a server's thread
TTL does). Graph A is ``add_resilience`` with every default store (the idempotency
ledger and saga log chosen for the saver, the in-process breakers and retry budget);
graph B is LangGraph's ``ToolNode``. Each graph runs in its own child process, so
one's heap does not blur the other's, once per saver: ``InMemorySaver`` and
``SqliteSaver`` on a file (the demo's default).

RSS (``/proc/self/statm``, after ``gc.collect()``) is sampled every tenth of the run.
The verdict looks at the second half, after warm-up: A's growth per 1,000 turns must
stay within 64 KB of B's (flat: what grows, grows for plain LangGraph too).

    python benchmarks/soak.py               # 10,000 turns per graph and saver (~5 min)
    python benchmarks/soak.py --quick       # 1,000 turns
    python benchmarks/soak.py --turns 20000 --savers memory
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage, HumanMessage, ToolCall, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from langgraph_resilience import ResilienceState, ToolProfile, add_resilience
from langgraph_resilience.testing import text, tool_calls

SLACK_KB_PER_1000 = 64.0
PAGE = os.sysconf("SC_PAGE_SIZE")


@tool
def t1(query: str) -> str:
    """A read."""
    return f"t1:{query}"


@tool
def pay(order: str) -> str:
    """A side effect."""
    return f"paid {order}"


class State(MessagesState, ResilienceState):
    """A's state."""


class SoakModel(BaseChatModel):
    """A real `BaseChatModel` that keeps nothing between calls (`ScriptedChatModel`
    records every prompt it saw, which is a leak in a soak): a human message gets the
    two tool calls, anything else the answer."""

    @property
    def _llm_type(self) -> str:
        return "soak"

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        last = messages[-1]
        if isinstance(last, HumanMessage):
            order = str(last.content)
            reply = tool_calls(
                ToolCall(
                    name="t1", args={"query": order}, id=f"r-{uuid.uuid4().hex}", type="tool_call"
                ),
                ToolCall(
                    name="pay", args={"order": order}, id=f"p-{uuid.uuid4().hex}", type="tool_call"
                ),
            )
        else:
            reply = text("done")
        return ChatResult(generations=[ChatGeneration(message=reply)])


def build(kind: str, saver: BaseCheckpointSaver[Any]) -> Any:
    model = SoakModel()

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    if kind == "A":
        builder = StateGraph(State)
        builder.add_node("agent", agent)
        add_resilience(
            builder, agent="agent", tools=[t1, pay], profiles={"pay": ToolProfile(side_effect=True)}
        )
        return builder.compile(checkpointer=saver)
    plain = StateGraph(MessagesState)
    plain.add_node("agent", agent)
    plain.add_node("tools", ToolNode([t1, pay]))
    plain.add_edge(START, "agent")
    plain.add_conditional_edges("agent", tools_condition)
    plain.add_edge("tools", "agent")
    return plain.compile(checkpointer=saver)


def _saver(name: str, folder: str) -> BaseCheckpointSaver[Any]:
    if name == "memory":
        return InMemorySaver()
    import sqlite3  # noqa: PLC0415

    from langgraph.checkpoint.sqlite import SqliteSaver  # noqa: PLC0415

    conn = sqlite3.connect(os.path.join(folder, "soak.sqlite"), check_same_thread=False)
    return SqliteSaver(conn)


def rss_kb() -> float:
    with open("/proc/self/statm", encoding="ascii") as statm:
        return int(statm.read().split()[1]) * PAGE / 1024


def child(kind: str, saver_name: str, turns: int) -> dict[str, Any]:
    """One graph's soak, in this process: the RSS samples."""
    logging.getLogger("langgraph_resilience").setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory() as folder:
        saver = _saver(saver_name, folder)
        graph = build(kind, saver)
        samples: list[tuple[int, float]] = []
        step = max(turns // 10, 1)
        started = time.perf_counter()
        for turn in range(1, turns + 1):
            thread = uuid.uuid4().hex
            config: dict[str, Any] = {"configurable": {"thread_id": thread}}
            out = graph.invoke({"messages": [HumanMessage(f"order-{turn}")]}, config)
            answers = [m for m in out["messages"] if isinstance(m, ToolMessage)]
            if len(answers) != 2 or any(m.status != "success" for m in answers):
                raise RuntimeError(f"turn {turn} did not take the clean path: {out['messages']}")
            saver.delete_thread(thread)
            if turn % step == 0:
                gc.collect()
                samples.append((turn, rss_kb()))
        return {"samples": samples, "seconds": time.perf_counter() - started}


def slope(samples: list[tuple[int, float]]) -> float:
    """KB per 1,000 turns over the second half (least squares)."""
    half = samples[len(samples) // 2 - 1 :]
    xs = [t for t, _ in half]
    ys = [r for _, r in half]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    den = sum((x - mx) ** 2 for x in xs) or 1.0
    return 1000 * sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1,000 turns")
    parser.add_argument("--turns", type=int)
    parser.add_argument("--savers", nargs="+", default=["memory", "sqlite"])
    parser.add_argument("--json", metavar="OUT")
    parser.add_argument(
        "--child", nargs=3, metavar=("KIND", "SAVER", "TURNS"), help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    if args.child:
        kind, saver, turns = args.child
        print(json.dumps(child(kind, saver, int(turns))))
        return 0
    turns = args.turns or (1000 if args.quick else 10_000)
    print(f"soak: {turns} turns per graph and saver, each in its own process")
    results: dict[str, Any] = {}
    ok = True
    for saver in args.savers:
        row = {}
        for kind in ("A", "B"):
            done = subprocess.run(
                [sys.executable, __file__, "--child", kind, saver, str(turns)],
                check=True,
                capture_output=True,
                text=True,
            )
            row[kind] = json.loads(done.stdout.strip().splitlines()[-1])
            row[kind]["slope"] = slope(row[kind]["samples"])
        results[saver] = row
        a, b = row["A"], row["B"]
        flat = a["slope"] <= b["slope"] + SLACK_KB_PER_1000
        ok = ok and flat
        first_a, last_a = a["samples"][0][1], a["samples"][-1][1]
        first_b, last_b = b["samples"][0][1], b["samples"][-1][1]
        print(
            f"{saver:<7} A RSS {first_a / 1024:6.1f} -> {last_a / 1024:6.1f} MB, "
            f"{a['slope']:+7.1f} KB/1000 turns ({a['seconds']:.0f} s) | "
            f"B RSS {first_b / 1024:6.1f} -> {last_b / 1024:6.1f} MB, "
            f"{b['slope']:+7.1f} KB/1000 turns ({b['seconds']:.0f} s)  "
            f"{'FLAT' if flat else 'GROWS'}"
        )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(results, out, indent=2)
    print("flat with every default store" if ok else "A grows faster than B")
    return 0


if __name__ == "__main__":
    sys.exit(main())
