"""The base of the prebuilt nodes: a `Runnable` with real sync and async bodies.

Every node of the package (`GuardedToolNode`, `RetryNode`, `RepairNode`,
`PlannerNode`, `PlanExecutorNode`, `EscalateNode`, `AnswerPendingNode`) is one, so
a user adds any of them to their own graph by hand, as LangGraph's `ToolNode`::

    builder.add_node("tools", GuardedToolNode(tools))

`RunnableLambda` would open a traced child run and inspect the function's signature
on every call (half of the per-turn overhead we measured); LangGraph already traces
the node itself, like its own `ToolNode`.
"""

from __future__ import annotations

import abc
from typing import Any

from langchain_core.runnables import Runnable, RunnableConfig, ensure_config

from langgraph_resilience._graph.run_lease import counted_step

__all__ = ["ResilienceNode"]


class ResilienceNode(Runnable[Any, Any]):
    """A graph node: `run` and `arun` take the state and the run's config. Whatever a
    node raises (an error, a cancel, a pause for a human) ends its run, so the run's
    lease of its thread is given back (`_graph.run_lease`)."""

    leases_thread = True
    """Whether a run through this node may hold its thread's lease (a tool of the graph
    has side effects): only then are its steps counted (`RunLeases.step`), so that the
    lease goes back with the run's last step. A graph without side effects pays nothing."""

    @abc.abstractmethod
    def run(self, state: Any, config: RunnableConfig) -> Any:
        """The sync body."""

    @abc.abstractmethod
    async def arun(self, state: Any, config: RunnableConfig) -> Any:
        """The async body."""

    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        config = ensure_config(config)
        with counted_step(config, leases=self.leases_thread):
            return self.run(input, config)

    async def ainvoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        config = ensure_config(config)
        with counted_step(config, leases=self.leases_thread):
            return await self.arun(input, config)
