"""Listing threads: most recently written first, from each thread's latest checkpoint,
in one statement on SQLite (Postgres: tests/postgres/test_thread_listing.py; the
`threads` command: tests/cli/test_threads_command.py)."""

from __future__ import annotations

import asyncio
import operator
import pathlib
from typing import Annotated, Any

import pytest
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph
from typing_extensions import TypedDict

from langgraph_resilience.stores.persistence import open_sqlite
from langgraph_resilience.stores.threads import alist_threads, list_threads


class Counter(TypedDict):
    n: Annotated[list[int], operator.add]


def _app(checkpointer: BaseCheckpointSaver[Any]) -> Any:
    builder = StateGraph(Counter)
    builder.add_node("step", lambda state: {"n": [len(state["n"])]})
    builder.add_edge(START, "step")
    builder.add_edge("step", END)
    return builder.compile(checkpointer=checkpointer)


WRITES = ["a", "b", "c", "a", "d", "b", "a"]
"""Thread of each successive run: latest writes are a (last), then b, d, c."""
EXPECTED = ["a", "b", "d", "c"]


def _write(checkpointer: BaseCheckpointSaver[Any]) -> None:
    app = _app(checkpointer)
    for thread_id in WRITES:
        app.invoke({"n": [0]}, {"configurable": {"thread_id": thread_id}})


def test_any_checkpointer_lists_most_recently_written_first() -> None:
    """The generic walk orders by each thread's latest checkpoint, across threads."""
    saver = InMemorySaver()
    _write(saver)
    assert list_threads(saver) == EXPECTED
    assert list_threads(saver, limit=2) == ["a", "b"]
    assert list_threads(saver, limit=0) == []
    assert asyncio.run(alist_threads(saver, limit=3)) == ["a", "b", "d"]


def test_sqlite_lists_with_one_statement_and_no_checkpoint_walk(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SqliteSaver: one GROUP BY on its connection; `list()` (every checkpoint) is never
    called."""
    with open_sqlite(tmp_path / "threads.sqlite") as p:
        _write(p.checkpointer)
        saver = p.checkpointer
        assert isinstance(saver, SqliteSaver)

        def walk(*args: Any, **kwargs: Any) -> Any:
            raise AssertionError("list_threads walked every checkpoint")

        monkeypatch.setattr(SqliteSaver, "list", walk)
        statements: list[str] = []
        saver.conn.set_trace_callback(statements.append)

        listed = list_threads(saver)
        top = list_threads(saver, limit=2)
        listed_async = asyncio.run(alist_threads(saver))
        saver.conn.set_trace_callback(None)

    assert listed == EXPECTED
    assert top == ["a", "b"]
    assert listed_async == EXPECTED
    assert len(statements) == 3
    assert all("GROUP BY thread_id" in s for s in statements)


@pytest.mark.parametrize("bad", [-1, True, 1.5, "3"])
def test_a_bad_limit_is_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="limit"):
        list_threads(InMemorySaver(), limit=bad)  # type: ignore[arg-type]
