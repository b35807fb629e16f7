"""On ``langgraph dev``: a refund the thread no longer shows (a ``rollback`` double-text
while it was in flight, or checkpoints the server lost when killed right after the run
succeeded) is not done again when the user asks again, and the agent is told it was
done. Effects are rows in a real Postgres table; many trials, since the outcome
depends on what lands first."""

from __future__ import annotations

import signal
from typing import Any

import pytest
from langgraph_sdk.client import SyncLangGraphClient

from tests.server.conftest import DevServer, effects, new_order, run_finished, start_run

pytestmark = pytest.mark.slow

ROLLBACK_TRIALS = 20
KILL_TRIALS = 10


def _last_ai(client: SyncLangGraphClient, thread_id: str) -> str:
    values = client.threads.get_state(thread_id)["values"]
    messages = values.get("messages", []) if isinstance(values, dict) else []
    return next(str(m["content"]) for m in reversed(messages) if m["type"] == "ai")


def _holds_refund(client: SyncLangGraphClient, thread_id: str) -> bool:
    values = client.threads.get_state(thread_id)["values"]
    messages = values.get("messages", []) if isinstance(values, dict) else []
    return any(m["type"] == "tool" for m in messages)


@pytest.fixture
def slow_model(server_env: dict[str, Any]) -> None:
    """A model that takes a second per call, as a real one does: the rolled-back run's
    refund lands (and records its outcome) while the re-sent request is thought about."""
    server_env["env"]["LGR_MODEL_LATENCY"] = "1"


@pytest.mark.parametrize("graph", ["ours", "middleware"])
def test_a_rollback_mid_refund_then_the_request_re_sent_refunds_once(
    slow_model: None, dev_server: DevServer, server_env: dict[str, Any], graph: str
) -> None:
    """The user re-sends "refund X" with multitask_strategy="rollback" while the first
    refund is on the wire: the first run and its checkpoints are deleted, its refund
    lands; the re-sent request is answered with that refund, never a second one."""
    client = dev_server.client()
    for _ in range(ROLLBACK_TRIALS):
        order = new_order()
        dev_server.hold()
        thread_id, _ = start_run(client, graph, f"refund {order}")
        dev_server.wait_for_effect(order)
        again = client.runs.create(
            thread_id, graph, input={"messages": [{"role": "user", "content": f"refund {order}"}]},
            multitask_strategy="rollback",
        )  # fmt: skip
        dev_server.release()
        assert run_finished(client, thread_id, again["run_id"]) == "success"
        assert effects(server_env["dsn"], order) == 1
        assert f"refunded {order}" in _last_ai(client, thread_id)  # told it happened


def test_a_refund_the_killed_server_lost_is_not_done_again(
    dev_server: DevServer, server_env: dict[str, Any]
) -> None:
    """SIGKILL right after the run reported success, before ``langgraph dev`` flushed its
    files: the thread comes back without the refund (or not at all). The user re-sends
    the request on the same thread id: answered from the ledger, said to be already
    done, not refunded again. A trial whose thread kept the refund has nothing to
    re-send (asking again there is a new request)."""
    lost = 0
    for _ in range(KILL_TRIALS):
        client, order = dev_server.client(), new_order()
        thread_id, run_id = start_run(client, "ours", f"refund {order}")
        assert run_finished(client, thread_id, run_id) == "success"
        dev_server.stop(signal.SIGKILL)
        client = dev_server.start().client()
        threads = client.threads.search(metadata=None, limit=1000)
        if any(t["thread_id"] == thread_id for t in threads) and _holds_refund(client, thread_id):
            assert effects(server_env["dsn"], order) == 1
            continue
        lost += 1
        again = client.runs.create(
            thread_id, "ours", input={"messages": [{"role": "user", "content": f"refund {order}"}]},
            if_not_exists="create",
        )  # fmt: skip
        assert run_finished(client, thread_id, again["run_id"]) == "success"
        assert effects(server_env["dsn"], order) == 1
        answer = _last_ai(client, thread_id)
        assert f"refunded {order}" in answer
        assert "already done" in answer
    assert lost > 0, "no trial lost the refund: the scenario was not exercised"
