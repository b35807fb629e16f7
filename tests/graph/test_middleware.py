"""`create_agent` + `ResilienceMiddleware`: the behaviour `add_resilience` has, on
LangChain's own agent graph (each tool call its own task), sync and async."""

from __future__ import annotations

import gc
import uuid
import weakref
from typing import Annotated, Any

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import (
    AgentMiddleware,
    HumanInTheLoopMiddleware,
    SummarizationMiddleware,
    ToolCallLimitMiddleware,
)
from langchain.agents.structured_output import ToolStrategy
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import BaseTool, InjectedToolCallId, tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.types import Command
from pydantic import BaseModel

from langgraph_resilience import (
    ConfigurationError,
    FailureClass,
    ResilienceMiddleware,
    ResiliencePolicy,
    ToolError,
    ToolProfile,
)
from langgraph_resilience._graph.escalate import ESCALATION_TYPE
from langgraph_resilience.testing import (
    FakeClock,
    FakeHTTPError,
    Fault,
    FaultyTool,
    ScriptedChatModel,
    text,
    tool_calls,
)
from tests.conftest import Runner


@tool
def lookup(order_id: str) -> str:
    """Look up an order."""
    return f"order {order_id}: shipped"


@tool
def lookup_backup(order_id: str) -> str:
    """Look up an order in the replica."""
    return f"order {order_id}: shipped (replica)"


def _agent(
    agent_tools: list[BaseTool],
    responses: list[Any],
    *,
    clock: FakeClock | None = None,
    middleware: list[Any] = (),  # type: ignore[assignment]
    **options: Any,
) -> tuple[Any, ScriptedChatModel, FakeClock]:
    clock = clock or FakeClock()
    model = ScriptedChatModel(responses=responses)
    resilience = ResilienceMiddleware(clock=clock, **options)
    agent = create_agent(
        model, agent_tools, middleware=[resilience, *middleware], checkpointer=InMemorySaver()
    )
    return agent, model, clock


def _config() -> dict[str, Any]:
    return {"configurable": {"thread_id": uuid.uuid4().hex}}


def _answers(result: dict[str, Any]) -> list[ToolMessage]:
    return [m for m in result["messages"] if isinstance(m, ToolMessage)]


def _envelope(message: ToolMessage) -> ToolError:
    return ToolError.model_validate_json(str(message.content))


def _every_call_answered_before_the_model(model: ScriptedChatModel) -> None:
    """What the provider would check: no request shows an unanswered tool call."""
    for request in model.received:
        for index, message in enumerate(request):
            if isinstance(message, AIMessage) and message.tool_calls:
                after = request[index + 1 :]
                ids = [m.tool_call_id for m in after if isinstance(m, ToolMessage)]
                for call in message.tool_calls:
                    assert ids.count(call["id"]) == 1, (call, request)


def test_401_is_never_retried(runner: Runner) -> None:
    faulty = FaultyTool(lookup, [Fault.status(401)])
    agent, model, _clock = _agent(
        [faulty], [tool_calls(("lookup", {"order_id": "A1"})), text("sorry")]
    )
    result = runner.invoke(agent, {"messages": [HumanMessage("where is A1?")]}, _config())
    [answer] = _answers(result)
    assert faulty.calls == 1
    assert answer.status == "error"
    assert _envelope(answer).failure_class is FailureClass.POLICY
    _every_call_answered_before_the_model(model)


def test_429_waits_for_its_retry_after(runner: Runner) -> None:
    faulty = FaultyTool(lookup, [Fault.status(429, retry_after=7)])
    agent, model, clock = _agent(
        [faulty], [tool_calls(("lookup", {"order_id": "A1"})), text("shipped")]
    )
    started = clock.time()
    result = runner.invoke(agent, {"messages": [HumanMessage("where is A1?")]}, _config())
    [answer] = _answers(result)
    assert answer.content == "order A1: shipped"
    assert faulty.calls == 2
    assert clock.time() - started == pytest.approx(7.0)
    assert model.calls == 2  # the model never saw the failed attempt
    assert result["resilience"]["events"]["backoff"] == 1


