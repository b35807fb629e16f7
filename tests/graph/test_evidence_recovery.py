"""Safe *and* resilient: a side effect's failure is decided by the evidence of execution,
an informed re-issue runs (under the earlier key), a blind one does not, and a profile
can say why a repeat is safe; both entry points, sync and async."""

from __future__ import annotations

import dataclasses
import json
import re
import uuid
from typing import Any

import httpx
import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, ToolCall, ToolMessage
from langchain_core.tools import BaseTool, StructuredTool, tool
from langgraph.checkpoint.memory import InMemorySaver

from langgraph_resilience import (
    ResilienceMiddleware,
    ToolProfile,
    current_idempotency_key,
    status_from,
    tool_error_of,
)
from langgraph_resilience.testing import FakeClock, FakeHTTPError, ScriptedChatModel, text
from tests.conftest import Runner, build_graph

_REQUEST = httpx.Request("POST", "https://shop.example/v1/orders/cancel")


@dataclasses.dataclass
class Shop:
    """An order service that deduplicates nothing unless asked to: `faults` says what
    each attempt of ``cancel_order`` meets (``refused``: a 503, nothing done;
    ``before``: the read times out and the service never saw it; ``after``: cancelled
    (or, deduplicating, answered from its record), then the answer is lost)."""

    faults: list[str | None] = dataclasses.field(default_factory=list)
    dedupes: bool = False
    keys: list[str | None] = dataclasses.field(default_factory=list)
    cancelled: list[int] = dataclasses.field(default_factory=list)
    done_keys: dict[str, str] = dataclasses.field(default_factory=dict)

    def cancel(self, order_id: int) -> str:
        key = current_idempotency_key()
        self.keys.append(key)
        fault = self.faults.pop(0) if self.faults else None
        if fault == "refused":
            raise FakeHTTPError(503)
        if fault == "before":
            raise httpx.ReadTimeout("timed out", request=_REQUEST)
        if not (self.dedupes and key in self.done_keys):
            self.cancelled.append(order_id)
            if key is not None:
                self.done_keys[key] = "cancelled"
        if fault == "after":
            raise httpx.ReadTimeout("timed out", request=_REQUEST)
        return "cancelled"

    def order(self, order_id: int) -> dict[str, Any]:
        status = "cancelled" if order_id in self.cancelled else "pending"
        return {"order_id": order_id, "status": status}

    def tools(self) -> list[BaseTool]:
        @tool
        def cancel_order(order_id: int) -> str:
            """Cancel an order."""
            return self.cancel(order_id)

        @tool
        def get_order(order_id: int) -> str:
            """Read an order."""
            return json.dumps(self.order(order_id))

        @tool
        def get_refund(order_id: int) -> str:
            """The refund of a cancelled order."""
            if order_id not in self.cancelled:
                raise ValueError(f"no refund for order {order_id}: it is not cancelled")
            return json.dumps({"order_id": order_id, "refund": "issued"})

        @tool
        def list_products() -> str:
            """The catalogue."""
            return "[]"

        return [cancel_order, get_order, get_refund, list_products]


def _call(name: str, **args: Any) -> AIMessage:
    call = ToolCall(name=name, args=args, id=f"call_{uuid.uuid4().hex[:8]}", type="tool_call")
    return AIMessage("", tool_calls=[call])


CANCEL = {"cancel_order": ToolProfile(side_effect=True)}


def _run(
    entry: str, runner: Runner, shop: Shop, script: list[Any], profiles: dict[str, ToolProfile]
) -> list[ToolMessage]:
    """Run the script through `add_resilience` or `create_agent` + the middleware."""
    config = {"configurable": {"thread_id": uuid.uuid4().hex}}
    if entry == "graph":
        h = build_graph(shop.tools(), script, profiles=profiles)
        out = runner.invoke(h.app, {"messages": [("user", "cancel order 1")]}, config)
    else:
        model = ScriptedChatModel(responses=script)
        middleware = ResilienceMiddleware(profiles=profiles, clock=FakeClock())
        agent = create_agent(
            model, shop.tools(), middleware=[middleware], checkpointer=InMemorySaver()
        )
        out = runner.invoke(agent, {"messages": [("user", "cancel order 1")]}, config)
    return [m for m in out["messages"] if isinstance(m, ToolMessage)]


