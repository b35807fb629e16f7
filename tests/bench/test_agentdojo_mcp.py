"""The AgentDojo evaluation's MCP variant: each relay fault is the real MCP client
error its evidence calls for, and the tool ran or not as the kind says.

Each test serves banking's functions from a FastMCP server on loopback (a second or
so to start). Skipped unless the ``bench`` and ``mcp`` extras are installed.
"""

from __future__ import annotations

import asyncio
import pathlib
import sys

import pytest

pytest.importorskip("agentdojo", reason="needs the bench extra")
pytest.importorskip("langchain_mcp_adapters", reason="needs the mcp extra")

import anyio
from mcp.shared.exceptions import McpError

ROOT = pathlib.Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.agentdojo.faults import Mix  # noqa: E402
from benchmarks.agentdojo.mcp_transport import MCP_BEFORE, MCP_KINDS, McpHost, load_tools  # noqa: E402
from benchmarks.agentdojo.runner import Unit, cached_suite, run_unit  # noqa: E402
from benchmarks.agentdojo.tools import Sandbox  # noqa: E402
from langgraph_resilience.core.evidence import execution  # noqa: E402

EVIDENCE = {
    "mcp_refused": (McpError, "refused"),
    "closed_before": (anyio.ClosedResourceError, "refused"),
    "dropped_before": (McpError, "unknown"),
    "dropped_after": (McpError, "unknown"),
}


def _chain(error: BaseException | None) -> list[BaseException]:
    chain = []
    while error is not None:
        chain.append(error)
        error = error.__cause__ or error.__context__
    return chain


@pytest.mark.parametrize("kind", MCP_KINDS)
def test_each_relay_fault_is_the_real_mcp_error_and_runs_the_tool_as_it_says(kind: str) -> None:
    suite = cached_suite("banking")
    sandbox = Sandbox(suite, Mix(kind, 1.0, {kind: 1}, kind), seed=0)
    spec = next(t for t in suite.tasks if any(c.function == "send_money" for c in t.calls))
    call = next(c for c in spec.calls if c.function == "send_money")
    sandbox.start_task(spec.id, spec.fresh_environment())
    host = McpHost(sandbox)
    try:
        tools = {t.name: t for t in load_tools(host, ours=False)}
        error_type, evidence = EVIDENCE[kind]
        with pytest.raises(error_type) as caught:
            asyncio.run(tools["send_money"].ainvoke(dict(call.args)))
    finally:
        host.close()
    assert execution(_chain(caught.value)) == evidence
    [attempt] = sandbox.attempts
    assert attempt.ran == (kind not in MCP_BEFORE)
    assert attempt.changed == attempt.ran


def test_declared_over_mcp_resends_under_the_key_and_the_host_dedupes() -> None:
    """Every write is by_key over MCP: a lost answer is re-sent under the same key and
    answered from the host's key ledger, so nothing runs twice."""
    unit = Unit("banking", 0, "mcp_commit", "unique", ("declared",), 6, 0.0, "blind", "mcp")
    results = run_unit(unit)
    assert all(r.raised is None for r in results)
    assert sum(r.faults.get("dropped_after", 0) for r in results) > 0
    assert sum(r.duplicates + r.repeats for r in results) == 0
    assert all(r.success for r in results)