def test_a_sibling_that_succeeded_is_not_run_again(runner: Runner) -> None:
    flaky = FaultyTool(lookup, [Fault.status(503), Fault.status(503)])
    steady = FaultyTool(lookup_backup, [])
    agent, model, _ = _agent(
        [flaky, steady],
        [
            tool_calls(("lookup", {"order_id": "A1"}), ("lookup_backup", {"order_id": "B2"})),
            text("both shipped"),
        ],
    )
    result = runner.invoke(agent, {"messages": [HumanMessage("A1 and B2?")]}, _config())
    assert flaky.calls == 3
    assert steady.executions == 1
    assert sorted(str(m.content) for m in _answers(result)) == [
        "order A1: shipped",
        "order B2: shipped (replica)",
    ]
    _every_call_answered_before_the_model(model)


def test_a_side_effect_runs_once_while_its_sibling_retries(runner: Runner) -> None:
    refunds: list[str] = []

    @tool
    def refund(order_id: str) -> str:
        """Refund an order."""
        refunds.append(order_id)
        return "refunded"

    flaky = FaultyTool(lookup, [Fault.status(503)] * 2)
    agent, _model, _ = _agent(
        [flaky, refund],
        [
            tool_calls(("lookup", {"order_id": "A1"}), ("refund", {"order_id": "A1"})),
            text("done"),
        ],
        profiles={"refund": ToolProfile(side_effect=True)},
    )
    runner.invoke(agent, {"messages": [HumanMessage("refund A1")]}, _config())
    assert refunds == ["A1"]
    assert flaky.calls == 3


def test_retries_stop_at_max_attempts_with_an_envelope(runner: Runner) -> None:
    faulty = FaultyTool(lookup, [], then=Fault.status(503))
    agent, _model, _ = _agent(
        [faulty],
        [tool_calls(("lookup", {"order_id": "A1"})), text("down")],
        policy=ResiliencePolicy(max_attempts=3),
    )
    result = runner.invoke(agent, {"messages": [HumanMessage("A1?")]}, _config())
    [answer] = _answers(result)
    assert faulty.calls == 3
    assert _envelope(answer).failure_class is FailureClass.TRANSIENT
    assert result["resilience"]["task"]["tool_attempts"] == 3


def test_the_loop_guard_stops_a_repeated_call(runner: Runner) -> None:
    same = tool_calls(("lookup", {"order_id": "A1"}))
    counted = FaultyTool(lookup, [])
    agent, model, _ = _agent(
        [counted],
        [same, same, same, same, text("stop")],
        policy=ResiliencePolicy(loop_threshold=3),
    )
    result = runner.invoke(agent, {"messages": [HumanMessage("A1?")]}, _config())
    answers = _answers(result)
    looped = [_envelope(m) for m in answers if m.status == "error"]
    assert looped, answers
    assert all("loop" in e.type.lower() for e in looped), answers
    assert counted.executions == 4 - len(looped) < 4
    _every_call_answered_before_the_model(model)


def test_a_semantic_failure_is_repaired_by_the_repair_model(runner: Runner) -> None:
    seen: list[str] = []

    @tool
    def find(order_id: str) -> str:
        """Find an order by its id (like A1)."""
        seen.append(order_id)
        if not order_id.startswith("A"):
            raise FakeHTTPError(422, body="order_id must look like A1")
        return f"found {order_id}"

    repair = ScriptedChatModel(responses=[tool_calls(("find", {"order_id": "A7"}))])
    agent, model, _ = _agent(
        [find],
        [tool_calls(("find", {"order_id": "7"})), text("found it")],
        repair_model=repair,
    )
    result = runner.invoke(agent, {"messages": [HumanMessage("order 7?")]}, _config())
    [answer] = _answers(result)
    assert seen == ["7", "A7"]
    assert answer.content == "found A7"
    assert repair.calls == 1
    assert model.calls == 2


