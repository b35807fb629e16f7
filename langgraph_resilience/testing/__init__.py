"""Test doubles for resilient graphs: a fake clock, fault-injected tools, a scripted model.

Our own tests, notebooks and examples use exactly these, and so can yours::

    clock = FakeClock()
    search = FaultyTool(real_search, faults=[Fault.status(429), Fault.status(503)])
    model = ScriptedChatModel(responses=[tool_calls(("search", {"q": "x"})), text("done")])

Nothing here sleeps or touches the network.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import re
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.language_models.base import LangSmithParams
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, ToolCall
from langchain_core.messages.tool import tool_call_chunk
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable, RunnableConfig
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.types import interrupt
from pydantic import ConfigDict, Field, PrivateAttr

__all__ = [
    "FakeClock",
    "FakeHTTPError",
    "Fault",
    "FaultyTool",
    "ScriptedChatModel",
    "text",
    "tool_calls",
]


class FakeClock:
    """A `Clock` whose time only moves when someone sleeps (or `advance`s it).

    Every requested delay is recorded in `sleeps`, so tests assert exact backoff.

    >>> clock = FakeClock(); clock.sleep(1.5); clock.monotonic(), clock.sleeps
    (1.5, [1.5])
    """

    def __init__(self, *, start: float = 0.0, epoch: float = 1_700_000_000.0) -> None:
        self._now = start
        self.epoch = epoch
        self.sleeps: list[float] = []
        self._lock = threading.Lock()

    def monotonic(self) -> float:
        return self._now

    def time(self) -> float:
        return self.epoch + self._now

    def advance(self, seconds: float) -> None:
        """Move time forward without recording a sleep (time passing elsewhere)."""
        with self._lock:
            self._now += max(0.0, seconds)

    def sleep(self, seconds: float) -> None:
        with self._lock:
            self.sleeps.append(seconds)
            self._now += max(0.0, seconds)

    async def asleep(self, seconds: float) -> None:
        self.sleep(seconds)
        await asyncio.sleep(0)  # still a suspension point, as a real sleep is


class FakeHTTPError(Exception):
    """An HTTP error shaped like httpx's/requests' (``.status_code``, ``.response``).

    The package recognizes real client errors by the same duck typing.
    """

    @dataclasses.dataclass
    class Response:
        status_code: int
        headers: dict[str, str]
        text: str = ""

    def __init__(
        self, status_code: int, *, headers: Mapping[str, str] | None = None, body: str = ""
    ) -> None:
        super().__init__(f"HTTP {status_code}")
        self.status_code = status_code
        self.response = FakeHTTPError.Response(status_code, dict(headers or {}), body)


@dataclasses.dataclass(frozen=True, slots=True)
class Fault:
    """One scheduled misbehaviour of a `FaultyTool` call."""

    kind: str
    error: BaseException | None = None
    output: Any = None
    after_effect: bool = False

    @classmethod
    def raises(cls, error: BaseException) -> Fault:
        """Raise `error` instead of executing."""
        return cls("raise", error=error)

    @classmethod
    def status(
        cls,
        code: int,
        *,
        retry_after: str | float | None = None,
        body: str = "",
        headers: Mapping[str, str] | None = None,
    ) -> Fault:
        """Fail with an HTTP status (and optional Retry-After) instead of executing."""
        all_headers = dict(headers or {})
        if retry_after is not None:
            all_headers["Retry-After"] = str(retry_after)
        return cls("raise", error=FakeHTTPError(code, headers=all_headers, body=body))

    @classmethod
    def timeout(cls, *, after_effect: bool = False) -> Fault:
        """Time out; with `after_effect` the tool really executes first (lost response)."""
        return cls("raise", error=TimeoutError("tool call timed out"), after_effect=after_effect)

    @classmethod
    def malformed(cls, output: Any = "{'truncated': ") -> Fault:
        """Execute, then return `output` instead of the real result."""
        return cls("malformed", output=output, after_effect=True)

    @classmethod
    def interrupt(cls, value: Any = "approve?") -> Fault:
        """Call LangGraph's `interrupt(value)` (control flow, not a failure)."""
        return cls("interrupt", output=value)


