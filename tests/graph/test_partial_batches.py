"""PARTIAL: a batch tool that reports some items failed gets only those redone."""

from __future__ import annotations

import json
from typing import Any

import pytest
from langchain_core.messages import ToolMessage
from langchain_core.tools import tool

from langgraph_resilience import (
    ConfigurationError,
    PartialResult,
    ResiliencePolicy,
    ToolProfile,
    current_item_keys,
)
from langgraph_resilience.core import FailedItem
from langgraph_resilience.events import EVENT_KEY
from langgraph_resilience.testing import text, tool_calls
from tests.conftest import Runner, build_graph


class Mailer:
    """A mail service: the first send of each address in `bouncing` fails once."""

    def __init__(self, bouncing: set[str], *, times: int = 1) -> None:
        self.sent: list[tuple[str, str | None]] = []
        self.bounces = dict.fromkeys(bouncing, times)
        self.batches: list[list[str]] = []

    def tool(self) -> Any:
        mailer = self

        @tool
        def send_bulk(to: list[str], subject: str) -> dict[str, Any]:
            """Send one email to each address."""
            mailer.batches.append(list(to))
            keys = current_item_keys() or (None,) * len(to)
            failed, sent = [], []
            for index, (address, key) in enumerate(zip(to, keys, strict=True)):
                if mailer.bounces.get(address, 0) > 0:
                    mailer.bounces[address] -= 1
                    failed.append(FailedItem(index=index, error="mailbox busy (451)"))
                    continue
                mailer.sent.append((address, key))
                sent.append(address)
            if failed:
                return PartialResult(succeeded=sent, failed=failed).model_dump()
            return {"sent": sent}

        return send_bulk


def tool_messages(state: dict[str, Any]) -> list[ToolMessage]:
    return [m for m in state["messages"] if isinstance(m, ToolMessage)]


BATCH = ("send_bulk", {"to": ["a@x", "b@x", "c@x", "d@x"], "subject": "hi"})


def test_only_the_failed_items_are_sent_again(runner: Runner) -> None:
    """b and d bounce once: the retry sends b and d only; nobody gets two emails."""
    mailer = Mailer({"b@x", "d@x"})
    h = build_graph(
        [mailer.tool()],
        [tool_calls(BATCH), text("sent")],
        profiles={"send_bulk": ToolProfile(batch_arg="to")},
    )

    chunks = runner.stream(
        h.app, {"messages": [("user", "mail all")]}, h.config(), stream_mode=["custom", "values"]
    )

    assert mailer.batches == [["a@x", "b@x", "c@x", "d@x"], ["b@x", "d@x"]]
    assert sorted(address for address, _ in mailer.sent) == ["a@x", "b@x", "c@x", "d@x"]
    final = next(c for mode, c in reversed(chunks) if mode == "values")
    [message] = tool_messages(final)
    assert message.status == "success"
    assert json.loads(str(message.content)) == {
        "succeeded_earlier": ["a@x", "c@x"],
        "result": {"sent": ["b@x", "d@x"]},
    }
    attempts = [c for mode, c in chunks if mode == "custom" and c[EVENT_KEY] == "attempt"]
    assert [(a.get("failure_class"), a.get("failed")) for a in attempts] == [
        ("partial", 2),
        (None, None),
    ]
    assert len(h.clock.sleeps) == 1  # one backoff, on the fake clock


def test_a_redone_item_keeps_its_first_idempotency_key(runner: Runner) -> None:
    """For a side-effecting batch, each item has its own key, and b's key on the redo is
    the one it had on the first run (so the service can deduplicate it)."""
    mailer = Mailer({"b@x"})
    h = build_graph(
        [mailer.tool()],
        [tool_calls(BATCH), text("sent")],
        profiles={"send_bulk": ToolProfile(batch_arg="to", side_effect=True)},
    )

    runner.invoke(h.app, {"messages": [("user", "mail all")]}, h.config())

    keys = dict(mailer.sent)
    assert len(set(keys.values())) == 4
    first_run_key = next(iter(keys.values()))
    assert first_run_key is not None
    base = first_run_key.rsplit("#", 1)[0]
    assert keys == {f"{a}@x": f"{base}#{i}" for i, a in enumerate("abcd")}