def test_rejected_arguments_are_repaired_from_the_schemas_errors(runner: Runner) -> None:
    """create_agent's ToolNode turns rejected arguments into an error message; the
    middleware still sees them as SEMANTIC, with the schema's errors for the repair."""

    @tool
    def find(order_v2: str) -> str:
        """Find an order."""
        return f"found {order_v2}"

    repair = ScriptedChatModel(responses=[tool_calls(("find", {"order_v2": "A7"}))])
    agent, _model, _ = _agent(
        [find], [tool_calls(("find", {"order": "A7"})), text("done")], repair_model=repair
    )
    result = runner.invoke(agent, {"messages": [HumanMessage("A7?")]}, _config())
    [answer] = _answers(result)
    assert answer.content == "found A7"
    [record] = result["resilience"]["calls"].values()
    assert record["error"]["failure_class"] == "semantic"
    assert record["error"]["context"]["errors"][0]["field"] == "order_v2"
    prompt = repair.received[0][-1].text
    assert "order_v2" in prompt


def test_a_gone_tool_falls_back_to_its_fallback(runner: Runner) -> None:
    gone = FaultyTool(lookup, [], then=Fault.status(404))
    agent, _model, _ = _agent(
        [gone],
        [tool_calls(("lookup", {"order_id": "A1"})), text("ok")],
        profiles={"lookup": ToolProfile(fallback="lookup_backup")},
        tools=[lookup_backup],
    )
    result = runner.invoke(agent, {"messages": [HumanMessage("A1?")]}, _config())
    [answer] = _answers(result)
    assert answer.content == "order A1: shipped (replica)"
    assert answer.tool_call_id == result["messages"][1].tool_calls[0]["id"]


def _billing(tenant: str, charges: list[tuple[str, int]]) -> BaseTool:
    @tool
    def charge(amount: int) -> str:
        """Charge the customer's card."""
        charges.append((tenant, amount))
        return f"charged {amount} to {tenant}"

    return charge


def test_one_middleware_runs_each_agents_own_tool(runner: Runner) -> None:
    """An app keeps one ResilienceMiddleware and builds its agent per request with the
    user's own tools (or runs several agents on it): a call runs the tool of the agent
    that asked, never the first tool of that name the middleware met."""
    shared = ResilienceMiddleware(
        clock=FakeClock(), profiles={"charge": ToolProfile(side_effect=True)}
    )
    charges: list[tuple[str, int]] = []
    for tenant in ("acme", "globex"):
        model = ScriptedChatModel(responses=[tool_calls(("charge", {"amount": 5})), text("ok")])
        agent = create_agent(
            model, [_billing(tenant, charges)], middleware=[shared], checkpointer=InMemorySaver()
        )
        result = runner.invoke(agent, {"messages": [HumanMessage("charge 5")]}, _config())
        [answer] = _answers(result)
        assert answer.content == f"charged 5 to {tenant}"
    assert charges == [("acme", 5), ("globex", 5)]


def test_two_identical_calls_of_one_message_both_run(runner: Runner) -> None:
    """Two identical charges asked in one message are two effects under create_agent too
    (each call its own task): the second is not taken for a repeat of the first."""
    charges: list[tuple[str, int]] = []
    agent, _model, _ = _agent(
        [_billing("acme", charges)],
        [tool_calls(("charge", {"amount": 5}), ("charge", {"amount": 5})), text("ok")],
        profiles={"charge": ToolProfile(side_effect=True)},
    )
    result = runner.invoke(agent, {"messages": [HumanMessage("charge 5 twice")]}, _config())
    assert [m.content for m in _answers(result)] == ["charged 5 to acme"] * 2
    assert charges == [("acme", 5), ("acme", 5)]


def _replica(region: str) -> BaseTool:
    @tool("lookup_backup")
    def replica(order_id: str) -> str:
        """Look up an order in the replica."""
        return f"order {order_id}: shipped ({region} replica)"

    return replica


