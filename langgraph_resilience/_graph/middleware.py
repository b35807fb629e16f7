"""`create_agent` users: the recovery of `add_resilience`, as one `AgentMiddleware`.

::

    agent = create_agent(
        model, tools,
        middleware=[ResilienceMiddleware(profiles={"refund": ToolProfile(side_effect=True)})],
        checkpointer=saver,
    )

It maps `add_resilience`'s graph onto the one `create_agent` builds, running the
same code (nothing here decides anything itself):

- ``wrap_tool_call``: `create_agent` runs each tool call as its own task, so each
  is one tools step of its own (`agent_call.call_step`): the same planning (loop guard,
  budgets, gone tools), interception (breakers, bulkheads, timeouts, coercion,
  exactly-once side effects, the output contract, one classification) and finishing
  (`finish.finish_step`) as `GuardedToolNode`, for that call. A short backoff
  is slept and retried right there, in the call's own task (`_graph.inline_retry`), so
  the turn needs no extra ``before_model`` round; a call that recovers later (a long
  backoff, a repair, a human) is left unanswered, its record in the tally says what
  it waits for.
- ``before_model``: the model is never called while a call of the turn waits.
  The hook runs the recovery nodes of `add_resilience` (`RetryNode`, `RepairNode`,
  `EscalateNode`) in the order of its router (`next_step`), then jumps back to the
  tools node for the calls now due; a call already answered is not run again.
  On new input (the model is about to answer a human message), it first answers
  any call a stopped run left unanswered (`AnswerPendingNode`), so the model's
  request is a valid history. (One hook, not a ``before_agent`` too: every hook is a
  graph step of its own, checkpointed, on every turn.)
- ``wrap_model_call``: the model chain of `resilient_model` (`ResilientChatModel.flow`)
  over `create_agent`'s handler: classified retry honouring Retry-After, a breaker
  per model and the ``model_fallbacks`` in order.
- ``state_schema``: the ``resilience`` channel (the tally), so budgets, attempts and
  breaker-independent memory live in the checkpoint and a thread resumes by id.

Escalation answers are this package's (``{"action": "retry" | "edit" | "skip" |
"abort"}``, see `_graph.escalate`), the same for both entry points. Verified
replanning is not here: `create_agent`'s model already plans its next step from the
envelope a failed call is answered with, and a second planner inside its loop would
fight it; use `add_resilience(planner_model=...)` for plans checked before they run.

Put it first among middleware that wrap tool calls (the outermost wrapper): a call
it answers without running is then never seen by the others.
"""

from __future__ import annotations

import contextlib
import random
import threading
import warnings
import weakref
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from typing import Any, NotRequired, cast

from langchain.agents.middleware import AgentMiddleware, AgentState, ModelRequest, ModelResponse
from langchain.agents.middleware.types import hook_config
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import BaseTool
from langgraph.config import get_config
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.runtime import Runtime
from langgraph.types import Command

from langgraph_resilience._graph.agent_call import acall_step, call_step
from langgraph_resilience._graph.model import ResilientChatModel, resilient_model
from langgraph_resilience._graph.model_streaming import Ask
from langgraph_resilience._graph.node import ResilienceNode
from langgraph_resilience._graph.pending import AnswerPendingNode, route_entry
from langgraph_resilience._graph.retry import RetryNode
from langgraph_resilience._graph.router import next_step
from langgraph_resilience._graph.run_lease import counted_step
from langgraph_resilience._graph.state import ResilienceTally, apply_update
from langgraph_resilience._graph.tools import DEFAULT_BREAKER, GuardedToolNode
from langgraph_resilience._graph.wiring import check_profiles, recovery_nodes
from langgraph_resilience.core.breaker import BreakerConfig, BreakerStore
from langgraph_resilience.core.budget import RetryBudget
from langgraph_resilience.core.classification import Rule
from langgraph_resilience.core.clock import Clock
from langgraph_resilience.core.decision import DEFAULT_FALLBACK_ON
from langgraph_resilience.core.effects import IdempotencyStore, SagaLog
from langgraph_resilience.core.flow import Call, Flow, adrive, drive
from langgraph_resilience.core.policy import ResiliencePolicy
from langgraph_resilience.core.profile import ToolProfile
from langgraph_resilience.errors import ConfigurationError, FailureClass, ResilienceWarning
from langgraph_resilience.stores.breakers import InMemoryBreakerStore
from langgraph_resilience.stores.budgets import InMemoryRetryBudgetStore, PostgresRetryBudgetStore

__all__ = ["ResilienceAgentState", "ResilienceMiddleware"]

_RECOVERY_ROUNDS = 16
"""Recovery nodes one ``before_model`` pass may run before it must jump or answer
(each round answers or schedules at least one call; a turn has few)."""


