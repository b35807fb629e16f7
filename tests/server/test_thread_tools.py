"""`thread_status`, `resume` and `list_threads` against a real ``langgraph dev``: given
the server (a `langgraph_sdk` client or a `RemoteGraph`), not a local checkpointer.
An escalation is answered with ``Command(resume=...)`` over the API."""

from __future__ import annotations

import asyncio
import io
import json
import time
import uuid
from typing import Any

import pytest
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.pregel.remote import RemoteGraph
from langgraph.types import Command
from langgraph_sdk import get_client

from langgraph_resilience import (
    ConfigurationError,
    ThreadBusyError,
    aresume,
    list_threads,
    resume,
    thread_status,
)
from langgraph_resilience.cli import main
from langgraph_resilience.errors import ThreadNotFoundError
from langgraph_resilience.stores import athread_status
from langgraph_resilience.stores.threads import alist_threads
from tests.server.conftest import DevServer


def _wait_state(server: DevServer, thread_id: str, state: str, timeout: float = 60.0) -> Any:
    client, deadline = server.client(), time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = thread_status(client, thread_id)
        if found.state == state:
            return found
        time.sleep(0.1)
    pytest.fail(f"thread {thread_id} never became {state!r}: {found}")


def _escalated(server: DevServer) -> str:
    """A thread waiting for a human: the goodwill credit needs a supervisor (403)."""
    client = server.client()
    thread = client.threads.create()
    client.runs.wait(
        thread["thread_id"], "ours",
        input={"messages": [{"role": "user", "content": "goodwill 20"}]},
    )  # fmt: skip
    return str(thread["thread_id"])


def test_status_of_a_waiting_thread_and_its_answer_over_the_api(dev_server: DevServer) -> None:
    thread_id = _escalated(dev_server)
    client = dev_server.client()

    status = thread_status(client, thread_id)
    assert status.state == "interrupted"
    assert status.next == ("escalate",)
    (request,) = status.interrupts
    assert request["tool"] == "goodwill"
    assert request["envelope"]["failure_class"] == "policy"
    assert thread_id in list_threads(client)

    (dev_server.control / "approved-20").write_text("x")  # the supervisor approves...
    command = Command(resume={status.interrupt_ids[0]: {"action": "retry"}})
    result = resume(client, thread_id, command=command, assistant_id="ours")
    assert result["messages"][-1]["content"] == "done: credited 20"
    assert thread_status(client, thread_id).state == "done"


def test_a_remote_graph_works_the_same(dev_server: DevServer) -> None:
    thread_id = _escalated(dev_server)
    remote = RemoteGraph("ours", sync_client=dev_server.client())
    status = thread_status(remote, thread_id)
    assert status.state == "interrupted"
    skip = Command(resume={status.interrupt_ids[0]: {"action": "skip", "note": "no credit"}})
    resume(remote, thread_id, command=skip)
    assert thread_status(remote, thread_id).state == "done"


def test_a_running_thread_is_running_and_refuses_a_second_run(dev_server: DevServer) -> None:
    client = dev_server.client()
    dev_server.hold()
    thread = client.threads.create()
    client.runs.create(
        thread["thread_id"], "ours",
        input={"messages": [{"role": "user", "content": "refund r1"}]},
    )  # fmt: skip
    dev_server.wait_for_effect("r1")
    _wait_state(dev_server, thread["thread_id"], "running")
    with pytest.raises(ThreadBusyError):
        resume(client, thread["thread_id"], assistant_id="ours")
    dev_server.release()
    _wait_state(dev_server, thread["thread_id"], "done")


def test_unknown_threads_and_a_graph_without_a_checkpointer(dev_server: DevServer) -> None:
    client = dev_server.client()
    assert thread_status(client, str(uuid.uuid4())).state == "not_found"
    with pytest.raises(ThreadNotFoundError):
        resume(client, str(uuid.uuid4()), assistant_id="ours")
    local = StateGraph(MessagesState)
    local.add_node("noop", lambda state: {})
    local.add_edge(START, "noop")
    with pytest.raises(ConfigurationError, match="LangGraph Server"):
        thread_status(local.compile(), "t")  # the server owns its checkpointer
    with pytest.raises(ConfigurationError, match="lock="):
        resume(client, "t", lock="postgresql://unused")


def test_the_async_functions_take_an_async_client(dev_server: DevServer) -> None:
    thread_id = _escalated(dev_server)

    async def check() -> None:
        client = get_client(url=dev_server.url)
        try:
            status = await athread_status(client, thread_id)
            assert status.state == "interrupted"
            assert thread_id in await alist_threads(client, limit=5)
            skip = Command(resume={status.interrupt_ids[0]: {"action": "skip"}})
            await aresume(client, thread_id, command=skip, assistant_id="ours")
            assert (await athread_status(client, thread_id)).state == "done"
        finally:
            await client.aclose()

    asyncio.run(check())


def test_the_command_lists_and_answers_a_servers_threads(dev_server: DevServer) -> None:
    """``langgraph-resilience threads --url`` and ``resume --url ... --skip``."""
    thread_id = _escalated(dev_server)
    out = io.StringIO()
    assert main(["threads", "--url", dev_server.url, "--json"], stdout=out) == 0
    (row,) = [t for t in json.loads(out.getvalue())["threads"] if t["thread_id"] == thread_id]
    assert row["state"] == "interrupted"
    assert "waits for a human on goodwill" in row["why"]

    err = io.StringIO()
    command = ["resume", thread_id, "--url", dev_server.url, "--assistant", "ours"]
    assert main(command, stdout=io.StringIO(), stderr=err) == 2  # no answer given
    assert "waits for a human" in err.getvalue()
    out = io.StringIO()
    assert main([*command, "--skip"], stdout=out) == 0
    assert f"thread {thread_id}: done" in out.getvalue()