def test_a_fallback_is_the_asking_agents_own(runner: Runner) -> None:
    """Two agents on one middleware each have a replica named ``lookup_backup``: the
    fallback serving a gone lookup is the asking agent's replica."""
    shared = ResilienceMiddleware(
        clock=FakeClock(), profiles={"lookup": ToolProfile(fallback="lookup_backup")}
    )
    for region in ("eu", "us"):
        gone = FaultyTool(lookup, [], then=Fault.status(404))
        model = ScriptedChatModel(
            responses=[tool_calls(("lookup", {"order_id": "A1"})), text("ok")]
        )
        agent = create_agent(
            model, [gone, _replica(region)], middleware=[shared], checkpointer=InMemorySaver()
        )
        result = runner.invoke(agent, {"messages": [HumanMessage("A1?")]}, _config())
        [answer] = _answers(result)
        assert answer.content == f"order A1: shipped ({region} replica)"


def test_models_built_per_request_are_not_kept() -> None:
    """An app that builds its model per request, on one middleware, does not keep every
    model it built (each holds its client): the middleware keeps a bounded few."""
    shared = ResilienceMiddleware(clock=FakeClock())
    built: list[weakref.ref[ScriptedChatModel]] = []
    for _ in range(100):
        model = ScriptedChatModel(responses=[text("hello")])
        built.append(weakref.ref(model))
        agent = create_agent(model, [], middleware=[shared])
        agent.invoke({"messages": [HumanMessage("hi")]})
    del model, agent
    gc.collect()
    alive = sum(ref() is not None for ref in built)
    assert 0 < alive <= 64


def test_an_escalation_interrupts_and_resumes_with_command(runner: Runner) -> None:
    faulty = FaultyTool(lookup, [Fault.status(403)])
    agent, model, _ = _agent(
        [faulty],
        [tool_calls(("lookup", {"order_id": "A1"})), text("shipped")],
        escalate=True,
    )
    config = _config()
    runner.invoke(agent, {"messages": [HumanMessage("A1?")]}, config)
    [pending] = agent.get_state(config).interrupts
    assert pending.value["type"] == ESCALATION_TYPE
    assert faulty.calls == 1
    result = runner.invoke(agent, Command(resume={"action": "retry"}), config)
    [answer] = _answers(result)
    assert answer.content == "order A1: shipped"
    assert faulty.calls == 2
    _every_call_answered_before_the_model(model)


def test_an_abort_answers_the_calls_a_human_let_run_again(runner: Runner) -> None:
    """The first of two escalated calls is let run again, the second aborts the task:
    both are answered as aborted when the task ends, and neither runs again."""
    faulty = FaultyTool(lookup, [Fault.status(403), Fault.status(403)])
    agent, _, _ = _agent(
        [faulty],
        [tool_calls(("lookup", {"order_id": "A1"}), ("lookup", {"order_id": "A2"})), text("ok")],
        escalate=True,
    )
    config = _config()
    runner.invoke(agent, {"messages": [HumanMessage("A1 and A2?")]}, config)
    for action in ("retry", "abort"):
        assert len(agent.get_state(config).interrupts) == 1
        runner.invoke(agent, Command(resume={"action": action}), config)

    state = agent.get_state(config)
    assert not state.next
    decided = [_envelope(m).context["human_decision"] for m in _answers(state.values)]
    assert decided == ["abort", "abort"]
    assert faulty.calls == 2


def test_an_escalation_answered_with_edit_runs_the_edited_call(runner: Runner) -> None:
    seen: list[str] = []

    @tool
    def audit(order_id: str) -> str:
        """Audit an order."""
        seen.append(order_id)
        if order_id != "A2":
            raise FakeHTTPError(403)
        return f"audited {order_id}"

    agent, model, _ = _agent(
        [audit], [tool_calls(("audit", {"order_id": "A1"})), text("audited")], escalate=True
    )
    config = _config()
    runner.invoke(agent, {"messages": [HumanMessage("audit A1")]}, config)
    result = runner.invoke(
        agent, Command(resume={"action": "edit", "args": {"order_id": "A2"}}), config
    )
    assert seen == ["A1", "A2"]
    assert _answers(result)[0].content == "audited A2"
    _every_call_answered_before_the_model(model)