_SELECTOR_HINT = (
    ". Check the spelling; if a middleware before ResilienceMiddleware offers the model only"
    " some of the agent's tools (a tool selector), put ResilienceMiddleware first in"
    " middleware=[...], so that it sees them all; if one ResilienceMiddleware serves"
    " several agents, give each agent its own, with the profiles of its own tools"
)
"""The other causes of an unknown tool under `create_agent`: the middleware meets the
agent's tools only in the model requests it sees, after the middleware outside it, and
checks each agent it serves against the profiles it was given."""


class ResilienceAgentState(AgentState[Any]):
    """`create_agent`'s state with the ``resilience`` channel (the tally)."""

    resilience: NotRequired[ResilienceTally]


class ResilienceMiddleware(AgentMiddleware[ResilienceAgentState, Any, Any]):
    """Classification-driven recovery for `create_agent`, from the same core as
    `add_resilience` (see the module docstring for how each hook maps).

    Its arguments are `add_resilience`'s (same meaning, same defaults), plus
    ``model_fallbacks`` (chat models tried in order when the agent's model is down)
    and ``tools`` (tools only this middleware calls, e.g. a profile's fallbacks: they
    are registered with the agent, as any middleware's tools are).
    """

    state_schema = ResilienceAgentState

    def __init__(
        self,
        *,
        policy: ResiliencePolicy | None = None,
        profiles: Mapping[str, ToolProfile] | None = None,
        clock: Clock | None = None,
        rng: random.Random | None = None,
        rules: Sequence[Rule] = (),
        repair_model: BaseChatModel | None = None,
        escalate: bool = False,
        breaker: BreakerConfig | None = DEFAULT_BREAKER,
        breaker_store: BreakerStore | None = None,
        retry_budget: RetryBudget | None = None,
        retry_budget_store: InMemoryRetryBudgetStore | PostgresRetryBudgetStore | None = None,
        idempotency: IdempotencyStore | None = None,
        saga: SagaLog | None = None,
        model_fallbacks: Sequence[BaseChatModel] = (),
        model_breaker: BreakerConfig | None = DEFAULT_BREAKER,
        model_fallback_on: Sequence[FailureClass] = tuple(DEFAULT_FALLBACK_ON),
        tools: Sequence[BaseTool] = (),
    ) -> None:
        super().__init__()
        if repair_model is not None and not isinstance(repair_model, BaseChatModel):
            raise ConfigurationError(
                f"repair_model must be a tool-calling BaseChatModel, got {type(repair_model)!r}"
            )
        self.tools = list(tools)
        store = breaker_store if breaker_store is not None else InMemoryBreakerStore()
        self.engine = GuardedToolNode(
            self.tools,
            policy=policy,
            clock=clock,
            profiles=profiles,
            rules=rules,
            rng=rng,
            can_repair=repair_model is not None,
            can_escalate=escalate,
            breaker=breaker,
            breaker_store=store,
            retry_budget=retry_budget,
            retry_budget_store=retry_budget_store,
            idempotency=idempotency,
            saga=saga,
        )
        """The tools step every call runs (its tools grow as requests name them)."""
        self.repair_model = repair_model
        self.escalate = escalate
        self._model = _ModelChains(
            fallbacks=list(model_fallbacks),
            policy=self.engine.policy,
            breaker=model_breaker if model_fallbacks else None,
            store=store,
            clock=self.engine.clock,
            rng=self.engine.settings.rng,
            fallback_on=model_fallback_on,
        )
        self._pending = AnswerPendingNode(tools=self.engine)
        self._checked: frozenset[str] = frozenset()
        self._given_up: weakref.WeakValueDictionary[int, ModelRequest[Any]] = (
            weakref.WeakValueDictionary()
        )
        self._told_outer = False

    @property
    def name(self) -> str:
        return "ResilienceMiddleware"

    # ------------------------------------------------------------ tool calls

    def wrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], ToolMessage | Command[Any]],
    ) -> ToolMessage | Command[Any]:
        """One call as one tools step (`agent_call.call_step`)."""
        return call_step(self.engine, request, handler)

    async def awrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], Awaitable[ToolMessage | Command[Any]]],
    ) -> ToolMessage | Command[Any]:
        """Async `wrap_tool_call`."""
        return await acall_step(self.engine, request, handler)

    # ------------------------------------------------------------ the turn

    @hook_config(can_jump_to=["tools", "end"])
    def before_model(
        self, state: ResilienceAgentState, runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        """Recover the turn's waiting calls before the model is asked again; on new
        input, answer the calls a stopped run left."""
        config = get_config()
        # a pause for a human ends the run too
        with counted_step(config, leases=self.engine.has_side_effects):
            return drive(self._recover(state, config), self.engine.clock)

    @hook_config(can_jump_to=["tools", "end"])
    async def abefore_model(
        self, state: ResilienceAgentState, runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        """Async `before_model` (the nodes' async bodies)."""
        config = get_config()
        with counted_step(config, leases=self.engine.has_side_effects):
            return await adrive(self._recover(state, config), self.engine.clock)

    def _recover(self, state: ResilienceAgentState, config: Any) -> Flow[dict[str, Any] | None]:
        """The hook as one `core.flow` flow: each recovery node the router picks runs
        (``run`` or ``arun``) on the state as the previous one left it, until the model
        may go on or the tools must run again."""
        if _new_input(state):  # a new run: its lease of the thread first (side effects)
            engine = self.engine
            yield Call(engine.enter_run, engine.aenter_run, (config,))
            if route_entry(state) == "go":
                return None  # the last turn ended in a final answer: nothing to finish
            pending = self._pending
            return (yield Call(pending.run, pending.arun, (state, config))) or None
        view: dict[str, Any] = dict(state)
        for _ in range(_RECOVERY_ROUNDS):
            node = self._next_node(view)
            if not isinstance(node, ResilienceNode):
                return _update(state, view, node)
            view = apply_update(view, (yield Call(node.run, node.arun, (view, config))))
            if isinstance(node, RetryNode):  # as add_resilience's edge: retry -> tools
                return _update(state, view, "tools")
        return _update(state, view, "tools")

    def _next_node(self, view: Mapping[str, Any]) -> ResilienceNode | str | None:
        """The recovery node the router picks, or where to go: ``tools`` (calls are
        due), ``end`` (the task was aborted), None (every call answered: the model)."""
        to = next_step(view)
        if to == "agent":
            return None
        if to == "__end__":
            return "end"
        if to == "tools":
            return "tools"
        nodes = recovery_nodes(
            self.engine,
            repair_model=self.repair_model,
            planner_model=None,
            escalate=self.escalate,
        )
        node = nodes.get(to)
        if node is None:  # pragma: no cover - the tools step only routes to enabled paths
            raise ConfigurationError(f"a call waits for {to!r}, which this middleware lacks")
        return node

    # ------------------------------------------------------------ model calls

    def wrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], ModelResponse[Any]],
    ) -> ModelResponse[Any]:
        """The model chain: classified retry, a breaker per model, fallbacks."""
        self._learn(request)
        chain = self._model.chain(request.model)

        def sync(index: int) -> Any:
            return handler(request.override(model=chain.models[index]))

        ask = Ask(sync, _no_async)
        with self._giving_up(request), self._run_ends_on_failure():
            response = drive(chain.flow(chain.clock.monotonic(), ask), chain.clock)
        if self.engine.has_side_effects and _ends_run(response):
            self.engine.leave_run(get_config())
        return cast("ModelResponse[Any]", response)

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelResponse[Any]:
        """Async `wrap_model_call`."""
        self._learn(request)
        chain = self._model.chain(request.model)

        async def asynchronous(index: int) -> Any:
            return await handler(request.override(model=chain.models[index]))

        ask = Ask(_no_sync, asynchronous)
        flow = chain.flow(chain.clock.monotonic(), ask)
        with self._giving_up(request), self._run_ends_on_failure():
            response = await adrive(flow, chain.clock)
        if self.engine.has_side_effects and _ends_run(response):
            await self.engine.aleave_run(get_config())
        return cast("ModelResponse[Any]", response)

    @contextlib.contextmanager
    def _run_ends_on_failure(self) -> Iterator[None]:
        """A model call that raises ends the run (the model step is alone in its turn):
        its lease of the thread goes back at once, not when this process collects the
        run, so the user's retry may go to any worker. Given back without waiting (an
        async lease's release is scheduled on its loop); a middleware around ours that
        asks the model again goes on without it, and its next tools step takes it."""
        try:
            yield
        except BaseException:
            if self.engine.has_side_effects:
                self.engine.leave_run(get_config())
            raise

    @contextlib.contextmanager
    def _giving_up(self, request: ModelRequest[Any]) -> Iterator[None]:
        """Remember a request the model chain gave up on: asked again with that very
        request, a retrying middleware listed before this one (the outermost, in
        `create_agent`) is calling it around our retries, and that is warned of once.
        Told by behaviour, not by the list, which a middleware is never shown."""
        if self._given_up.get(id(request)) is request and not self._told_outer:
            self._told_outer = True
            warnings.warn(
                "a middleware listed before ResilienceMiddleware in create_agent(middleware="
                "[...]), such as ModelRetryMiddleware, asked the model again after "
                "ResilienceMiddleware had given up: its retries run around ours, outside "
                "the attempt budgets and breakers (attempts multiply); list "
                "ResilienceMiddleware first, or drop it: ResilienceMiddleware retries already",
                ResilienceWarning,
                stacklevel=4,
            )
        try:
            yield
        except Exception:
            if not self._told_outer:
                self._given_up[id(request)] = request
            raise

    def _learn(self, request: ModelRequest[Any]) -> None:
        """Meet the agent's tools (the model request names them all) and check the
        profiles against them once: a profile for a misspelled tool would leave a side
        effect unguarded, so it fails here, loudly, before any tool runs."""
        tools = [t for t in request.tools if isinstance(t, BaseTool)]
        self.engine.learn(tools)
        known = frozenset(self.engine.tools_by_name)
        if known != self._checked:
            check_profiles(self.engine.profiles, set(known), unknown_hint=_SELECTOR_HINT)
            self._checked = known


