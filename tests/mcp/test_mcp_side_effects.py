"""Side effects over a real MCP session: refusals retried under the same key, the key
carried in ``_meta`` and deduplicated by the server, a refusal settled as not done."""

from __future__ import annotations

import asyncio
import contextlib
import json
import pathlib
from typing import Any

from langchain_core.messages import ToolMessage
from langchain_mcp_adapters.client import MultiServerMCPClient

from langgraph_resilience import ToolProfile
from langgraph_resilience.stores import SqliteIdempotencyStore
from langgraph_resilience.stores.sqlite import sqlite_connect
from langgraph_resilience.testing import text, tool_calls
from tests.conftest import Runner, build_graph
from tests.mcp.conftest import Calls, mcp_tools
from tests.mcp.processes import HttpServer
from tests.mcp.server import effects_file, ledger_file

SIDE_EFFECT = ToolProfile(side_effect=True)


def answers(out: dict[str, Any]) -> list[ToolMessage]:
    return [m for m in out["messages"] if isinstance(m, ToolMessage)]


def text_of(message: ToolMessage) -> str:
    content = message.content
    if isinstance(content, str):
        return content
    return "".join(b["text"] if isinstance(b, dict) else str(b) for b in content)


def effects(marker: pathlib.Path) -> list[str]:
    path = effects_file(marker)
    return path.read_text().splitlines() if path.exists() else []


def test_a_jsonrpc_refusal_of_a_side_effect_is_retried(
    runner: Runner, weather: HttpServer, calls: Calls, marker: pathlib.Path
) -> None:
    """The server answers a JSON-RPC error (-32603, "503 service unavailable") without
    running the tool: the side effect is retried, done once, and the task goes on."""
    tools = mcp_tools({"weather": weather.connection}, calls)
    h = build_graph(
        list(tools.values()),
        [tool_calls(("weather_busy_once", {"order": "A7"})), text("done")],
        profiles={"weather_busy_once": SIDE_EFFECT},
    )
    out = runner.invoke(h.app, {"messages": [("user", "go")]}, h.config())
    assert [(m.status, text_of(m)) for m in answers(out)] == [("success", "done A7")]
    assert effects(marker) == ["busy_once A7"]
    assert calls.by_server["weather"] == 2


def test_a_refusal_settles_the_intent_and_a_re_issue_runs(
    runner: Runner, weather: HttpServer, calls: Calls
) -> None:
    """isError says the cancel did not happen: the intent is settled, so the agent's
    identical re-issue is asked of the service again, never "may already have taken
    effect"."""
    tools = mcp_tools({"weather": weather.connection}, calls)
    call = ("weather_cancel", {"order": "A7"})
    h = build_graph(
        list(tools.values()),
        [tool_calls(call), tool_calls(call), text("cannot")],
        profiles={"weather_cancel": SIDE_EFFECT},
    )
    out = runner.invoke(h.app, {"messages": [("user", "cancel A7")]}, h.config())
    bodies = [json.loads(text_of(m)) for m in answers(out)]
    assert [b["failure_class"] for b in bodies] == ["semantic", "semantic"]
    assert all("cannot be cancelled" in b["message"] for b in bodies)
    assert calls.by_server["weather"] == 2


def test_the_key_travels_in_meta_and_the_server_runs_it_once(
    runner: Runner, weather: HttpServer, calls: Calls, marker: pathlib.Path
) -> None:
    """A side effect's call carries its idempotency key in ``_meta``; the server
    (`mcp_server_tool`) records it, and a repeat of the key gets the first answer
    without charging again."""
    tools = mcp_tools({"weather": weather.connection}, calls)
    h = build_graph(
        list(tools.values()),
        [tool_calls(("weather_charge", {"order": "A7", "amount": 5})), text("done")],
        profiles={"weather_charge": SIDE_EFFECT},
    )
    out = runner.invoke(h.app, {"messages": [("user", "charge")]}, h.config())
    assert text_of(answers(out)[-1]) == "charged 5.0 on A7"
    with contextlib.closing(sqlite_connect(str(ledger_file(marker)))) as conn:
        [record] = SqliteIdempotencyStore(conn).for_thread("mcp:charge")
    assert record.key.startswith("weather_charge:")
    assert record.status == "done"

    async def again() -> list[Any]:
        client = MultiServerMCPClient({"weather": weather.connection})
        async with client.session("weather") as session:
            return [
                await session.call_tool(
                    "charge", {"order": "A7", "amount": 5}, meta={"idempotency_key": record.key}
                )
                for _ in range(2)
            ]

    repeats = asyncio.run(again())
    assert [r.content[0].text for r in repeats] == ["charged 5.0 on A7"] * 2
    assert effects(marker) == ["charge A7 5.0"]