def test_an_escalation_answered_with_abort_ends_the_task(runner: Runner) -> None:
    faulty = FaultyTool(lookup, [Fault.status(403)])
    agent, model, _ = _agent(
        [faulty], [tool_calls(("lookup", {"order_id": "A1"})), text("never")], escalate=True
    )
    config = _config()
    runner.invoke(agent, {"messages": [HumanMessage("A1?")]}, config)
    result = runner.invoke(agent, Command(resume={"action": "abort", "note": "stop"}), config)
    [answer] = _answers(result)
    assert answer.status == "error"
    assert model.calls == 1  # the task ended: the model was not asked again
    assert faulty.calls == 1
    assert not agent.get_state(config).next


def test_new_input_instead_of_an_answer_closes_the_escalation(runner: Runner) -> None:
    faulty = FaultyTool(lookup, [Fault.status(403)])
    agent, model, _ = _agent(
        [faulty],
        [tool_calls(("lookup", {"order_id": "A1"})), text("ok, something else")],
        escalate=True,
    )
    config = _config()
    runner.invoke(agent, {"messages": [HumanMessage("A1?")]}, config)
    result = runner.invoke(agent, {"messages": [HumanMessage("never mind")]}, config)
    kinds = [type(m).__name__ for m in result["messages"]]
    assert kinds == ["HumanMessage", "AIMessage", "ToolMessage", "HumanMessage", "AIMessage"]
    assert _envelope(result["messages"][2]).type == "EscalationAbandoned"
    assert faulty.calls == 1
    _every_call_answered_before_the_model(model)


def test_a_transient_model_failure_is_retried_after_its_retry_after(runner: Runner) -> None:
    agent, model, clock = _agent(
        [lookup], [FakeHTTPError(429, headers={"Retry-After": "5"}), text("hello")]
    )
    started = clock.time()
    result = runner.invoke(agent, {"messages": [HumanMessage("hi")]}, _config())
    assert result["messages"][-1].content == "hello"
    assert model.calls == 2
    assert clock.time() - started == pytest.approx(5.0)


def test_a_401_from_the_model_is_raised_at_once(runner: Runner) -> None:
    agent, model, _ = _agent([lookup], [FakeHTTPError(401), text("never")])
    with pytest.raises(FakeHTTPError):
        runner.invoke(agent, {"messages": [HumanMessage("hi")]}, _config())
    assert model.calls == 1


def test_a_down_model_falls_back_to_the_next(runner: Runner) -> None:
    backup = ScriptedChatModel(responses=[text("from the backup")] * 2)
    agent, model, _ = _agent(
        [lookup],
        [FakeHTTPError(503)] * 6,
        model_fallbacks=[backup],
        policy=ResiliencePolicy(max_attempts=2),
    )
    result = runner.invoke(agent, {"messages": [HumanMessage("hi")]}, _config())
    assert result["messages"][-1].content == "from the backup"
    assert model.calls == 2


def test_it_composes_with_langchains_tool_call_limit(runner: Runner) -> None:
    faulty = FaultyTool(lookup, [Fault.status(503)])
    agent, _model, _ = _agent(
        [faulty],
        [tool_calls(("lookup", {"order_id": "A1"})), text("done")],
        middleware=[ToolCallLimitMiddleware(run_limit=5)],
    )
    result = runner.invoke(agent, {"messages": [HumanMessage("A1?")]}, _config())
    assert _answers(result)[0].content == "order A1: shipped"
    assert faulty.calls == 2


