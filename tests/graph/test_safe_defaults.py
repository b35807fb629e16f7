"""Safe by default: the side-effect ledger follows the checkpointer the user chose."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import sqlite3
import warnings
from typing import Any

import pytest
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.constants import CONFIG_KEY_CHECKPOINTER

from langgraph_resilience import ConfigurationError, ToolProfile, open_sqlite
from langgraph_resilience.stores.effect_ledger import LedgerResolver
from langgraph_resilience.testing import text, tool_calls
from tests.conftest import Runner, build_graph


def make_pay(paid: list[int]) -> Any:
    @tool
    def pay(amount: int) -> str:
        """Pay."""
        paid.append(amount)
        return "paid"

    return pay


class DiskBackedSaver(InMemorySaver):
    """A checkpointer this package knows nothing about (a server's, a community one)."""


def test_side_effects_next_to_an_unknown_durable_checkpointer_fail_loudly(
    runner: Runner,
) -> None:
    """No silent in-process ledger: the first run says what to pass, and nothing paid."""
    paid: list[int] = []
    h = build_graph(
        [make_pay(paid)],
        [tool_calls(("pay", {"amount": 5})), text("done")],
        profiles={"pay": ToolProfile(side_effect=True)},
        checkpointer=DiskBackedSaver(),
    )
    with pytest.raises(ConfigurationError, match="pass idempotency= and saga="):
        runner.invoke(h.app, {"messages": [("user", "pay 5")]}, h.config())
    assert paid == []


def test_a_plain_sqlite_saver_gets_its_ledger_in_the_same_file(tmp_path: Any) -> None:
    """LangGraph's own SqliteSaver, no idempotency=: the intent and outcome are in its file."""
    path = tmp_path / "threads.sqlite"
    conn = sqlite3.connect(path, check_same_thread=False)
    paid: list[int] = []
    h = build_graph(
        [make_pay(paid)],
        [tool_calls(("pay", {"amount": 5})), text("done")],
        profiles={"pay": ToolProfile(side_effect=True)},
        checkpointer=SqliteSaver(conn),
    )
    h.app.invoke({"messages": [("user", "pay 5")]}, h.config())
    conn.close()

    with contextlib.closing(sqlite3.connect(path)) as check:
        rows = check.execute("SELECT tool, status FROM lgr_idempotency").fetchall()
    assert rows == [("pay", "done")]
    assert paid == [5]


def test_a_plain_async_sqlite_saver_gets_its_ledger_in_the_same_file(tmp_path: Any) -> None:
    """LangGraph's AsyncSqliteSaver, no idempotency=: the intent and outcome are in its
    file (its name read on the saver's connection under the saver's lock)."""
    path = tmp_path / "threads.sqlite"
    paid: list[int] = []

    async def run() -> None:
        async with AsyncSqliteSaver.from_conn_string(str(path)) as saver:
            h = build_graph(
                [make_pay(paid)],
                [tool_calls(("pay", {"amount": 5})), text("done")],
                profiles={"pay": ToolProfile(side_effect=True)},
                checkpointer=saver,
            )
            await h.app.ainvoke({"messages": [("user", "pay 5")]}, h.config())

    asyncio.run(run())

    with contextlib.closing(sqlite3.connect(path)) as check:
        rows = check.execute("SELECT tool, status FROM lgr_idempotency").fetchall()
    assert rows == [("pay", "done")]
    assert paid == [5]


@pytest.mark.parametrize("api", ["sync", "async"])
def test_the_ledger_closes_its_sqlite_connections_when_the_saver_goes(
    tmp_path: Any, api: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ledger beside a LangGraph SqliteSaver opens connections of its own; they are
    closed once the saver is gone, not left to the collector (Python 3.13 warns of a
    connection collected open, and a test suite with warnings as errors fails)."""
    opened: list[bool] = []  # one "closed?" flag per connection

    class Watched(sqlite3.Connection):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.index = len(opened)
            opened.append(False)

        def close(self) -> None:
            opened[self.index] = True
            super().close()

    connect = sqlite3.connect
    monkeypatch.setattr(sqlite3, "connect", functools.partial(connect, factory=Watched))
    path, paid = str(tmp_path / "threads.sqlite"), []

    def graph(saver: Any) -> Any:
        return build_graph(
            [make_pay(paid)],
            [tool_calls(("pay", {"amount": 5})), text("done")],
            profiles={"pay": ToolProfile(side_effect=True)},
            checkpointer=saver,
        )

    def run_sync() -> None:
        with SqliteSaver.from_conn_string(path) as saver:
            h = graph(saver)
            h.app.invoke({"messages": [("user", "pay 5")]}, h.config())

    async def run_async() -> None:
        async with AsyncSqliteSaver.from_conn_string(path) as saver:
            h = graph(saver)
            await h.app.ainvoke({"messages": [("user", "pay 5")]}, h.config())

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)  # 3.13: the failure, said below
        run_sync() if api == "sync" else asyncio.run(run_async())
        gc.collect()
    assert paid == [5]
    assert len(opened) >= 3  # the saver's connection and the ledger's two
    assert all(opened), f"{opened.count(False)} of {len(opened)} connections left open"


def test_an_async_sqlite_saver_in_a_sync_run_is_refused(tmp_path: Any) -> None:
    """A sync run (from a thread, while the saver's loop runs) cannot read the file of an
    AsyncSqliteSaver: the ledger is refused with what to do, not kept in-process."""

    async def run() -> None:
        async with AsyncSqliteSaver.from_conn_string(str(tmp_path / "t.sqlite")) as saver:
            resolver = LedgerResolver(idempotency=None, saga=None, needed=True)
            config: Any = {"configurable": {CONFIG_KEY_CHECKPOINTER: saver}}
            with pytest.raises(ConfigurationError, match="ainvoke"):
                await asyncio.to_thread(resolver.resolve, config)

    asyncio.run(run())


def test_open_sqlite_hands_its_own_ledger_to_the_graph(tmp_path: Any) -> None:
    """The ledger open_sqlite opened is the one the graph uses, without passing it (sync:
    LangGraph's SqliteSaver has no async methods)."""
    paid: list[int] = []
    with open_sqlite(tmp_path / "state.sqlite") as p:
        h = build_graph(
            [make_pay(paid)],
            [tool_calls(("pay", {"amount": 5})), text("done")],
            profiles={"pay": ToolProfile(side_effect=True)},
            checkpointer=p.checkpointer,
        )
        config = h.config()
        h.app.invoke({"messages": [("user", "pay 5")]}, config)
        records = p.idempotency.for_thread(config["configurable"]["thread_id"])
    assert [(r.tool, r.status) for r in records] == [("pay", "done")]


def _uncheckpointed(tools: list[Any], script: list[Any], profiles: dict[str, ToolProfile]) -> Any:
    """The README's graph, compiled without a checkpointer."""
    from langgraph.graph import StateGraph  # noqa: PLC0415

    from langgraph_resilience import add_resilience  # noqa: PLC0415
    from langgraph_resilience.testing import ScriptedChatModel  # noqa: PLC0415
    from tests.conftest import State  # noqa: PLC0415

    model = ScriptedChatModel(responses=script)
    builder = StateGraph(State)
    builder.add_node("agent", lambda state: {"messages": [model.invoke(state["messages"])]})
    add_resilience(builder, agent="agent", tools=tools, profiles=profiles)
    return builder.compile()


def test_side_effects_without_a_checkpointer_are_warned_of_once() -> None:
    """They still run exactly once in this process, but nothing can resume the thread:
    one `ResilienceWarning` says what to compile with."""
    from langgraph_resilience import ResilienceWarning  # noqa: PLC0415

    paid: list[int] = []
    script = [tool_calls(("pay", {"amount": 5})), text("done")] * 2
    app = _uncheckpointed([make_pay(paid)], script, {"pay": ToolProfile(side_effect=True)})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        app.invoke({"messages": [("user", "pay 5")]})
        app.invoke({"messages": [("user", "pay 5 again")]})
    ours = [w for w in caught if issubclass(w.category, ResilienceWarning)]
    assert len(ours) == 1
    assert "without a checkpointer" in str(ours[0].message)
    assert paid == [5, 5]


def test_a_key_asked_for_by_an_unmarked_tool_is_warned_of(runner: Runner) -> None:
    """A tool reads `current_idempotency_key()` but nobody marked it a side effect: it
    gets None, and one warning names it and says how to mark it."""
    from langgraph_resilience import ResilienceWarning, current_idempotency_key  # noqa: PLC0415

    keys: list[str | None] = []

    @tool
    def transfer(amount: int) -> str:
        """Move money (not marked as a side effect)."""
        keys.append(current_idempotency_key())
        return "moved"

    h = build_graph([transfer], [tool_calls(("transfer", {"amount": 5})), text("done")] * 2)
    with pytest.warns(ResilienceWarning, match="'transfer' asked for current_idempotency_key"):
        runner.invoke(h.app, {"messages": [("user", "move 5")]}, h.config())
    assert keys == [None]
