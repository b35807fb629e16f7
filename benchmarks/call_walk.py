"""How long a walk one tool call takes through the package, on the README's quick start.

    python -m benchmarks.call_walk            # the three walks
    python -m benchmarks.call_walk --files    # and the files each one visits

Traces one ``app.invoke`` of a turn with one tool call (after a warm-up turn on
another thread, so imports and first-use caches are not counted) and reports the
package's distinct functions, the files they live in, and how often the walk moves
from one file to another. Three calls: a clean read, a side effect, and a read that
fails once and is retried. Issue 34's targets: a clean call in at most 8 files and 40
functions, a side effect and a retry in at most 12 files.
"""

from __future__ import annotations

import pathlib
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import MessagesState, StateGraph

import langgraph_resilience
from langgraph_resilience import ResiliencePolicy, ResilienceState, ToolProfile, add_resilience
from langgraph_resilience.testing import FakeClock, ScriptedChatModel, text, tool_calls

PACKAGE = str(pathlib.Path(langgraph_resilience.__file__).parent)


class State(MessagesState, ResilienceState): ...


def _app(tool_name: str, fail_first: bool) -> tuple[Any, Callable[[], None]]:
    """A quick-start graph whose model calls `tool_name` once per turn."""
    failures = {"left": 0}

    @tool
    def search(query: str) -> str:
        """Search the catalogue."""
        if failures["left"]:
            failures["left"] -= 1
            raise ConnectionRefusedError("catalogue.example: connection refused")
        return f"3 results for {query!r}"

    @tool
    def create_order(item: str) -> str:
        """Order one item."""
        return f"ordered {item}"

    args = {"search": {"query": "desk lamp"}, "create_order": {"item": "desk lamp"}}
    model = ScriptedChatModel(
        responses=[tool_calls((tool_name, args[tool_name])), text("done")] * 2
    )

    def call_model(state: State) -> dict[str, Any]:
        return {"messages": [model.bind_tools([search, create_order]).invoke(state["messages"])]}

    builder = StateGraph(State)
    builder.add_node("agent", call_model)
    add_resilience(
        builder,
        agent="agent",
        tools=[search, create_order],
        policy=ResiliencePolicy(max_attempts=3),
        clock=FakeClock(),
        profiles={"create_order": ToolProfile(side_effect=True)},
    )

    def arm() -> None:
        failures["left"] = 1 if fail_first else 0

    return builder.compile(checkpointer=InMemorySaver()), arm


def walk(
    tool_name: str, *, fail_first: bool = False
) -> tuple[set[tuple[str, str, int]], list[str]]:
    """The package's functions called during one traced turn, and the files in the
    order the walk entered them."""
    app, arm = _app(tool_name, fail_first)
    request = {"messages": [("user", "go")]}
    arm()
    app.invoke(request, {"configurable": {"thread_id": "warm-up"}})
    functions: set[tuple[str, str, int]] = set()
    files: list[str] = []

    def profile(frame: FrameType, event: str, _arg: object) -> None:
        code = frame.f_code
        ours = code.co_filename.startswith(PACKAGE) and "/testing/" not in code.co_filename
        if event == "call" and ours:
            functions.add((code.co_filename, code.co_name, code.co_firstlineno))
            if not files or files[-1] != code.co_filename:
                files.append(code.co_filename)

    arm()
    threading.setprofile(profile)
    sys.setprofile(profile)
    try:
        app.invoke(request, {"configurable": {"thread_id": "traced"}})
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
    return functions, files


def main() -> None:
    print(f"{'call':<12} {'functions':>9} {'files':>6} {'switches':>9}")
    for label, name, fail in (
        ("clean read", "search", False),
        ("side effect", "create_order", False),
        ("one retry", "search", True),
    ):
        functions, files = walk(name, fail_first=fail)
        print(f"{label:<12} {len(functions):>9} {len(set(files)):>6} {len(files) - 1:>9}")
        if "--files" in sys.argv:
            for path in sorted(set(files)):
                count = sum(1 for f, _, _ in functions if f == path)
                print(f"    {count:>4}  {path.removeprefix(PACKAGE + '/')}")


if __name__ == "__main__":
    main()
