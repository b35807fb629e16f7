"""`status_from`: a side effect's ``status_check`` in one line, from the agent's own read tool.

Knowing whether an effect of unknown outcome happened is what turns a lost answer
into a recovered call (DESIGN.md section 5), and the agent usually has the read that
tells: ``get_order`` after ``cancel_order``, ``list_transactions`` after
``send_money``. `status_from` asks that tool with the effect's arguments and judges
its result with a predicate, in the graph's own mode (``invoke`` or ``ainvoke``, so
async-only tools such as MCP ones work under ``ainvoke``)::

    ToolProfile(
        side_effect=True,
        status_check=status_from(
            get_order, done=lambda order, args: order["status"] == "cancelled"
        ),
    )

A check that raises is retried like any read, within the call's attempts.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from langchain_core.tools import BaseTool

from langgraph_resilience.core.effects import EffectStatus
from langgraph_resilience.core.profile import ToolProfile
from langgraph_resilience.errors import ConfigurationError

__all__ = ["StatusCheck", "check_with", "status_from"]

Done = Callable[[Any, dict[str, Any]], "bool | EffectStatus"]
"""``done(result, call_args)``: whether the read shows the effect (or an `EffectStatus`)."""


class StatusCheck:
    """A ``status_check`` that asks a read tool (made by `status_from`)."""

    def __init__(
        self,
        tool: BaseTool,
        *,
        done: Done,
        args: Callable[[dict[str, Any]], Mapping[str, Any]] | None = None,
    ) -> None:
        if not isinstance(tool, BaseTool):
            raise ConfigurationError(
                f"status_from needs a LangChain tool (BaseTool), got {type(tool).__name__}"
            )
        if not callable(done):
            raise ConfigurationError("status_from needs done=, a function (result, args) -> bool")
        self.tool = tool
        self.done = done
        self.args = args

    def __repr__(self) -> str:
        return f"status_from({self.tool.name})"

    def read_args(self, call_args: dict[str, Any]) -> dict[str, Any]:
        """The read tool's arguments: `args(call_args)`, else the effect's arguments the
        read tool takes."""
        if self.args is not None:
            return dict(self.args(dict(call_args)))
        return {name: value for name, value in call_args.items() if name in self.tool.args}

    def judge(self, result: Any, call_args: dict[str, Any]) -> EffectStatus:
        """The effect's status from the read's result (parsed from JSON text when it is)."""
        value = _value(result)
        verdict = self.done(value, dict(call_args))
        if isinstance(verdict, EffectStatus):
            return verdict
        return EffectStatus(done=True, result=value) if verdict else EffectStatus(done=False)

    def __call__(self, key: str, call_args: dict[str, Any]) -> EffectStatus:
        """Sync check: the read tool's ``invoke``."""
        return self.judge(self.tool.invoke(self.read_args(call_args)), call_args)

    async def acheck(self, key: str, call_args: dict[str, Any]) -> EffectStatus:
        """Async check: the read tool's ``ainvoke``."""
        return self.judge(await self.tool.ainvoke(self.read_args(call_args)), call_args)


def status_from(
    tool: BaseTool,
    *,
    done: Done,
    args: Callable[[dict[str, Any]], Mapping[str, Any]] | None = None,
) -> StatusCheck:
    """A ``status_check`` that calls `tool` (a read) and asks `done(result, call_args)`
    whether the effect is there. `args` maps the effect's arguments to the read's
    (default: those of the effect's arguments the read takes). When done, the read's
    result is the recovered call's answer.

    >>> cancelled = lambda order, args: order["status"] == "cancelled"
    >>> status_from(get_order, done=cancelled)  # doctest: +SKIP
    status_from(get_order)
    """
    return StatusCheck(tool, done=done, args=args)


def _value(result: Any) -> Any:
    """A tool's result as a value: content blocks joined, JSON text parsed."""
    if isinstance(result, list) and all(
        isinstance(block, dict) and block.get("type") == "text" for block in result
    ):
        result = "".join(str(block.get("text", "")) for block in result)
    if isinstance(result, str):
        try:
            return json.loads(result)
        except json.JSONDecodeError:
            return result
    return result


_GENERIC_WORDS = frozenset({"get", "list", "read", "fetch", "find", "search", "all", "by", "the"})


def check_with(
    tools: Mapping[str, BaseTool],
    profiles: Mapping[str, ToolProfile],
    tool: str,
    args: Mapping[str, Any],
    *,
    most: int = 3,
) -> list[str]:
    """The read tools that can show whether `tool`'s effect of unknown outcome happened,
    best first, for its envelope (a real model then knows how to look): the one its
    `status_from` check reads, then reads taking the call's arguments by name, then
    reads whose name shares a word with the tool's."""
    own = profiles.get(tool)
    first = own.status_check.tool if own and isinstance(own.status_check, StatusCheck) else None
    words = set(tool.replace("-", "_").split("_")) - _GENERIC_WORDS
    scored: list[tuple[int, str]] = []
    for name, candidate in tools.items():
        profile = profiles.get(name)
        if name == tool or (profile is not None and profile.side_effect):
            continue
        shared = len(set(candidate.args) & set(args)) * 2
        shared += len(words & set(name.replace("-", "_").split("_")))
        if candidate is first:
            shared = 1000
        if shared:
            scored.append((-shared, name))
    return [name for _, name in sorted(scored)[:most]]