def test_it_composes_with_langchains_human_in_the_loop(runner: Runner) -> None:
    """A reviewer approves the refund (HumanInTheLoopMiddleware, before it runs); the
    approved refund then fails once with a 503 and is retried, and runs once."""
    refunds: list[str] = []

    @tool
    def refund(order_id: str) -> str:
        """Refund an order."""
        refunds.append(order_id)
        return "refunded"

    flaky = FaultyTool(refund, [Fault.raises(ConnectionRefusedError("refused"))])
    agent, model, _ = _agent(
        [flaky],
        [tool_calls(("refund", {"order_id": "A1"})), text("refunded")],
        middleware=[HumanInTheLoopMiddleware(interrupt_on={"refund": True})],
        profiles={"refund": ToolProfile(side_effect=True)},
    )
    config = _config()
    runner.invoke(agent, {"messages": [HumanMessage("refund A1")]}, config)
    assert agent.get_state(config).interrupts  # the reviewer is asked first
    result = runner.invoke(agent, Command(resume={"decisions": [{"type": "approve"}]}), config)
    assert refunds == ["A1"]
    assert flaky.calls == 2
    assert _answers(result)[0].content == "refunded"
    _every_call_answered_before_the_model(model)


def test_it_composes_with_langchains_summarization(runner: Runner) -> None:
    """Summarization rewrites the history between turns; budgets and slots still hold."""
    flaky = FaultyTool(lookup, [Fault.status(503), None, Fault.status(503)])
    summarizer = ScriptedChatModel(responses=[text("Earlier: order A1 was looked up.")] * 4)
    agent, model, _ = _agent(
        [flaky],
        [
            tool_calls(("lookup", {"order_id": "A1"})),
            text("A1 shipped"),
            tool_calls(("lookup", {"order_id": "A2"})),
            text("A2 shipped"),
        ],
        middleware=[
            SummarizationMiddleware(summarizer, trigger=("messages", 4), keep=("messages", 2))
        ],
    )
    config = _config()
    runner.invoke(agent, {"messages": [HumanMessage("A1?")]}, config)
    result = runner.invoke(agent, {"messages": [HumanMessage("and A2?")]}, config)
    assert result["messages"][-1].content == "A2 shipped"
    assert summarizer.calls >= 1  # the history was summarized in between
    assert flaky.calls == 4
    _every_call_answered_before_the_model(model)


def test_a_reused_provider_id_in_a_later_turn_is_a_new_call(runner: Runner) -> None:
    refunds: list[str] = []

    @tool
    def refund(order_id: str) -> str:
        """Refund an order."""
        refunds.append(order_id)
        return "refunded"

    def reused(order: str) -> AIMessage:
        return AIMessage(
            content="",
            tool_calls=[{"name": "refund", "args": {"order_id": order}, "id": "call_0"}],
        )

    agent, _model, _ = _agent(
        [refund],
        [reused("A1"), text("done"), reused("A1"), text("done again")],
        profiles={"refund": ToolProfile(side_effect=True)},
    )
    config = _config()
    runner.invoke(agent, {"messages": [HumanMessage("refund A1")]}, config)
    runner.invoke(agent, {"messages": [HumanMessage("and refund A1 once more")]}, config)
    assert refunds == ["A1", "A1"]


class _ToolSelector(AgentMiddleware):  # type: ignore[type-arg]
    """Offers the model only the tools the conversation names, as a tool selector (e.g.
    LangChain's ``LLMToolSelectorMiddleware``) does."""

    def wrap_model_call(self, request: Any, handler: Any) -> Any:
        words = " ".join(str(m.content) for m in request.messages).lower()
        return handler(request.override(tools=[t for t in request.tools if t.name in words]))


def _selected_agent(first: bool, refunds: list[str], *, profiled: bool = True) -> Any:
    @tool
    def refund(order_id: str) -> str:
        """Refund an order."""
        refunds.append(order_id)
        return f"refunded {order_id}"

    model = ScriptedChatModel(
        responses=[
            tool_calls(("lookup", {"order_id": "A1"})),
            text("shipped"),
            tool_calls(("refund", {"order_id": "A1"})),
            text("refunded"),
        ]
    )
    profiles = {"refund": ToolProfile(side_effect=True)} if profiled else {}
    ours = ResilienceMiddleware(clock=FakeClock(), profiles=profiles)
    order = [ours, _ToolSelector()] if first else [_ToolSelector(), ours]
    return create_agent(model, [lookup, refund], middleware=order, checkpointer=InMemorySaver())


