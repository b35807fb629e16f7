"""The issue-15 benchmarks run as their README says, and what they assert of the
package holds at a small size: the ledger's channel does not grow with the thread,
and a soak of side-effecting turns does not grow the process."""

from __future__ import annotations

import importlib.util
import json
import pathlib
import subprocess
import sys
from typing import Any

import pytest
from langgraph.checkpoint.memory import InMemorySaver

from tests.conftest import ADMIN_DSN

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent


def _run(script: str, *args: str, out: pathlib.Path) -> dict:  # type: ignore[type-arg]
    subprocess.run(
        [sys.executable, f"benchmarks/{script}", *args, "--json", str(out)],
        cwd=ROOT,
        check=True,
        capture_output=True,
        timeout=600,
    )
    return json.loads(out.read_text())  # type: ignore[no-any-return]


def _load(script: str) -> Any:
    """A benchmark script as a module (benchmarks/ is not a package)."""
    spec = importlib.util.spec_from_file_location(script, ROOT / "benchmarks" / f"{script}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[script] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def test_long_thread_channel_stays_flat(tmp_path: pathlib.Path, pg_dsn: str) -> None:
    """At 10 and 300 calls the channel is the same size (digits aside), and on
    PostgresSaver the ledger's blobs stay within 1.2x of plain's."""
    report = _run(
        "long_thread.py",
        *("--calls", "10", "300", "--pairs", "4", "--pg-calls", "100", "--dsn", ADMIN_DSN),
        out=tmp_path / "long.json",
    )
    short, long = report["lengths"]
    assert long["channel_bytes"] <= short["channel_bytes"] + 16
    assert long["channel_bytes"] < 20_000
    assert report["postgres"]["blob_ratio"] <= 1.2


def test_soak_is_flat_on_the_in_memory_saver(tmp_path: pathlib.Path) -> None:
    """4,000 side-effecting turns on deleted threads (past the in-flight registry filling
    up): ours grows no faster than plain."""
    report = _run("soak.py", "--turns", "4000", "--savers", "memory", out=tmp_path / "soak.json")
    row = report["memory"]
    # Allocator noise on a short, shared-CPU run reaches ~100 KB per 1,000 turns; the
    # unswept ledger grew ~1,100 KB. (The 10,000-turn benchmark itself allows 64 KB.)
    assert row["A"]["slope"] <= row["B"]["slope"] + 300.0, {k: v["slope"] for k, v in row.items()}


def test_middleware_floor_has_the_same_graph() -> None:
    """overhead.py's pass-through middleware is a fair floor for ResilienceMiddleware:
    the same nodes and edges, the same state channels, and a clean turn answers both
    calls with the model called twice."""
    overhead = _load("overhead")

    ours = overhead.build_agent_resilient(InMemorySaver(), 2)
    floor = overhead.build_agent_floor(InMemorySaver(), 2)

    def shape(graph: object, middleware: str) -> tuple[list[str], list[tuple[str, ...]]]:
        drawn = graph.get_graph()  # type: ignore[attr-defined]
        named = [node.replace(f"{middleware}.", "hook.") for node in drawn.nodes]
        edges = [
            tuple(str(part).replace(f"{middleware}.", "hook.") for part in edge)
            for edge in drawn.edges
        ]
        return sorted(named), sorted(edges)

    assert shape(ours, "ResilienceMiddleware") == shape(floor, "PassThrough")
    channels = [
        sorted(name.replace(f"{middleware}.", "hook.") for name in graph.channels)
        for graph, middleware in ((ours, "ResilienceMiddleware"), (floor, "PassThrough"))
    ]
    assert channels[0] == channels[1]
    assert "resilience" in floor.channels
    _, _, result = overhead.invoke_turn(floor)
    kinds = [type(m).__name__ for m in result["messages"]]
    assert kinds == ["HumanMessage", "AIMessage", "ToolMessage", "ToolMessage", "AIMessage"]


def test_add_resilience_floor_is_plain_with_its_channel_and_entry_branch() -> None:
    """overhead.py's floor for add_resilience is the plain graph plus what our design asks
    of LangGraph: the resilience channel and a branch at START, and nothing of ours runs
    in it; a clean turn answers both calls with the model called twice."""
    overhead = _load("overhead")

    plain = overhead.build_plain(InMemorySaver(), 2)
    floor = overhead.build_plain_floor(InMemorySaver(), 2)
    ours = overhead.build_resilient(InMemorySaver(), 2)

    assert "resilience" in floor.channels
    assert "resilience" in ours.channels
    assert "resilience" not in plain.channels
    assert set(floor.builder.branches["__start__"]) == {"route_entry"}
    assert "__start__" not in plain.builder.branches
    assert set(floor.builder.nodes) == set(plain.builder.nodes) == {"agent", "tools"}
    _, _, result = overhead.invoke_turn(floor)
    kinds = [type(m).__name__ for m in result["messages"]]
    assert kinds == ["HumanMessage", "AIMessage", "ToolMessage", "ToolMessage", "AIMessage"]
    assert not result["resilience"]  # the channel is there, and nothing writes it


def test_in_situ_times_each_piece_where_it_runs_and_puts_everything_back() -> None:
    """overhead.py --profile times A's pieces inside real turns: each piece of A is seen,
    the listed parts and the rest add up to the turn's delta, and every timed attribute
    is the original again afterwards (an inherited method is not left on the subclass)."""
    overhead = _load("overhead")

    def state() -> list[tuple[object, bool]]:
        return [
            (getattr(owner, attr), not isinstance(owner, type) or attr in vars(owner))
            for owner, attr, _ in overhead.CLASS_POINTS
        ]

    before = state()
    found = overhead.in_situ(6, warmup=2)
    assert state() == before

    rows = {row["piece"].strip(): row for row in found["rows"]}
    for piece in (
        "the tools node",
        "routing after the step (SelfRouted)",
        "of which plan_batch",
        "of which finish_step",
        "the interception (2 calls, summed)",
        "the tally reducer",
    ):
        assert rows[piece]["A"] > 0, piece
    assert rows["tool execution (2 calls, summed)"]["B"] > 0
    assert rows["the tally reducer"]["B"] == 0.0  # B has no resilience channel
    parts = [r["delta"] for r in found["rows"][1:] if not r["piece"].startswith(" ")]
    assert abs(sum(parts) - rows["turn"]["delta"]) < 1e-6


def test_recovery_in_situ_times_what_only_a_recovery_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """recovery_cost.py --profile: classifying, deciding and the in-step loop's merges
    run in a recovered turn and never in a clean one, the tool runs twice in a recovered
    turn, and every timed attribute is the original again afterwards."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))  # recovery_cost imports overhead
    recovery = _load("recovery_cost")
    points = recovery.recovery_points()
    before = [getattr(owner, attr) for owner, attr, _ in points]

    found = recovery.in_situ(6, warmup=2)

    assert [getattr(owner, attr) for owner, attr, _ in points] == before
    rows = {row["piece"]: row for row in found["rows"]}
    for piece in ("classify", "decide", "apply_update", "compose_deltas"):
        assert rows[piece]["recovery_us"] > 0, piece
        assert rows[piece]["clean_us"] == 0.0, piece
    tool = rows["tool execution"]
    assert tool["recovery_us"] > tool["clean_us"] > 0


def test_saver_connections_runs_every_variant(tmp_path: pathlib.Path, pg_dsn: str) -> None:
    """saver_connections.py's turns finish on every saver variant, sync and async (each
    turn asserts its answer), and it reports every ratio."""
    report = _run(
        "saver_connections.py", "--rounds", "2", "--dsn", ADMIN_DSN, out=tmp_path / "s.json"
    )
    for mode in ("sync", "async"):
        assert set(report[mode]["median_ms"]) == {
            "conn",
            "pool",
            "conn+pool",
            "plain conn",
            "plain pool",
        }
        assert len(report[mode]["ratios"]) == 4
