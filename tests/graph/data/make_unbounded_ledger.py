"""Writes `unbounded_ledger.sqlite`: a thread checkpointed by the unbounded ledger.

Run once, at revision 0a35731 (before the ledger was bounded), to produce the
fixture `tests/graph/test_ledger_migration.py` loads with today's code:

    python tests/graph/data/make_unbounded_ledger.py

The thread has `TURNS` finished tasks of two parallel `lookup` calls each, then a
task whose `flaky` call failed with a 503 and waits, scheduled, for its retry (the
run was stopped before the ``retry`` node). Only the thread's latest checkpoint is
kept (the file stays a few KB); it is what a resume loads.
"""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path
from typing import Any

from langchain_core.messages import HumanMessage
from langgraph.checkpoint.sqlite import SqliteSaver

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent.parent.parent))

from tests.graph.data.old_thread import THREAD, TURNS, build, script  # noqa: E402

FIXTURE = HERE / "unbounded_ledger.sqlite"


def main() -> None:
    FIXTURE.unlink(missing_ok=True)
    conn = sqlite3.connect(FIXTURE, check_same_thread=False)
    graph = build(SqliteSaver(conn), script(), interrupt_before_retry=True)
    config: dict[str, Any] = {"configurable": {"thread_id": THREAD}}
    for turn in range(TURNS + 1):
        graph.invoke({"messages": [HumanMessage(f"question {turn}", id=f"h{turn}")]}, config)
    ledger = graph.get_state(config).values["resilience"]
    assert len(ledger["calls"]) == 2 * TURNS + 1, ledger["calls"].keys()
    latest = conn.execute(
        "SELECT checkpoint_id FROM checkpoints WHERE thread_id = ? "
        "ORDER BY checkpoint_id DESC LIMIT 1",
        (THREAD,),
    ).fetchone()[0]
    conn.execute("DELETE FROM checkpoints WHERE checkpoint_id <> ?", (latest,))
    conn.execute("DELETE FROM writes WHERE checkpoint_id <> ?", (latest,))
    conn.execute("UPDATE checkpoints SET parent_checkpoint_id = NULL")
    conn.commit()
    conn.execute("VACUUM")
    conn.close()
    print(f"{FIXTURE.name}: {FIXTURE.stat().st_size} bytes, {2 * TURNS + 1} call records")


if __name__ == "__main__":
    main()
