"""benchmarks/effect_scaling.py runs as its docstring says (at a tiny size), reports
every N for the sync and the async API, and its ``@task`` anchor does its effect in a
LangGraph task under ``invoke`` and ``ainvoke``."""

from __future__ import annotations

import asyncio
import json
import pathlib
import subprocess
import sys
import uuid
from typing import Any

import pytest
from langchain_core.messages import HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.memory import InMemorySaver

from benchmarks.effect_scaling import APIS, CALLS, PROMPT, build_task, check
from tests.conftest import ADMIN_DSN

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent


def _script(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "benchmarks.effect_scaling", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


@pytest.mark.postgres
@pytest.mark.slow
def test_a_tiny_run_reports_every_n(tmp_path: pathlib.Path, pg_dsn: str) -> None:
    """By default both APIs run, sync then async, each with its own table and JSON
    section: every N has A, B and T turns and an added time per call with its
    interval, over one floor measured in the same rounds; the tables fit 100 columns."""
    out = tmp_path / "scaling.json"
    args = ("--quick", "--rounds", "3", "--warmup", "1", "--resamples", "50")
    run = _script(*args, "--dsn", ADMIN_DSN, "--json", str(out))
    assert run.returncode == 0, run.stderr
    results = json.loads(out.read_text())
    assert results["apis"] == APIS
    for api in ("sync", "async"):
        _check_report(results[api])
    assert all(len(line) <= 100 for line in run.stdout.splitlines()), run.stdout
    assert run.stdout.count("target:") == 2
    assert run.stdout.index("\nsync: ") < run.stdout.index("\nasync: ")


def _check_report(report: dict[str, Any]) -> None:
    assert report["rounds"] == 3
    floor = report["floor_ms"]
    assert floor["samples"] == 3 * len(CALLS)
    assert floor["median"] > 0
    assert floor["ci95"][0] <= floor["median"] <= floor["ci95"][1]
    assert [row["calls"] for row in report["rows"]] == list(CALLS)
    for row in report["rows"]:
        for name in "ABT":
            assert row[f"{name}_ms"]["value"] > 0
        for name in "AT":
            added = row[f"{name}_added_per_call_ms"]
            expected = (row[f"{name}_ms"]["value"] - row["B_ms"]["value"]) / row["calls"]
            assert added["value"] == pytest.approx(expected)
            assert added["ci95"][0] <= added["ci95"][1]
        ratio = row["A_added_per_call_ms"]["value"] / floor["median"]
        assert row["A_added_over_floor"]["value"] == pytest.approx(ratio)
        assert row["meets_floor_target"] == (ratio <= report["floor_target"])


def test_an_unreachable_server_exits_2_without_its_password() -> None:
    run = _script("--quick", "--dsn", "postgresql://postgres:s3cr3t-pw@127.0.0.1:1/postgres")
    assert run.returncode == 2, run.stderr
    assert "not reachable" in run.stderr
    assert "s3cr3t-pw" not in run.stderr + run.stdout


def _task_returns(saver: InMemorySaver, config: RunnableConfig) -> list[Any]:
    """The results saved as tasks' (LangGraph's ``__return__`` writes) in the thread."""
    return [
        value
        for saved in saver.list(config)
        for _, channel, value in saved.pending_writes or ()
        if channel == "__return__"
    ]


def _effects(calls: int) -> list[str]:
    return sorted(f"t{i % 2 + 1}:item {i}" for i in range(calls))


@pytest.mark.parametrize("calls", [1, 4])
def test_the_task_anchor_runs_each_effect_as_a_task(calls: int) -> None:
    """T's tools answer every call, and each effect's result is saved as a task's
    (LangGraph's ``__return__`` write), so T measures what ``@task`` costs."""
    saver = InMemorySaver()
    graph = build_task(saver, calls, 1)
    config: RunnableConfig = {"configurable": {"thread_id": uuid.uuid4().hex}}
    check(graph.invoke({"messages": [HumanMessage(PROMPT)]}, config), calls)
    assert sorted(_task_returns(saver, config)) == _effects(calls)


@pytest.mark.parametrize("calls", [1, 4, 16])
async def test_the_async_task_anchor_runs_each_effect_as_a_task(calls: int) -> None:
    """Under ``ainvoke`` too, each effect's result is saved as a task's; T's tools await
    their task, so a step of 16 calls ends (see ``ATASK_TOOLS``)."""
    saver = InMemorySaver()
    graph = build_task(saver, calls, 1, is_async=True)
    config: RunnableConfig = {"configurable": {"thread_id": uuid.uuid4().hex}}
    turn = graph.ainvoke({"messages": [HumanMessage(PROMPT)]}, config)
    check(await asyncio.wait_for(turn, timeout=30), calls)
    assert sorted(_task_returns(saver, config)) == _effects(calls)