def test_behind_a_tool_selector_an_unoffered_profile_names_the_fix() -> None:
    """Behind a selector, the middleware meets only the tools it offers: a profile for
    another one reads as misspelled. The error says what else it may be and the fix."""
    agent = _selected_agent(first=False, refunds=[])
    with pytest.raises(ConfigurationError, match=r"put ResilienceMiddleware first"):
        agent.invoke({"messages": [HumanMessage("lookup A1")]}, _config())


def test_before_a_tool_selector_every_tool_is_known_and_learnt() -> None:
    """First, the middleware sees every tool: the profile checks, and a tool the model is
    offered only in a later turn runs through the side-effect path."""
    refunds: list[str] = []
    agent, config = _selected_agent(first=True, refunds=refunds), _config()
    first = agent.invoke({"messages": [HumanMessage("lookup A1")]}, config)
    second = agent.invoke({"messages": [HumanMessage("now refund A1")]}, config)
    assert [m.status for m in _answers(first)] == ["success"]
    assert [m.status for m in _answers(second)] == ["success", "success"]
    assert refunds == ["A1"]


def test_behind_a_tool_selector_a_tool_offered_later_is_learnt() -> None:
    """Behind a selector, with no profile to check, a tool first offered in a later turn
    runs when the model calls it, once."""
    refunds: list[str] = []
    agent, config = _selected_agent(first=False, refunds=refunds, profiled=False), _config()
    agent.invoke({"messages": [HumanMessage("lookup A1")]}, config)
    second = agent.invoke({"messages": [HumanMessage("now refund A1")]}, config)
    assert [m.status for m in _answers(second)] == ["success", "success"]
    assert refunds == ["A1"]


def test_a_profile_for_an_unknown_tool_fails_loudly_before_any_tool_runs() -> None:
    """A misspelled side-effect profile would leave the real tool unguarded."""
    faulty = FaultyTool(lookup, [])
    agent, _model, _ = _agent(
        [faulty],
        [tool_calls(("lookup", {"order_id": "A1"})), text("ok")],
        profiles={"lookpu": ToolProfile(side_effect=True)},
    )
    with pytest.raises(ConfigurationError, match=r"profiles name unknown tools \['lookpu'\]"):
        agent.invoke({"messages": [HumanMessage("A1?")]}, _config())
    assert faulty.calls == 0


def test_a_humans_retry_runs_the_call_past_a_spent_task_budget(runner: Runner) -> None:
    """Under create_agent too, a human's "retry" buys one more execution when the task's
    tool budget is already spent, rather than asking the human again without running."""
    faulty = FaultyTool(lookup, [Fault.status(403), Fault.status(403)])
    agent, model, _ = _agent(
        [faulty],
        [tool_calls(("lookup", {"order_id": "A1"})), text("shipped")],
        policy=ResiliencePolicy(max_attempts=1, max_tool_attempts=1),
        escalate=True,
    )
    config = _config()
    runner.invoke(agent, {"messages": [HumanMessage("A1?")]}, config)
    for ran in (2, 3):
        assert len(agent.get_state(config).interrupts) == 1
        runner.invoke(agent, Command(resume={"action": "retry"}), config)
        assert faulty.calls == ran
    result = runner.invoke(agent, Command(resume={"action": "skip"}), config)
    assert result["messages"][-1].content == "shipped"
    _every_call_answered_before_the_model(model)


