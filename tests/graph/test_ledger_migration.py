"""A thread checkpointed by the unbounded ledger (every call record kept) resumes under
the bounded one: its waiting retry runs, its counters carry over, and the first delta
compacts it (`tests/graph/data/make_unbounded_ledger.py` wrote the fixture)."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

from langchain_core.messages import HumanMessage, ToolMessage
from langgraph.checkpoint.sqlite import SqliteSaver

from langgraph_resilience import thread_status
from langgraph_resilience.testing import FaultyTool, ScriptedChatModel, text, tool_calls
from tests.graph.data.old_thread import THREAD, TURNS, build, flaky_inner

FIXTURE = Path(__file__).parent / "data" / "unbounded_ledger.sqlite"


def _size(ledger: Any) -> int:
    return len(json.dumps(ledger, separators=(",", ":")))


def test_an_unbounded_ledger_resumes_and_is_compacted(tmp_path: Path) -> None:
    copy = tmp_path / "thread.sqlite"
    shutil.copy(FIXTURE, copy)
    conn = sqlite3.connect(copy, check_same_thread=False)
    model = ScriptedChatModel(
        responses=[
            text("flaky answered"),
            tool_calls(("lookup", {"q": "new"}), ("lookup", {"q": "newer"})),
            text("found both"),
        ]
    )
    flaky = FaultyTool(flaky_inner, [], name="flaky")
    graph = build(SqliteSaver(conn), model, flaky_tool=flaky)
    config: dict[str, Any] = {"configurable": {"thread_id": THREAD}}
    old = graph.get_state(config).values["resilience"]
    assert len(old["calls"]) == 2 * TURNS + 1  # as today's code wrote it
    [waiting] = [r for r in old["calls"].values() if r["status"] == "scheduled"]
    assert _size(old) > 12_000

    out = graph.invoke(None, config)  # resumes at the retry the old run stopped before

    assert flaky.executions == 1
    answer = out["messages"][-2]
    assert isinstance(answer, ToolMessage)
    assert answer.status == "success"
    ledger = out["resilience"]
    [record] = ledger["calls"].values()  # every finished record of older messages went
    assert record["key"] == waiting["key"]
    assert (record["status"], record["attempts"]) == ("ok", 2)
    assert record["error"]["type"] == "FakeHTTPError"  # kept for audit while it is latest
    assert ledger["done"] == {"ok": 2 * TURNS}
    assert ledger["tool_attempts"] == old["tool_attempts"] + 1
    assert ledger["events"]["attempt"] == old["events"]["attempt"] + 1
    assert _size(ledger) < 1_500

    out = graph.invoke({"messages": [HumanMessage("two more")]}, config)

    ledger = out["resilience"]
    assert ledger["calls"] == {}
    assert ledger["done"] == {"ok": 2 * TURNS + 3}
    assert ledger["tool_attempts"] == old["tool_attempts"] + 3
    assert thread_status(graph, THREAD).tally["calls"] == {"ok": 2 * TURNS + 3}
    conn.close()
