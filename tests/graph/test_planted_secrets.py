"""A real graph whose tool fails with planted secrets: none reaches the checkpoint, the
streamed events, the log, the ToolMessages, the escalation or a recovery prompt.

The call's own arguments are the model's (it wrote them): they stay in its `AIMessage`
and in the ledger record that re-runs the call, so the checkpoint is searched for the
secrets the *failure* carried, and everything shown to a model or a human is searched
for the argument's password too.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.types import Command

from langgraph_resilience import EVENT_KEY
from langgraph_resilience.errors import FailureClass, ToolFailure
from langgraph_resilience.testing import (
    FakeHTTPError,
    Fault,
    FaultyTool,
    ScriptedChatModel,
    text,
    tool_calls,
)
from tests.conftest import Runner, build_graph
from tests.unit.test_planted_secrets import PLANTED, Planted

ARG_PASSWORD = "ArgPassw0rd77 x&y"
"""The password the model passes as the call's argument."""

KINDS = [pytest.param(p, id=p.kind) for p in PLANTED]

received: list[str] = []


@tool
def login(user: str, password: str) -> str:
    """Log in."""
    received.append(password)
    return f"welcome {user}"


def _failures(planted: Planted) -> list[BaseException]:
    """The ways one secret reaches a failure: the message and context of a tool's own
    `ToolFailure` (nested lists), an HTTP error's text, headers and body."""
    refused = ToolFailure(
        FailureClass.POLICY,
        f"refused: {planted.text}",
        context={"attempts": [{"detail": planted.text}, [planted.structured]]},
    )
    http = FakeHTTPError(403, headers={"Set-Cookie": "sid=HdrC00kie1"}, body=planted.text)
    http.args = (f"HTTP 403 for {planted.text}",)
    return [refused, http]


def _serialized(value: Any) -> str:
    """Everything `value` holds, as JSON text and as LangGraph serializes it."""
    _, raw = JsonPlusSerializer().dumps_typed(value)
    return json.dumps(value, default=str, ensure_ascii=False) + raw.decode("utf-8", "replace")


def _checkpoint(saver: InMemorySaver, app: Any, config: dict[str, Any]) -> str:
    """The whole checkpoint: every state in the history, pending interrupts, and the
    saver's stored bytes (checkpoints and pending writes)."""
    history = [
        _serialized(s.values) + _serialized([i.value for t in s.tasks for i in t.interrupts])
        for s in app.get_state_history(config)
    ]
    return "\n".join(history) + repr(saver.storage) + repr(saver.writes)


def _leaks(output: str, planted: Planted) -> list[str]:
    return [part for part in (*planted.parts, "HdrC00kie1") if part in output]


def _shown(chunks: list[Any], messages: list[Any], interrupts: list[Any]) -> str:
    """What the user's code, the model and the human are shown."""
    events = [chunk for mode, chunk in chunks if mode == "custom"]
    answers = [
        (m.content, m.artifact, m.response_metadata) for m in messages if isinstance(m, ToolMessage)
    ]
    return _serialized({"events": events, "answers": answers, "interrupts": interrupts})


@pytest.mark.parametrize("planted", KINDS)
def test_an_escalated_failure_keeps_no_secret(
    planted: Planted, runner: Runner, caplog: pytest.LogCaptureFixture
) -> None:
    """A policy failure carrying the secret escalates to a human and is skipped: the
    interrupt, the events, the log, the ToolMessages and the checkpoint hold none of it."""
    for failure in _failures(planted):
        saver = InMemorySaver()
        h = build_graph(
            [FaultyTool(login, [Fault.raises(failure)])],
            [tool_calls(("login", {"user": "u", "password": ARG_PASSWORD})), text("done")],
            escalate=True,
            checkpointer=saver,
        )
        config = h.config()
        with caplog.at_level(logging.INFO, logger="langgraph_resilience"):
            first = runner.stream(
                h.app,
                {"messages": [("user", "log me in")]},
                config,
                stream_mode=["updates", "custom"],
            )
            interrupts = [i.value for t in h.app.get_state(config).tasks for i in t.interrupts]
            assert interrupts
            assert interrupts[0]["args"] == {"user": "u", "password": "[REDACTED]"}
            second = runner.stream(
                h.app,
                Command(resume={"action": "skip", "note": "not now"}),
                config,
                stream_mode=["updates", "custom"],
            )
        state = h.app.get_state(config).values
        [answer] = [m for m in state["messages"] if isinstance(m, ToolMessage)]
        assert answer.status == "error"
        assert state["messages"][-1].content == "done"
        assert any(mode == "custom" and chunk[EVENT_KEY] == "escalation" for mode, chunk in first)

        shown = _shown([*first, *second], state["messages"], interrupts) + caplog.text
        assert _leaks(shown, planted) == []
        assert "ArgPassw0rd77" not in shown
        checkpoint = _checkpoint(saver, h.app, config)
        assert _leaks(checkpoint, planted) == []
        assert "ArgPassw0rd77" in checkpoint  # the model's own call (the search does search)
        caplog.clear()