def test_merge_batches_answers_in_the_tool_own_shape(runner: Runner) -> None:
    """With merge_batches, the agent reads one answer listing every address sent."""
    mailer = Mailer({"b@x"})
    h = build_graph(
        [mailer.tool()],
        [tool_calls(BATCH), text("sent")],
        profiles={
            "send_bulk": ToolProfile(
                batch_arg="to",
                merge_batches=lambda earlier, last: {"sent": [*earlier, *last["sent"]]},
            )
        },
    )

    out = runner.invoke(h.app, {"messages": [("user", "mail all")]}, h.config())

    [message] = tool_messages(out)
    assert json.loads(str(message.content)) == {"sent": ["a@x", "c@x", "d@x", "b@x"]}


def test_items_that_keep_failing_stop_at_max_attempts_with_what_succeeded(
    runner: Runner,
) -> None:
    """c bounces every time: after max_attempts the agent gets a PARTIAL envelope that
    says what went through and what did not."""
    mailer = Mailer({"c@x"}, times=99)
    h = build_graph(
        [mailer.tool()],
        [tool_calls(BATCH), text("c failed")],
        profiles={"send_bulk": ToolProfile(batch_arg="to")},
        policy=ResiliencePolicy(max_attempts=3),
    )

    out = runner.invoke(h.app, {"messages": [("user", "mail all")]}, h.config())

    assert mailer.batches == [["a@x", "b@x", "c@x", "d@x"], ["c@x"], ["c@x"]]
    [message] = tool_messages(out)
    envelope = json.loads(str(message.content))
    assert (message.status, envelope["failure_class"]) == ("error", "partial")
    assert envelope["context"]["failed"] == ["c@x"]
    assert envelope["context"]["succeeded"] == ["a@x", "b@x", "d@x"]
    assert envelope["context"]["exhausted"] == "max_attempts"


def test_a_partial_result_naming_an_unknown_item_is_not_trusted(runner: Runner) -> None:
    """A tool reporting index 9 of a 4-item batch gets no redo built on it."""

    @tool
    def send_bulk(to: list[str], subject: str) -> dict[str, Any]:
        """Send one email to each address."""
        return PartialResult(failed=[FailedItem(index=9, error="?")]).model_dump()

    h = build_graph(
        [send_bulk],
        [tool_calls(BATCH), text("hm")],
        profiles={"send_bulk": ToolProfile(batch_arg="to")},
    )

    out = runner.invoke(h.app, {"messages": [("user", "mail all")]}, h.config())

    [message] = tool_messages(out)
    assert message.status == "error"
    assert "index 9" in json.loads(str(message.content))["message"]


def test_without_batch_arg_a_partial_result_is_an_ordinary_answer(runner: Runner) -> None:
    """No profile: the tool's answer goes to the agent as it is (nothing is redone)."""
    mailer = Mailer({"b@x"})
    h = build_graph([mailer.tool()], [tool_calls(BATCH), text("b bounced")])

    out = runner.invoke(h.app, {"messages": [("user", "mail all")]}, h.config())

    assert len(mailer.batches) == 1
    assert json.loads(str(tool_messages(out)[0].content))["partial"] is True


def test_batch_arg_must_be_a_list_argument_of_the_tool() -> None:
    with pytest.raises(ConfigurationError, match="batch_arg"):
        ToolProfile(batch_arg="")
    with pytest.raises(ConfigurationError, match="pass batch_arg too"):
        ToolProfile(merge_batches=lambda earlier, last: last)
    with pytest.raises(ConfigurationError, match=r"'recipients'.*send_bulk"):
        build_graph(
            [Mailer(set()).tool()],
            [text("x")],
            profiles={"send_bulk": ToolProfile(batch_arg="recipients")},
        )
