"""Deployed on ``langgraph dev``: each effect once across the server's own behaviour
(a graceful restart mid-effect, a crash, double-texting), no intent left pending, and
a shared-stores factory that opens once. Effects are rows in a real Postgres table.

``plain`` (the same agent on LangGraph's ``ToolNode``) runs beside ours where the
scenario bites it, so each test also shows what it protects against.
"""

from __future__ import annotations

import signal
import time
from typing import Any

import psycopg
import pytest
from langgraph_sdk.client import SyncLangGraphClient
from langgraph_sdk.errors import NotFoundError

from langgraph_resilience.stores import SqliteIdempotencyStore, settle_stale
from langgraph_resilience.stores.effect_ledger import LEDGER_FILE
from langgraph_resilience.stores.sqlite import sqlite_connect
from tests.server.conftest import DevServer, effects, new_order, run_finished, start_run


def _messages(client: SyncLangGraphClient, thread_id: str) -> list[dict[str, Any]]:
    values = client.threads.get_state(thread_id)["values"]
    return list(values.get("messages", [])) if isinstance(values, dict) else []


def _pending(server: DevServer) -> int:
    """Intents of unknown outcome in the ledger ``langgraph dev`` gave our graph."""
    store = SqliteIdempotencyStore(sqlite_connect(str(server.cwd / ".langgraph_api" / LEDGER_FILE)))
    try:
        return len(store.list_pending())
    finally:
        store.conn.close()


@pytest.mark.parametrize(("graph", "expected"), [("ours", 1), ("middleware", 1), ("plain", 2)])
def test_a_graceful_restart_mid_effect_does_it_once(
    dev_server: DevServer, server_env: dict[str, Any], graph: str, expected: int
) -> None:
    """SIGTERM while the refund is on the wire: the server re-queues the run on restart.
    Ours answers the replayed call from the ledger; plain ``ToolNode`` refunds again."""
    order, client = new_order(), dev_server.client()
    dev_server.hold()
    thread_id, run_id = start_run(client, graph, f"refund {order}")
    dev_server.wait_for_effect(order)
    dev_server.stop(signal.SIGTERM)
    dev_server.release()
    client = dev_server.start().client()

    assert run_finished(client, thread_id, run_id) == "success"
    assert effects(server_env["dsn"], order) == expected
    last = _messages(client, thread_id)[-1]
    assert last["type"] == "ai"
    assert last["content"].startswith("done:")


PLAIN_DOUBLE_TEXT = {"interrupt": 2, "rollback": 1, "enqueue": 1}
"""Refunds plain ``ToolNode`` makes: under ``interrupt`` the cancelled call has no
answer, the agent asks again, and a second refund goes out."""


@pytest.mark.parametrize("strategy", ["interrupt", "rollback", "enqueue"])
@pytest.mark.parametrize("graph", ["ours", "middleware", "plain"])
def test_double_texting_mid_effect_does_it_once(
    dev_server: DevServer, server_env: dict[str, Any], graph: str, strategy: str
) -> None:
    """A second message while the refund runs, under each multitask strategy: one refund,
    the thread completes, and no intent stays pending (a cancelled run's effect records
    its outcome when it lands). Plain ``ToolNode`` beside it, for contrast."""
    order, client = new_order(), dev_server.client()
    dev_server.hold()
    thread_id, first = start_run(client, graph, f"refund {order}")
    dev_server.wait_for_effect(order)
    second = client.runs.create(
        thread_id, graph, input={"messages": [{"role": "user", "content": "any news?"}]},
        multitask_strategy=strategy,
    )  # fmt: skip
    time.sleep(0.5)  # let the server act on the second run before the effect lands
    dev_server.release()

    assert run_finished(client, thread_id, second["run_id"]) == "success"
    assert effects(server_env["dsn"], order) == (
        PLAIN_DOUBLE_TEXT[strategy] if graph == "plain" else 1
    )
    messages = _messages(client, thread_id)
    assert messages[-1]["type"] == "ai"
    if strategy != "rollback":  # told the refund happened (rollback forgets the first run)
        assert "refunded" in messages[-1]["content"]
    if strategy != "rollback":
        assert run_finished(client, thread_id, first) in ("success", "interrupted")
    if graph == "ours":
        for _ in range(50):  # the cancelled attempt's outcome is written as it lands
            if _pending(dev_server) == 0:
                break
            time.sleep(0.1)
        assert _pending(dev_server) == 0


def test_a_crash_mid_effect_never_repeats_it_and_leaves_no_intent_forever(
    dev_server: DevServer, server_env: dict[str, Any]
) -> None:
    """SIGKILL mid-effect: ``langgraph dev`` may lose the thread with its unflushed files
    while our ledger (a file beside them, durable at once) keeps the intent. Either way
    the refund is not repeated, and the stale-intent rule settles what no run will."""
    order, client = new_order(), dev_server.client()
    dev_server.hold()
    thread_id, run_id = start_run(client, "ours", f"refund {order}")
    dev_server.wait_for_effect(order)
    dev_server.stop(signal.SIGKILL)
    dev_server.release()
    client = dev_server.start().client()

    try:
        client.threads.get(thread_id)
        survived = True
    except NotFoundError:
        survived = False
    if survived:
        assert run_finished(client, thread_id, run_id) == "success"
    assert effects(server_env["dsn"], order) == 1
    assert _pending(dev_server) == 1  # the intent whose outcome nobody saw
    store = SqliteIdempotencyStore(
        sqlite_connect(str(dev_server.cwd / ".langgraph_api" / LEDGER_FILE))
    )
    try:
        settled = settle_stale(store, client, grace=0, ttl=0 if survived else 86_400, sees_all=True)
        assert [s.reason for s in settled] == ["expired" if survived else "thread_gone"]
        assert store.list_pending() == []
    finally:
        store.conn.close()


def test_a_shared_stores_factory_opens_once_and_creates_only_our_tables(
    dev_server: DevServer, server_env: dict[str, Any]
) -> None:
    """The ``shared`` graph factory runs per run; `ashared_postgres` opens one pool per
    process, and creates our tables, never the checkpoint tables the server owns."""
    client = dev_server.client()
    orders = [new_order(), new_order()]
    for order in orders:
        thread_id, run_id = start_run(client, "shared", f"refund {order}")
        assert run_finished(client, thread_id, run_id) == "success"
    opened = (server_env["control"] / "opened").read_text().split("\n")
    assert len({line for line in opened if line}) == 1  # one process, one SharedStores
    with psycopg.connect(server_env["dsn"]) as conn:
        tables = {
            row[0]
            for row in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
            ).fetchall()
        }
        recorded = conn.execute(
            "SELECT count(*) FROM lgr_idempotency WHERE status = 'done'"
        ).fetchone()
    assert "lgr_idempotency" in tables
    assert "checkpoints" not in tables
    assert "store" not in tables
    assert recorded == (2,)
    assert [effects(server_env["dsn"], o) for o in orders] == [1, 1]