def _ends_run(response: Any) -> bool:
    """Whether `create_agent` ends the run on this model answer: it calls no tool, or it
    is a structured response (whose tool `create_agent` answers in the model's step).
    The run's lease of its thread goes back then, as `add_resilience`'s router gives it
    back at END: left to the collector, the next turn sent to another worker was
    refused (`ThreadBusyError`) until this process happened to collect the run, or the
    lease lapsed. A run that goes on all the same takes it again at its next step."""
    inner = getattr(response, "model_response", response)  # an ExtendedModelResponse's
    if isinstance(inner, AIMessage):
        return not inner.tool_calls
    if getattr(inner, "structured_response", None) is not None:
        return True
    messages = getattr(inner, "result", None) or []
    answer = next((m for m in reversed(messages) if isinstance(m, AIMessage)), None)
    return answer is not None and not answer.tool_calls


_KEPT_CHAINS = 64
"""How many agent models keep their chain: an app that builds its model per request
would otherwise keep every model it ever built. A model's breaker lives in the store
under `model_key`, so a chain made again finds its state."""


class _ModelChains:
    """One `ResilientChatModel` chain per agent model met lately (the first made is the
    first dropped, past `_KEPT_CHAINS`)."""

    def __init__(
        self,
        *,
        fallbacks: list[BaseChatModel],
        policy: ResiliencePolicy,
        breaker: BreakerConfig | None,
        store: BreakerStore,
        clock: Clock,
        rng: random.Random,
        fallback_on: Sequence[FailureClass],
    ) -> None:
        self.fallbacks = fallbacks
        self.settings: dict[str, Any] = {
            "policy": policy,
            "breaker": breaker,
            "store": store,
            "clock": clock,
            "rng": rng,
            "fallback_on": fallback_on,
        }
        self._chains: dict[int, tuple[Any, ResilientChatModel]] = {}
        self._lock = threading.Lock()

    def chain(self, model: Any) -> ResilientChatModel:
        found = self._chains.get(id(model))
        if found is not None and found[0] is model:
            return found[1]
        if not isinstance(model, BaseChatModel):
            raise ConfigurationError(
                f"ResilienceMiddleware needs a BaseChatModel as the agent's model, got "
                f"{type(model).__name__}; pass create_agent a chat model instance"
            )
        made = resilient_model(model, self.fallbacks, **self.settings)
        with self._lock:
            self._chains[id(model)] = (model, made)
            while len(self._chains) > _KEPT_CHAINS:
                del self._chains[next(iter(self._chains))]
        return made


def _no_sync(index: int) -> Any:  # pragma: no cover - drive never calls the async side
    raise RuntimeError("the sync model handler is not available in awrap_model_call")


async def _no_async(index: int) -> Any:  # pragma: no cover - adrive only
    raise RuntimeError("the async model handler is not available in wrap_model_call")


def _new_input(state: Mapping[str, Any]) -> bool:
    """The model is about to answer a human message (a new invoke), not the tools: any
    call still unanswered was left by a run that stopped (`AnswerPendingNode`)."""
    messages = state.get("messages") or []
    return bool(messages) and isinstance(messages[-1], HumanMessage)


def _update(
    state: Mapping[str, Any], view: Mapping[str, Any], to: str | None
) -> dict[str, Any] | None:
    """The hook's one update: the tally whole (it replaces the older one), the
    messages the recovery nodes added, and where to go next."""
    update: dict[str, Any] = {}
    if view is not state and view.get("resilience") is not state.get("resilience"):
        update["resilience"] = view.get("resilience")
        before = {m.id for m in state.get("messages") or []}
        added = [m for m in view.get("messages") or [] if m.id not in before]
        if added:
            update["messages"] = added
    if to is not None:
        update["jump_to"] = to
    return update or None
