"""MCP tools that survive their servers: loading them with one breaker per server,
sessions that reconnect, and serving a tool that deduplicates by idempotency key.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from langgraph_resilience._lazy import lazy_exports as _lazy_exports

if TYPE_CHECKING:
    from langgraph_resilience._graph.mcp import (
        aload_mcp_tools,
        load_mcp_tools,
        mcp_server_tool,
    )
    from langgraph_resilience._graph.mcp_sessions import (
        McpSessions,
    )
    from langgraph_resilience.core.mcp import (
        Reconnect,
    )

_HOMES: dict[str, str] = {
    "Reconnect": "langgraph_resilience.core.mcp",
    "aload_mcp_tools": "langgraph_resilience._graph.mcp",
    "load_mcp_tools": "langgraph_resilience._graph.mcp",
    "mcp_server_tool": "langgraph_resilience._graph.mcp",
    "McpSessions": "langgraph_resilience._graph.mcp_sessions",
}
"""Where each public name lives: imported from there on first use."""

__all__ = [
    "McpSessions",
    "Reconnect",
    "aload_mcp_tools",
    "load_mcp_tools",
    "mcp_server_tool",
]

__getattr__, __dir__ = _lazy_exports(__name__, _HOMES)
