"""`--help` and `import langgraph_resilience` import nothing heavy: LangGraph, LangChain,
psycopg and the demo are imported by the command or the name that needs them."""

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
    the tools node knows MCP tools (graph/mcp.py imports it only when serving)."""
    script = (
        "import langgraph_resilience as l; l.add_resilience; l.GuardedToolNode; "
        "from langgraph_resilience.mcp import McpSessions"
    )
    assert imported_by("-c", script) & {"mcp", "langchain_mcp_adapters"} == set()
