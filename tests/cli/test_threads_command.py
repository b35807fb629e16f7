"""`langgraph-resilience threads`: one listing query, then one state read per listed
thread, newest first; ``--limit N`` keeps the newest N. Run in this process through
`main(argv, stdout=..., stderr=...)` on the embedded SQLite file (the 1,000-thread
Postgres case is tests/postgres/test_thread_listing.py)."""

from __future__ import annotations

import io
import json
import pathlib
from typing import Any

import pytest
from langgraph.pregel import Pregel

from langgraph_resilience.cli import main


def _cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(args), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def test_the_threads_command_reads_one_state_per_listed_thread(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Demo threads, newest first; --limit keeps the newest N; one get_state per row."""
    state = str(tmp_path / "state")
    for thread_id in ("first", "second", "third"):
        code, _, err = _cli("demo", "--state-dir", state, "--thread-id", thread_id, "--json")
        assert code == 0, err
    reads: list[str] = []
    get_state = Pregel.get_state

    def counted(self: Any, config: Any, **kwargs: Any) -> Any:
        reads.append(config["configurable"]["thread_id"])
        return get_state(self, config, **kwargs)

    monkeypatch.setattr(Pregel, "get_state", counted)

    code, out, err = _cli("threads", "--json", "--state-dir", state)
    assert code == 0, err
    rows = json.loads(out)["threads"]
    assert [r["thread_id"] for r in rows] == ["third", "second", "first"]
    assert {r["state"] for r in rows} == {"done"}
    assert sorted(reads) == ["first", "second", "third"]

    reads.clear()
    code, out, err = _cli("threads", "--json", "--limit", "2", "--state-dir", state)
    assert code == 0, err
    assert [r["thread_id"] for r in json.loads(out)["threads"]] == ["third", "second"]
    assert sorted(reads) == ["second", "third"]

    code, out, err = _cli("threads", "--limit", "1", "--state-dir", state)
    assert code == 0, err
    assert "third" in out
    assert "first" not in out


@pytest.mark.parametrize("bad", ["0", "-2", "many"])
def test_the_threads_command_refuses_a_bad_limit(tmp_path: pathlib.Path, bad: str) -> None:
    code, _, err = _cli("threads", "--limit", bad, "--state-dir", str(tmp_path))
    assert code == 2
    assert "--limit: expected a whole number >= 1" in err
    assert len(err.strip().splitlines()) == 1


def _refused_url() -> str:
    """A loopback URL nothing listens on (the port was free a moment ago)."""
    import socket  # noqa: PLC0415

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.mark.parametrize(
    "command", [["threads"], ["threads", "--json"], ["resume", "t1", "--approve"]]
)
def test_a_server_that_does_not_answer_is_one_line(command: list[str]) -> None:
    """``--url`` of a server that is down: one line saying so and what to do, exit 2,
    not httpx's traceback."""
    url = _refused_url()
    code, out, err = _cli(*command, "--url", url)
    assert code == 2
    assert out == ""
    assert err.strip().splitlines() == [
        f"langgraph-resilience: error: the LangGraph server at {url} did not answer: "
        "[Errno 111] Connection refused (is it running? `langgraph dev` starts one)"
    ]


def test_a_stopped_thread_with_no_next_node_says_where_it_stopped() -> None:
    """No ``stopped before  (step 1)`` with the node missing."""
    from langgraph_resilience.cli.threads import _why  # noqa: PLC0415
    from langgraph_resilience.stores.threads import ThreadStatus  # noqa: PLC0415

    nowhere = ThreadStatus(thread_id="t", state="pending", next=(), step=1)
    assert _why(nowhere, {}) == "stopped at step 1"
    tools = ThreadStatus(thread_id="t", state="pending", next=("tools",), step=20)
    assert _why(tools, {}) == "stopped before tools (step 20)"


def test_an_effect_reconciled_after_a_crash_is_explained_as_such() -> None:
    """The resume summary of a side effect whose run died after it: not ``-`` twice."""
    from langchain_core.messages import ToolMessage  # noqa: PLC0415

    from langgraph_resilience.cli.explain import _explain  # noqa: PLC0415

    record = {"tool": "refund", "status": "ok", "attempts": 1, "error": None}
    answer = ToolMessage(
        "refund R-1",
        tool_call_id="c1",
        response_metadata={"resilience": {"reconciled": True, "idempotency_key": "k"}},
    )
    klass, failed, recovery, how = _explain({"id": "c1"}, record, answer, {})
    assert (klass, recovery, how) == ("unknown", "reconcile", "reconciled by status_check")
    assert failed == "the run stopped after the effect, before its checkpoint"