class FaultyTool(BaseTool):
    """Wraps a tool and misbehaves on a deterministic per-call schedule.

    `faults[n]` applies to the n-th call (None = behave); after the list,
    `then` applies to every further call. `calls` counts invocations,
    `executions` counts real executions of the wrapped tool.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    inner: BaseTool
    faults: list[Fault | None]
    then: Fault | None = None
    _calls: int = PrivateAttr(default=0)
    _executions: int = PrivateAttr(default=0)
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    def __init__(
        self,
        inner: BaseTool,
        faults: Sequence[Fault | None] = (),
        *,
        then: Fault | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            name=kwargs.pop("name", inner.name),
            description=inner.description,
            args_schema=inner.args_schema,
            inner=inner,
            faults=list(faults),
            then=then,
            **kwargs,
        )

    @property
    def calls(self) -> int:
        """Invocations so far, faulty or not."""
        return self._calls

    @property
    def executions(self) -> int:
        """Times the wrapped tool really ran."""
        return self._executions

    def _next(self) -> Fault | None:
        with self._lock:
            index = self._calls
            self._calls += 1
        return self.faults[index] if index < len(self.faults) else self.then

    def _executed(self) -> None:
        with self._lock:
            self._executions += 1

    def _before(self, fault: Fault | None) -> None:
        if fault is None:
            return
        if fault.kind == "interrupt":
            interrupt(fault.output)
        if fault.kind == "raise" and not fault.after_effect and fault.error is not None:
            raise fault.error

    def _after(self, fault: Fault | None, result: Any) -> Any:
        if fault is None or not fault.after_effect:
            return result
        if fault.kind == "malformed":
            return fault.output
        if fault.error is not None:
            raise fault.error
        return result

    def _run(self, *args: Any, config: RunnableConfig, **kwargs: Any) -> Any:
        kwargs.pop("run_manager", None)
        fault = self._next()
        self._before(fault)
        result = self.inner.invoke(kwargs, config)
        self._executed()
        return self._after(fault, result)

    async def _arun(self, *args: Any, config: RunnableConfig, **kwargs: Any) -> Any:
        kwargs.pop("run_manager", None)
        fault = self._next()
        self._before(fault)
        result = await self.inner.ainvoke(kwargs, config)
        self._executed()
        return self._after(fault, result)


_ids = itertools.count(1)


def tool_calls(*calls: tuple[str, dict[str, Any]] | ToolCall, content: str = "") -> AIMessage:
    """An `AIMessage` requesting tool calls; ids are filled in when missing.

    >>> tool_calls(("search", {"q": "x"})).tool_calls[0]["name"]
    'search'
    """
    built: list[ToolCall] = []
    for call in calls:
        if isinstance(call, tuple):
            name, args = call
            built.append(ToolCall(name=name, args=args, id=None, type="tool_call"))
        else:
            built.append(call)
    return AIMessage(content=content, tool_calls=built)


def text(content: str) -> AIMessage:
    """A final `AIMessage` without tool calls."""
    return AIMessage(content=content)


Response = AIMessage | BaseException | Callable[[list[BaseMessage]], AIMessage]


class ScriptedChatModel(BaseChatModel):
    """A real `BaseChatModel` that replays a script of responses, with tool calling.

    Each call consumes the next entry: an `AIMessage` (copied; missing tool-call
    ids are filled with unique ones), an exception to raise, or a function of
    the received messages returning an `AIMessage`. Every received message
    list is kept in `received` so tests can assert what the model was shown.
    ``stream`` yields the reply word by word (tool calls in the last chunk), and
    `bind_tools` returns a `RunnableBinding`, as a provider's model does; the
    standard parameters (``model``, ``temperature``, ``max_tokens``, ``stop``, ...)
    are accepted and reported to LangSmith, never acted on.
    """

    responses: list[Any] = Field(default_factory=list)
    model: str | None = None
    """A name for LangSmith (and for `model_key`, so two unnamed scripts keep apart)."""
    temperature: float | None = None
    max_tokens: int | None = None
    timeout: float | None = None
    stop: list[str] | None = None
    max_retries: int = 0
    """Always 0: a script has nothing to retry (`resilient_model` warns above 0)."""
    _index: int = PrivateAttr(default=0)
    _received: list[list[BaseMessage]] = PrivateAttr(default_factory=list)
    _bound: list[dict[str, Any]] = PrivateAttr(default_factory=list)
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    @property
    def _llm_type(self) -> str:
        return "scripted"

    @property
    def received(self) -> list[list[BaseMessage]]:
        """The message lists this model was called with, in order."""
        return self._received

    @property
    def bound_tools(self) -> list[dict[str, Any]]:
        """The keyword arguments of every `bind_tools` call (tools, tool_choice)."""
        return self._bound

    @property
    def calls(self) -> int:
        """How many times the model was called."""
        return self._index

    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool],
        *,
        tool_choice: str | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """Record the binding; the script decides what is called."""
        names = [_tool_name(t) for t in tools]
        self._bound.append({"tools": names, "tool_choice": tool_choice, **kwargs})
        return self.bind(tools=[convert_to_openai_tool(t) for t in tools], **kwargs)
        return self

    def _next(self, messages: list[BaseMessage]) -> AIMessage:
        with self._lock:
            index = self._index
            self._index += 1
            self._received.append(list(messages))
        if index >= len(self.responses):
            raise RuntimeError(
                f"ScriptedChatModel ran out of responses after {len(self.responses)} calls; "
                "add more entries to responses="
            )
        entry = self.responses[index]
        if isinstance(entry, BaseException):
            raise entry
        message = entry(messages) if callable(entry) else entry
        calls = [
            {**call, "id": call.get("id") or f"call_{next(_ids)}"} for call in message.tool_calls
        ]
        copied: AIMessage = message.model_copy(update={"tool_calls": calls}, deep=True)
        return copied

    def _generate(self, messages: list[BaseMessage], *_: Any, **__: Any) -> ChatResult:
        """The next scripted answer (``stop`` and callbacks are ignored: the script decides)."""
        return ChatResult(generations=[ChatGeneration(message=self._next(messages))])

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        params = super()._get_ls_params(stop=stop, **kwargs)
        params["ls_model_name"] = kwargs.get("model") or self.model or "scripted"
        return params

    def _stream(
        self, messages: list[BaseMessage], *_: Any, **__: Any
    ) -> Iterator[ChatGenerationChunk]:
        """The next scripted answer, a word per chunk; its tool calls come last."""
        for chunk in _chunks(self._next(messages)):
            yield ChatGenerationChunk(message=chunk)


def _tool_name(tool: Any) -> str:
    if isinstance(tool, dict):
        function = tool.get("function") or {}
        return str(tool.get("name") or function.get("name") or tool.get("title") or tool)
    return str(getattr(tool, "name", None) or getattr(tool, "__name__", None) or tool)


def _chunks(message: AIMessage) -> list[AIMessageChunk]:
    """`message` as the chunks a provider would stream (their sum is `message`)."""
    text = message.content if isinstance(message.content, str) else ""
    words = re.findall(r"\S+\s*|\s+", text) or [""]
    calls = [
        tool_call_chunk(name=c["name"], args=json.dumps(c["args"]), id=c["id"], index=i)
        for i, c in enumerate(message.tool_calls)
    ]
    chunks = [AIMessageChunk(content=word, id=message.id) for word in words]
    chunks[-1] = AIMessageChunk(
        content=chunks[-1].content,
        id=message.id,
        tool_call_chunks=calls,
        usage_metadata=message.usage_metadata,
        response_metadata=message.response_metadata,
        chunk_position="last",
    )
    return chunks
