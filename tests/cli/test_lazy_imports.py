"""`--help` and `import langgraph_resilience` import nothing heavy: LangGraph, LangChain,
psycopg, detect-secrets and the demo are imported by the command or the name that needs
them."""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = (
    "langgraph",
    "langchain_core",
    "psycopg",
    "psycopg_pool",
    "pydantic",
    "rich",
    "mcp",
    "langchain_mcp_adapters",
    "detect_secrets",  # the `secrets` extra: imported by the first redaction
)


def imported_by(*args: str) -> set[str]:
    """Top-level packages a fresh interpreter imports to run `args` (``-X importtime``)."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    names = set()
    for line in done.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip().split(".")[0])
    return names


@pytest.mark.parametrize(
    "args",
    [
        ("-m", "langgraph_resilience", "--help"),
        ("-m", "langgraph_resilience", "demo", "--help"),
        ("-c", "import langgraph_resilience"),
    ],
    ids=["help", "demo-help", "import"],
)
def test_nothing_heavy_is_imported(args: tuple[str, ...]) -> None:
    """None of the heavy packages is imported on these paths."""
    assert imported_by(*args) & set(HEAVY) == set()


def test_a_name_is_imported_on_first_use() -> None:
    """Touching a name imports its home (and what it needs), and nothing before."""
    assert "langgraph" in imported_by("-c", "import langgraph_resilience as l; l.add_resilience")


def test_the_mcp_extra_is_imported_only_by_what_serves_or_loads_mcp_tools() -> None:
    """A graph without MCP tools never imports the optional mcp extra, even though
    the tools node knows MCP tools (_graph/mcp.py imports it only when serving)."""
    script = (
        "import langgraph_resilience as l; l.add_resilience; l.GuardedToolNode; "
        "from langgraph_resilience.mcp import McpSessions"
    )
    assert imported_by("-c", script) & {"mcp", "langchain_mcp_adapters"} == set()


_IN_MEMORY_RUN = """
import sys
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import MessagesState, StateGraph
from langgraph_resilience import (
    ResilienceMiddleware, ResilienceState, ToolProfile, add_resilience, resilient_model,
)
from langgraph_resilience.testing import ScriptedChatModel, text, tool_calls

@tool
def pay(amount: int) -> str:
    '''Pay.'''
    return "paid"

model = ScriptedChatModel(responses=[tool_calls(("pay", {"amount": 3})), text("done")])
class State(MessagesState, ResilienceState): ...
builder = StateGraph(State)
builder.add_node("agent", lambda s: {"messages": [model.invoke(s["messages"])]})
add_resilience(builder, agent="agent", tools=[pay], profiles={"pay": ToolProfile(side_effect=True)})
app = builder.compile(checkpointer=InMemorySaver())
app.invoke({"messages": [("user", "pay 3")]}, {"configurable": {"thread_id": "t"}})
ResilienceMiddleware(profiles={"pay": ToolProfile(side_effect=True)})
resilient_model(model)
backends = ("psycopg", "langgraph.checkpoint.postgres", "langgraph.checkpoint.sqlite", "aiosqlite")
print(sorted(name for name in sys.modules if name.startswith(backends)))
"""


def test_an_in_memory_user_imports_no_database_driver() -> None:
    """A graph with a side-effecting tool on `InMemorySaver`, the middleware and a
    resilient model never import psycopg, its pool, or LangGraph's Postgres and SQLite
    savers: each backend is imported by the saver or store that needs it."""
    done = subprocess.run(
        [sys.executable, "-c", _IN_MEMORY_RUN],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"