@pytest.mark.parametrize(
    ("faults", "options", "answer", "slept"),
    [
        # a Retry-After too long for the step in general: slept in it all the same
        ([Fault.status(429, retry_after="5")], {}, "order A1: shipped", [5.0]),
        # gone: its fallback serves the call in the step
        (
            [Fault.status(404)],
            {"profiles": {"lookup": ToolProfile(fallback="lookup_backup")}},
            "order A1: shipped (replica)",
            [],
        ),
        # a refusal that would ask a human: answered with its envelope instead
        ([Fault.status(403)], {"escalate": True}, '"failure_class":"policy"', []),
    ],
)
def test_a_call_that_returns_directly_is_answered_in_its_step(
    runner: Runner, faults: list[Fault], options: dict[str, Any], answer: str, slept: list[float]
) -> None:
    """create_agent ends the run after a turn whose calls all return directly, so
    ``before_model`` never comes back for a call left waiting: its retry, whatever the
    wait, and its fallback run in the step, and what needs a later step (a human, a
    repair) is answered with the envelope. The run ends on the call's answer."""
    direct = FaultyTool(lookup, faults, return_direct=True)
    backup = FaultyTool(lookup_backup, [], return_direct=True)
    agent, model, clock = _agent(
        [direct, backup], [tool_calls(("lookup", {"order_id": "A1"})), text("never")], **options
    )
    config = _config()

    result = runner.invoke(agent, {"messages": [HumanMessage("where is A1?")]}, config)

    assert not agent.get_state(config).next
    [reply] = _answers(result)
    assert result["messages"][-1] == reply
    assert answer in str(reply.content)
    assert len(model.received) == 1
    assert clock.sleeps == slept


class _Forecast(BaseModel):
    city: str
    temp: int


def test_a_call_beside_a_structured_response_is_answered_in_its_step(runner: Runner) -> None:
    """The model answers with the structured response and a tool call in one message:
    create_agent ends the run after that tool, so its retry (a 429's 5 s) runs in the
    step, and the thread never keeps the call unanswered."""
    weather = FaultyTool(lookup, [Fault.status(429, retry_after="5")], name="weather")
    forecast = ("_Forecast", {"city": "Oslo", "temp": 21})
    model = ScriptedChatModel(responses=[tool_calls(("weather", {"order_id": "Oslo"}), forecast)])
    clock = FakeClock()
    agent = create_agent(
        model,
        [weather],
        response_format=ToolStrategy(_Forecast),
        middleware=[ResilienceMiddleware(clock=clock)],
        checkpointer=InMemorySaver(),
    )

    result = runner.invoke(agent, {"messages": [HumanMessage("weather in Oslo?")]}, _config())

    assert result["structured_response"] == _Forecast(city="Oslo", temp=21)
    assert [m.content for m in _answers(result)][1:] == ["order Oslo: shipped"]
    assert clock.sleeps == [5.0]


@tool
def transfer_to_writer(tool_call_id: Annotated[str, InjectedToolCallId]) -> Command[Any]:
    """Hand the conversation to the writer."""
    done = ToolMessage("Transferred to writer", tool_call_id=tool_call_id)
    return Command(goto="writer", graph=Command.PARENT, update={"messages": [done]})


def test_a_handoff_to_another_agent_reaches_the_parent_graph(runner: Runner) -> None:
    """A multi-agent graph (langgraph-swarm's and -supervisor's handoff tools): the
    tool's `Command` to the parent graph goes there, and the writer takes over. It was
    turned into a `Command` inside the researcher's graph, whose handoff went nowhere."""
    researcher, model, _ = _agent([transfer_to_writer], [tool_calls(("transfer_to_writer", {}))])
    writer = create_agent(ScriptedChatModel(responses=[text("writer here")]), [])
    parent = StateGraph(MessagesState)
    parent.add_node("researcher", researcher, destinations=("writer",))
    parent.add_node("writer", writer)
    parent.add_edge(START, "researcher")
    parent.add_edge("writer", END)
    app = parent.compile(checkpointer=InMemorySaver())

    out = runner.invoke(app, {"messages": [HumanMessage("write me a poem")]}, _config())

    assert [m.content for m in out["messages"][1:]] == ["Transferred to writer", "writer here"]
    assert len(model.received) == 1
