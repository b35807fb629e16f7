"""The chaos mix ``mcp_server_down`` on real MCP servers: a server holding several tools
dies for a window, and every contender runs it in one run."""

from __future__ import annotations

import pytest

pytest.importorskip("langchain_mcp_adapters", reason="the mix needs the mcp extra")

from benchmarks.chaos.mcp_server_down import run_mix

pytestmark = pytest.mark.slow  # spawns real MCP server processes


def test_resilient_learns_the_dead_server_once_and_spends_fewer_llm_calls() -> None:
    """Weather is down for four of six tasks: ours and the middleware get every
    forecast (the backup serves), send the dead server at most the calls made before
    its breaker opened, fewer than ToolNode's and create_agent's, and spend fewer LLM
    calls (no call to switch tools by hand)."""
    outcomes = {o.contender: o for o in run_mix(tasks=6, down_from=1, down_until=5)}
    toolnode, retrying = outcomes["toolnode"], outcomes["create_agent"]
    for name in ("resilient", "middleware"):
        ours = outcomes[name]
        assert ours.success == 6
        assert ours.dead_calls <= 2 * 3  # both tools' attempts before the breaker opened
        assert ours.dead_calls < toolnode.dead_calls < retrying.dead_calls
        assert ours.llm_calls < toolnode.llm_calls
    assert toolnode.dead_calls == 2 * 4  # both tools, once, in each of the four tasks
    assert retrying.dead_calls == 3 * 2 * 4  # three attempts of both tools, four tasks