@pytest.mark.parametrize("planted", KINDS)
def test_a_repaired_call_keeps_its_password_and_shows_none(
    planted: Planted, runner: Runner
) -> None:
    """A 422 carrying the secret goes to reflection repair: the repair model sees the
    password masked and sends it back masked; the repaired call runs with the real one."""
    received.clear()
    failure = FakeHTTPError(422, body=planted.text)
    failure.args = (f"HTTP 422: {planted.text}",)

    def repair(messages: list[Any]) -> AIMessage:
        return tool_calls(("login", {"user": "u2", "password": "[REDACTED]"}))

    repairer = ScriptedChatModel(responses=[repair])
    h = build_graph(
        [FaultyTool(login, [Fault.raises(failure)])],
        [tool_calls(("login", {"user": "u", "password": ARG_PASSWORD})), text("done")],
        repair_model=repairer,
    )
    config = h.config()
    chunks = runner.stream(
        h.app, {"messages": [("user", "log me in")]}, config, stream_mode=["updates", "custom"]
    )

    assert received == [ARG_PASSWORD]  # the repaired call, unmasked
    state = h.app.get_state(config).values
    assert [m.content for m in state["messages"] if isinstance(m, ToolMessage)] == ["welcome u2"]
    prompt = "\n".join(str(m.content) for m in repairer.received[0])
    assert '"password": "[REDACTED]"' in prompt
    assert _leaks(prompt, planted) == []
    assert "ArgPassw0rd77" not in prompt
    assert _leaks(_shown(chunks, state["messages"], []), planted) == []
    assert _leaks(_serialized(state), planted) == []


def test_a_repaired_answer_shows_no_earlier_password(runner: Runner) -> None:
    """The repair trail on the successful ToolMessage shows the failed call's arguments
    masked, as every other place that shows a call's arguments does."""
    repairer = ScriptedChatModel(
        responses=[tool_calls(("login", {"user": "u2", "password": "[REDACTED]"}))]
    )
    h = build_graph(
        [FaultyTool(login, [Fault.raises(FakeHTTPError(422))])],
        [tool_calls(("login", {"user": "u", "password": ARG_PASSWORD})), text("done")],
        repair_model=repairer,
    )
    out = runner.invoke(h.app, {"messages": [("user", "log me in")]}, h.config())
    [answer] = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    assert answer.content == "welcome u2"
    assert "ArgPassw0rd77" not in _serialized([answer.response_metadata, answer.artifact])


def test_an_edit_that_keeps_the_masked_password_runs_with_the_real_one(runner: Runner) -> None:
    """The human sees ``"password": "[REDACTED]"`` and edits only the user: the call runs
    with the real password, not with the placeholder."""
    received.clear()
    h = build_graph(
        [FaultyTool(login, [Fault.status(403)])],
        [tool_calls(("login", {"user": "u", "password": ARG_PASSWORD})), text("done")],
        escalate=True,
    )
    config = h.config()
    out = runner.invoke(h.app, {"messages": [("user", "log me in")]}, config)
    shown = out["__interrupt__"][0].value["args"]
    runner.invoke(
        h.app, Command(resume={"action": "edit", "args": {**shown, "user": "u2"}}), config
    )
    assert received == [ARG_PASSWORD]


AZURE_KEY = "0123456789abcdef0123456789abcdef"


def test_a_key_echoed_by_a_401_never_reaches_the_agent(runner: Runner) -> None:
    """An Azure-style deployment's 401 echoes its 32-hex key ("Incorrect API key
    provided: ..."): the envelope the agent model reads holds no part of it."""
    failure = FakeHTTPError(401, body=f'{{"error": "Incorrect API key provided: {AZURE_KEY}."}}')
    failure.args = (f"Error code: 401 - Incorrect API key provided: {AZURE_KEY}.",)
    h = build_graph(
        [FaultyTool(login, [Fault.raises(failure)])],
        [tool_calls(("login", {"user": "u", "password": ARG_PASSWORD})), text("done")],
    )
    out = runner.invoke(h.app, {"messages": [("user", "log me in")]}, h.config())
    [answer] = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    assert answer.status == "error"
    assert "Incorrect API key provided: [REDACTED]" in str(answer.content)
    seen = "\n".join(str(m.content) for m in h.model.received[-1])
    assert AZURE_KEY[:12] not in seen + _serialized([answer.artifact, answer.response_metadata])