@pytest.fixture(params=["graph", "middleware"])
def entry(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_an_informed_re_issue_runs_under_the_earlier_key(entry: str, runner: Runner) -> None:
    """Read, write (its answer lost, the service never saw it), read, write: the agent
    looked before re-issuing, so the re-issue runs, under the first call's key; the
    loop guard takes it for checking, not for a loop."""
    shop = Shop(faults=["before"])
    script = [
        _call("get_order", order_id=1),
        _call("cancel_order", order_id=1),
        _call("get_order", order_id=1),
        _call("cancel_order", order_id=1),
        text("cancelled"),
    ]
    answers = _run(entry, runner, shop, script, CANCEL)
    assert [m.status for m in answers] == ["success", "error", "success", "success"]
    unknown = tool_error_of(answers[1])
    assert unknown is not None
    assert unknown.failure_class == "unknown"
    assert unknown.context["check_with"][0] == "get_order"
    assert shop.cancelled == [1]
    assert shop.keys[0] is not None
    assert shop.keys == [shop.keys[0]] * 2


def test_a_check_after_a_write_is_not_a_repeated_read(entry: str, runner: Runner) -> None:
    """Read, read, write (its answer lost after it landed), read: the third identical
    read is the agent checking a world the write may have changed, not a loop."""
    shop = Shop(faults=["after"])
    script = [
        _call("get_order", order_id=1),
        _call("get_order", order_id=1),
        _call("cancel_order", order_id=1),
        _call("get_order", order_id=1),
        text("cancelled"),
    ]
    answers = _run(entry, runner, shop, script, CANCEL)
    assert [m.status for m in answers] == ["success", "success", "error", "success"]
    assert '"cancelled"' in str(answers[3].content)
    assert shop.cancelled == [1]


def test_write_check_write_check_is_not_alternation(entry: str, runner: Runner) -> None:
    """Write (lost before the service saw it), read, write (informed: it runs, and its
    answer is lost after it landed), read: checking after each unknown outcome is an
    agent at work, whichever call opened the pattern; the effect happened once."""
    shop = Shop(faults=["before", "after"])
    script = [
        _call("cancel_order", order_id=1),
        _call("get_order", order_id=1),
        _call("cancel_order", order_id=1),
        _call("get_order", order_id=1),
        text("cancelled"),
    ]
    answers = _run(entry, runner, shop, script, CANCEL)
    assert [m.status for m in answers] == ["error", "success", "error", "success"]
    assert '"cancelled"' in str(answers[3].content)
    assert shop.cancelled == [1]


def test_a_read_that_says_not_found_is_a_look(entry: str, runner: Runner) -> None:
    """The check's answer is the service's own refusal ("no refund: not cancelled"), an
    error that still says what is there: the re-issue is informed, so it runs."""
    shop = Shop(faults=["before"])
    script = [
        _call("cancel_order", order_id=1),
        _call("get_refund", order_id=1),
        _call("cancel_order", order_id=1),
        text("cancelled"),
    ]
    answers = _run(entry, runner, shop, script, CANCEL)
    assert [m.status for m in answers] == ["error", "error", "success"]
    assert "not cancelled" in str(answers[1].content)
    assert shop.cancelled == [1]


def test_a_blind_re_issue_is_not_run(entry: str, runner: Runner) -> None:
    """An immediate re-issue, without looking, of a call whose effect may have happened
    is answered, not run: the envelope says how to check."""
    shop = Shop(faults=["after"])
    script = [_call("cancel_order", order_id=1), _call("cancel_order", order_id=1), text("?")]
    answers = _run(entry, runner, shop, script, CANCEL)
    refused = tool_error_of(answers[1])
    assert refused is not None
    assert refused.failure_class == "unknown"
    assert refused.context["earlier_call"] is True
    assert "get_order" in refused.context["check_with"]
    assert shop.cancelled == [1]
    assert len(shop.keys) == 1


def test_a_lost_answer_is_sent_again_under_the_same_key_by_key(entry: str, runner: Runner) -> None:
    """The service deduplicates by the key (``safe_repeat="by_key"``): the lost answer is
    retried under the same key inside the call, and the effect happens once."""
    shop = Shop(faults=["after"], dedupes=True)
    profiles = {"cancel_order": ToolProfile(side_effect=True, safe_repeat="by_key")}
    script = [_call("cancel_order", order_id=1), text("cancelled")]
    answers = _run(entry, runner, shop, script, profiles)
    assert [(m.status, m.content) for m in answers] == [("success", "cancelled")]
    assert shop.cancelled == [1]
    assert len(shop.keys) == 2
    assert shop.keys[0] == shop.keys[1]


def test_a_new_request_after_a_resent_re_issue_runs(entry: str, runner: Runner) -> None:
    """By key: every attempt's answer is lost, the agent re-issues, the re-issue is sent
    under the first key (the service answers from its record). In the next task the
    user asks for the same effect anew: it runs, under a new key. The two intents the
    re-issue answered are one effect, not two done that the thread no longer shows."""
    shop = Shop(faults=["after"] * 3, dedupes=True)
    profiles = {"cancel_order": ToolProfile(side_effect=True, safe_repeat="by_key")}
    script = [
        _call("cancel_order", order_id=1),
        _call("cancel_order", order_id=1),
        text("cancelled"),
        _call("cancel_order", order_id=1),
        text("cancelled again"),
    ]
    config = {"configurable": {"thread_id": uuid.uuid4().hex}}
    if entry == "graph":
        agent = build_graph(shop.tools(), script, profiles=profiles).app
    else:
        middleware = ResilienceMiddleware(profiles=profiles, clock=FakeClock())
        agent = create_agent(
            ScriptedChatModel(responses=script),
            shop.tools(),
            middleware=[middleware],
            checkpointer=InMemorySaver(),
        )
    runner.invoke(agent, {"messages": [("user", "cancel order 1")]}, config)
    out = runner.invoke(agent, {"messages": [("user", "cancel order 1 again")]}, config)
    answers = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    assert [m.status for m in answers] == ["error", "success", "success"]
    assert "earlier run" not in str(answers[2].content)
    assert shop.cancelled == [1, 1]
    assert len(set(shop.keys)) == 2


def test_an_idempotent_effect_is_retried_like_a_read(entry: str, runner: Runner) -> None:
    """Twice is once (``safe_repeat="idempotent"``): a lost answer is simply retried."""
    shop = Shop(faults=["before"])
    profiles = {"cancel_order": ToolProfile(side_effect=True, safe_repeat="idempotent")}
    script = [_call("cancel_order", order_id=1), text("cancelled")]
    answers = _run(entry, runner, shop, script, profiles)
    assert [(m.status, m.content) for m in answers] == [("success", "cancelled")]
    assert shop.cancelled == [1]


def test_a_definite_refusal_is_retried_under_the_same_key(entry: str, runner: Runner) -> None:
    """A 503 says the request was not processed: retried, even for a side effect, under
    the same key."""
    shop = Shop(faults=["refused"])
    script = [_call("cancel_order", order_id=1), text("cancelled")]
    answers = _run(entry, runner, shop, script, CANCEL)
    assert [m.content for m in answers] == ["cancelled"]
    assert shop.cancelled == [1]
    assert len(shop.keys) == 2
    assert shop.keys[0] == shop.keys[1]


def test_status_from_reconciles_with_the_agents_own_read(entry: str, runner: Runner) -> None:
    """A one-line status check from the agent's read tool finds the lost cancel done:
    the call is answered from the read, nothing runs twice."""
    shop = Shop(faults=["after"])
    _, get_order, *_ = shop.tools()
    check = status_from(get_order, done=lambda order, args: order["status"] == "cancelled")
    profiles = {"cancel_order": ToolProfile(side_effect=True, status_check=check)}
    script = [_call("cancel_order", order_id=1), text("cancelled")]
    answers = _run(entry, runner, shop, script, profiles)
    assert [m.status for m in answers] == ["success"]
    assert json.loads(str(answers[0].content))["status"] == "cancelled"
    assert answers[0].response_metadata["resilience"]["reconciled"] is True
    assert shop.cancelled == [1]


def test_status_from_works_with_an_async_only_read(runner: Runner) -> None:
    """A read tool with only an async body (as MCP tools are) serves the check under
    ``ainvoke``."""
    if runner.mode == "sync":
        pytest.skip("an async-only read needs ainvoke")
    shop = Shop(faults=["after"])

    async def read(order_id: int) -> str:
        return json.dumps(shop.order(order_id))

    aread = StructuredTool.from_function(coroutine=read, name="get_order", description="Read.")
    check = status_from(aread, done=lambda order, args: order["status"] == "cancelled")
    profiles = {"cancel_order": ToolProfile(side_effect=True, status_check=check)}
    answers = _run("graph", runner, shop, [_call("cancel_order", order_id=1), text("ok")], profiles)
    assert [m.status for m in answers] == ["success"]
    assert shop.cancelled == [1]


def test_a_failing_status_check_is_asked_again_like_a_read(runner: Runner) -> None:
    """The status service answers 503 once: the check is retried (after a backoff on the
    clock), finds the effect, and the call is answered from it."""
    shop = Shop(faults=["after"])
    asked: list[str] = []

    def check(key: str, args: dict[str, Any]) -> Any:
        asked.append(key)
        if len(asked) == 1:
            raise FakeHTTPError(503)
        return shop.order(int(args["order_id"]))

    clock = FakeClock()
    profiles = {"cancel_order": ToolProfile(side_effect=True, status_check=check)}
    h = build_graph(
        shop.tools(),
        [_call("cancel_order", order_id=1), text("ok")],
        profiles=profiles,
        clock=clock,
    )
    out = runner.invoke(h.app, {"messages": [("user", "cancel")]}, h.config())
    answers = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    assert [m.status for m in answers] == ["success"]
    assert len(asked) == 2
    assert len(clock.sleeps) >= 1
    assert shop.cancelled == [1]


_PROVIDER_ID = re.compile(r"^[a-zA-Z0-9_-]{1,40}$")


def test_plan_call_ids_fit_every_provider() -> None:
    """The executor names its calls by the step's position: a planner's long or odd step
    id never reaches the provider."""
    from langgraph_resilience._graph.planner import plan_call_id  # noqa: PLC0415

    assert _PROVIDER_ID.match(plan_call_id(10_000, 63))
