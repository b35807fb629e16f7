"""Streaming through a model chain: an attempt succeeds with its first chunk.

A failure before a model's first chunk is that attempt's failure (retried, or the
next model asked, by `ResilientChatModel.flow`); after it, the stream is the
model's, and a failure is raised as the model would raise it. `ResilientRunnable`
does the same for each model's own structured-output pipeline.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from typing import Any, Protocol

from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessageChunk
from langchain_core.runnables import Runnable, RunnableConfig

from langgraph_resilience.core.clock import Clock
from langgraph_resilience.core.flow import Flow, adrive, drive

__all__ = ["Ask", "ResilientRunnable", "afirst_chunk", "as_chunk", "first_chunk"]


@dataclasses.dataclass(frozen=True, slots=True)
class Ask:
    """How an attempt asks model `index` of the chain (sync, async): a chat model's
    ``invoke``, or `create_agent`'s model handler with the model swapped in."""

    sync: Callable[[int], Any]
    asynchronous: Callable[[int], Awaitable[Any]]


class Retried(Protocol):
    """What asks a model chain with retry, breakers and fallbacks: a
    `ResilientChatModel`, named by what it does so this module need not import it."""

    @property
    def clock(self) -> Clock: ...

    def flow(self, started: float, ask: Ask) -> Flow[Any]: ...


def as_chunk(message: Any) -> BaseMessageChunk:
    """A model without streaming of its own streams its whole reply as one message."""
    if isinstance(message, BaseMessageChunk):
        return message
    if not isinstance(message, AIMessage):
        raise TypeError(f"a chat model streamed {type(message).__name__}, not a message chunk")
    calls = [
        {"name": c["name"], "args": json.dumps(c["args"]), "id": c["id"], "index": i}
        for i, c in enumerate(message.tool_calls)
    ]
    return AIMessageChunk(
        content=message.content,
        additional_kwargs=message.additional_kwargs,
        response_metadata=message.response_metadata,
        id=message.id,
        tool_call_chunks=calls,
        usage_metadata=message.usage_metadata,
    )


def first_chunk(chunks: Iterator[Any]) -> tuple[Any, Iterator[Any]]:
    """The stream's first chunk (a failure before it is the attempt's) and the rest."""
    for first in chunks:
        return first, chunks
    raise RuntimeError("the model's stream ended without a chunk")


async def afirst_chunk(chunks: AsyncIterator[Any]) -> tuple[Any, AsyncIterator[Any]]:
    async for first in chunks:
        return first, chunks
    raise RuntimeError("the model's stream ended without a chunk")


class ResilientRunnable(Runnable[Any, Any]):
    """A chain of runnables (each model's structured-output pipeline) asked through a
    `ResilientChatModel`'s retry, breakers and fallbacks. The caller's config reaches
    each attempt: the attempt is the model's own run."""

    def __init__(self, *, owner: Retried, chain: Sequence[Runnable[Any, Any]]):
        self.owner, self.chain = owner, list(chain)

    def _ask(self, input: Any, config: RunnableConfig | None, stream: bool) -> Ask:
        def sync(index: int) -> Any:
            runnable = self.chain[index]
            if stream:
                return first_chunk(iter(runnable.stream(input, config)))
            return runnable.invoke(input, config)

        async def asynchronous(index: int) -> Any:
            runnable = self.chain[index]
            if stream:
                return await afirst_chunk(runnable.astream(input, config).__aiter__())
            return await runnable.ainvoke(input, config)

        return Ask(sync, asynchronous)

    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        flow = self.owner.flow(self.owner.clock.monotonic(), self._ask(input, config, False))
        return drive(flow, self.owner.clock)

    async def ainvoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        flow = self.owner.flow(self.owner.clock.monotonic(), self._ask(input, config, False))
        return await adrive(flow, self.owner.clock)

    def stream(
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> Iterator[Any]:
        flow = self.owner.flow(self.owner.clock.monotonic(), self._ask(input, config, True))
        first, rest = drive(flow, self.owner.clock)
        yield first
        yield from rest

    async def astream(
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> AsyncIterator[Any]:
        flow = self.owner.flow(self.owner.clock.monotonic(), self._ask(input, config, True))
        first, rest = await adrive(flow, self.owner.clock)
        yield first
        async for chunk in rest:
            yield chunk
