"""What recovering one transient 503 costs, against LangChain's and LangGraph's retries.

For each system, two kinds of turn on a fresh thread: a *clean* turn (the model asks
for one tool, it succeeds, the model answers) and a *recovery* turn (the same, but
the tool fails once with a transient 503 and succeeds on its retry). The cost of a
recovery is ``median(recovery turn) - median(clean turn)`` of that system, and the
target is ours <= 2x what ``ToolRetryMiddleware`` adds, in the same run.

The systems:

- ``add_resilience``: the user's graph + ``add_resilience`` (short backoffs retried
  inside the tools step, the default ``inline_retry_max_wait``);
- ``add_resilience, retry node``: the same with ``inline_retry_max_wait=None``, the
  path every retry took before (retry node + tools again, two checkpoints);
- ``ResilienceMiddleware`` and ``ResilienceMiddleware, retry node``: ``create_agent``
  with our middleware, both ways;
- ``ToolRetryMiddleware``: ``create_agent`` + LangChain's ``ToolRetryMiddleware``
  (``initial_delay=0``, no jitter), the reference of the target;
- ``RetryPolicy``: a hand-wired graph whose ``ToolNode`` has LangGraph's
  ``RetryPolicy(initial_interval=0, jitter=False)``.

The wait itself is not measured: every system's backoff is zero (ours
``ResiliencePolicy(base_delay=0)``, on the system clock; theirs
``initial_delay=0`` / ``initial_interval=0``), so what is measured is the machinery of
a retry (classification, decisions, ledger, events, checkpoints). All cells (system x
kind) are interleaved in one run, in ABBA order (the order of the cells reversed every
other round) after a warm-up, with ``PostgresSaver`` on a throw-away database
``lgr_bench_<random>`` (dropped at the end) and with ``InMemorySaver``. Reported per
system: median clean and recovery turn, the cost of a recovery, the ratio of that cost
to ``ToolRetryMiddleware``'s with a bootstrap 95% interval (resampling rounds), and the
checkpoints a recovery turn writes.

Run it from the repository root::

    python benchmarks/recovery_cost.py                 # full run (~3-5 min)
    python benchmarks/recovery_cost.py --quick         # smoke run (~1 min)
    python benchmarks/recovery_cost.py --dsn postgresql://postgres@127.0.0.1:5432/postgres
    python benchmarks/recovery_cost.py --json recovery.json
    python benchmarks/recovery_cost.py --profile       # + where a recovery's time goes

``--profile`` then times the pieces of ``add_resilience``'s turn where they run
(InMemorySaver; `overhead.py`'s part 3 does the same for a clean turn): a recovered and
a clean turn interleaved, the median of each piece's per-turn wall time in both, and
what the recovery adds to each.

Postgres as in ``overhead.py``: the default DSN is tried and the Postgres rows are
skipped, with the reason, when it is unreachable; an explicit ``--dsn`` that is
unreachable is an error. The exit status is 0 whether or not the target is met.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import RetryPolicy
from overhead import (
    CLASS_POINTS,
    DEFAULT_DSN,
    Point,
    clocks,
    graph_points,
    missing_points,
    postgres_saver,
    probe_postgres,
    quantile,
)

from langgraph_resilience import (
    ResilienceMiddleware,
    ResiliencePolicy,
    ResilienceState,
    add_resilience,
)
from langgraph_resilience.testing import FakeHTTPError, ScriptedChatModel, text, tool_calls

TARGET = 2.0
"""Ours may add at most this many times what ToolRetryMiddleware adds per recovery."""

REFERENCE = "ToolRetryMiddleware"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Sizes:
    warmup_rounds: int
    rounds: int


QUICK = Sizes(warmup_rounds=5, rounds=40)
FULL = Sizes(warmup_rounds=15, rounds=200)


# ---------------------------------------------------------------- the tool and model


class Armed:
    """Whether the tool's next execution fails with a 503 (set before a recovery turn)."""

    fail_next = False
    executions = 0


@tool
def lookup(query: str) -> str:
    """Looks something up; fails once with a transient 503 when armed."""
    Armed.executions += 1
    if Armed.fail_next:
        Armed.fail_next = False
        raise FakeHTTPError(503)
    return f"found:{query}"


FIRST = tool_calls(("lookup", {"query": "weather in Paris"}))
FINAL = text("It is sunny in Paris.")


def _first(messages: list[Any]) -> AIMessage:
    return FIRST


def _final(messages: list[Any]) -> AIMessage:
    return FINAL


def scripted_model(turns: int) -> ScriptedChatModel:
    """One long-lived model per graph, scripted for `turns` turns (see overhead.py)."""
    return ScriptedChatModel(responses=[_first, _final] * turns)


POLICY = ResiliencePolicy(base_delay=0.0)
"""Zero backoff: the wait is not measured, only what a retry costs."""


class ResilientState(MessagesState, ResilienceState):
    """The user's state plus the resilience ledger."""


def _agent_node(turns: int) -> Callable[[MessagesState], dict[str, Any]]:
    model = scripted_model(turns)

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    return agent


def build_graph(saver: BaseCheckpointSaver[Any], turns: int, *, inline: bool) -> Any:
    policy = POLICY if inline else ResiliencePolicy(base_delay=0.0, inline_retry_max_wait=None)
    builder = StateGraph(ResilientState)
    builder.add_node("agent", _agent_node(turns))
    add_resilience(builder, agent="agent", tools=[lookup], policy=policy)
    return builder.compile(checkpointer=saver)


def build_middleware(saver: BaseCheckpointSaver[Any], turns: int, *, inline: bool) -> Any:
    from langchain.agents import create_agent  # noqa: PLC0415

    policy = POLICY if inline else ResiliencePolicy(base_delay=0.0, inline_retry_max_wait=None)
    return create_agent(
        scripted_model(turns),
        [lookup],
        middleware=[ResilienceMiddleware(policy=policy)],
        checkpointer=saver,
    )


def build_tool_retry(saver: BaseCheckpointSaver[Any], turns: int) -> Any:
    from langchain.agents import create_agent  # noqa: PLC0415
    from langchain.agents.middleware import ToolRetryMiddleware  # noqa: PLC0415

    retry = ToolRetryMiddleware(max_retries=2, initial_delay=0.0, jitter=False)
    return create_agent(scripted_model(turns), [lookup], middleware=[retry], checkpointer=saver)


def build_retry_policy(saver: BaseCheckpointSaver[Any], turns: int) -> Any:
    builder = StateGraph(MessagesState)
    builder.add_node("agent", _agent_node(turns))
    builder.add_node(
        "tools",
        ToolNode([lookup], handle_tool_errors=False),
        retry_policy=RetryPolicy(initial_interval=0.0, jitter=False, retry_on=FakeHTTPError),
    )
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=saver)


Builder = Callable[[BaseCheckpointSaver[Any], int], Any]
SYSTEMS: dict[str, Builder] = {
    "add_resilience": lambda s, n: build_graph(s, n, inline=True),
    "add_resilience, retry node": lambda s, n: build_graph(s, n, inline=False),
    "ResilienceMiddleware": lambda s, n: build_middleware(s, n, inline=True),
    "ResilienceMiddleware, retry node": lambda s, n: build_middleware(s, n, inline=False),
    REFERENCE: build_tool_retry,
    "RetryPolicy": build_retry_policy,
}
OURS = ("add_resilience", "ResilienceMiddleware")


# ---------------------------------------------------------------- one turn


def run_turn(
    graph: Any, saver: BaseCheckpointSaver[Any], *, recover: bool, check: bool = False
) -> float:
    """One turn on a fresh thread (a recovered 503 when `recover`): its wall seconds."""
    config = {"configurable": {"thread_id": uuid.uuid4().hex}}
    prompt = {"messages": [HumanMessage("What is the weather in Paris?")]}
    Armed.fail_next, before = recover, Armed.executions
    start = time.perf_counter()
    result = graph.invoke(prompt, config)
    elapsed = time.perf_counter() - start
    if check:
        _check(result, executions=Armed.executions - before, recover=recover)
    return elapsed


def _check(result: dict[str, Any], *, executions: int, recover: bool) -> None:
    """Fail loudly unless the turn took the path it is timed for."""
    answers = [m for m in result["messages"] if isinstance(m, ToolMessage)]
    if executions != 1 + recover or len(answers) != 1 or answers[0].status != "success":
        raise RuntimeError(f"the turn did not recover as intended: {result['messages']!r}")
    ledger = result.get("resilience")
    if ledger is not None and ledger.get("tool_attempts") != 1 + recover:
        raise RuntimeError(f"the ledger did not count the recovery: {ledger!r}")


def checkpoints_per_turn(graph: Any, saver: BaseCheckpointSaver[Any], *, recover: bool) -> int:
    """The checkpoints one turn writes (its graph steps)."""
    config = {"configurable": {"thread_id": uuid.uuid4().hex}}
    Armed.fail_next = recover
    graph.invoke({"messages": [HumanMessage("What is the weather in Paris?")]}, config)
    return len(list(saver.list(config)))


# ---------------------------------------------------------------- the run


Cell = tuple[str, bool]


def bench(label: str, saver: BaseCheckpointSaver[Any], sizes: Sizes) -> dict[str, Any]:
    """Every (system, kind) cell interleaved, ABBA by round; the summary per system."""
    turns = 2 * (2 + sizes.warmup_rounds + sizes.rounds) + 4
    graphs = {name: build(saver, turns) for name, build in SYSTEMS.items()}
    cells: list[Cell] = [(name, recover) for name in SYSTEMS for recover in (False, True)]
    for name, recover in cells:
        run_turn(graphs[name], saver, recover=recover, check=True)
    steps = {
        name: {
            "clean": checkpoints_per_turn(graphs[name], saver, recover=False),
            "recovery": checkpoints_per_turn(graphs[name], saver, recover=True),
        }
        for name in SYSTEMS
    }
    for _ in range(sizes.warmup_rounds):
        for name, recover in cells:
            run_turn(graphs[name], saver, recover=recover)
    wall: dict[Cell, list[float]] = {cell: [] for cell in cells}
    for i in range(sizes.rounds):
        for cell in cells if i % 2 == 0 else reversed(cells):
            wall[cell].append(run_turn(graphs[cell[0]], saver, recover=cell[1]))
    return summarize(label, wall, steps)


def _cost(wall: dict[Cell, list[float]], name: str, picks: list[int] | None = None) -> float:
    clean, recovery = wall[(name, False)], wall[(name, True)]
    if picks is not None:
        clean, recovery = [clean[i] for i in picks], [recovery[i] for i in picks]
    return statistics.median(recovery) - statistics.median(clean)


def _ratio_ci(wall: dict[Cell, list[float]], name: str) -> tuple[float, float]:
    """95% interval of cost(name) / cost(reference), resampling the rounds."""
    rng = random.Random(0)
    n = len(wall[(name, False)])
    ratios = []
    for _ in range(1000):
        picks = [rng.randrange(n) for _ in range(n)]
        reference = _cost(wall, REFERENCE, picks)
        if reference > 0:
            ratios.append(_cost(wall, name, picks) / reference)
    if not ratios:
        return float("nan"), float("nan")
    return quantile(ratios, 0.025), quantile(ratios, 0.975)


def summarize(
    label: str, wall: dict[Cell, list[float]], steps: dict[str, dict[str, int]]
) -> dict[str, Any]:
    reference = _cost(wall, REFERENCE)
    rows = []
    for name in SYSTEMS:
        cost = _cost(wall, name)
        ratio = cost / reference if reference > 0 else float("nan")
        low, high = _ratio_ci(wall, name)
        paired = statistics.median(
            r - c for c, r in zip(wall[(name, False)], wall[(name, True)], strict=True)
        )
        rows.append(
            {
                "system": name,
                "clean_ms": statistics.median(wall[(name, False)]) * 1e3,
                "recovery_ms": statistics.median(wall[(name, True)]) * 1e3,
                "cost_ms": cost * 1e3,
                "paired_cost_ms": paired * 1e3,
                "ratio_to_reference": ratio,
                "ratio_ci95": [low, high],
                "checkpoints": steps[name],
                "meets_target": (ratio <= TARGET) if name in OURS else None,
            }
        )
    return {"checkpointer": label, "rounds": len(wall[(REFERENCE, False)]), "rows": rows}


def print_summary(summary: dict[str, Any]) -> None:
    print(f"\n{summary['checkpointer']}, {summary['rounds']} interleaved rounds")
    header = (
        f"{'system':34} {'clean ms':>9} {'503 ms':>9} {'cost ms':>8} {'paired':>7} "
        f"{'/ ' + REFERENCE:>22} {'95% CI':>13} {'ckpts':>6}"
    )
    print(header)
    print("-" * len(header))
    for row in summary["rows"]:
        low, high = row["ratio_ci95"]
        verdict = {True: " meets", False: " MISSES", None: ""}[row["meets_target"]]
        ckpts = f"{row['checkpoints']['clean']}/{row['checkpoints']['recovery']}"
        print(
            f"{row['system']:34} {row['clean_ms']:9.2f} {row['recovery_ms']:9.2f} "
            f"{row['cost_ms']:8.2f} {row['paired_cost_ms']:7.2f} "
            f"{row['ratio_to_reference']:21.2f}x {low:6.2f}-{high:<6.2f} {ckpts:>6}{verdict}"
        )
    print(
        f"cost = median(503 turn) - median(clean turn); paired = median of the per-round "
        f"differences; target: ours <= {TARGET:.0f}x {REFERENCE}'s cost; ckpts = "
        "checkpoints of a clean / a recovery turn"
    )


# ---------------------------------------------------------------- in situ


def recovery_points() -> list[Point]:
    """What ``--profile`` times: `overhead.py`'s pieces of the tools node, and what only a
    recovery runs (classifying, deciding, the in-step loop's merges)."""
    from langgraph_resilience._graph import finish, inline_retry, tool_call  # noqa: PLC0415

    return [
        *(point for point in CLASS_POINTS if point[0] is not InMemorySaver),
        (tool_call, "classify", "classify"),
        (finish, "decide", "decide"),
        (inline_retry, "apply_update", "apply_update"),
        (inline_retry, "compose_deltas", "compose_deltas"),
    ]


def in_situ(rounds: int, warmup: int = 20) -> dict[str, Any]:
    """Each piece's wall time per turn, recovered and clean turns interleaved
    (InMemorySaver, ``add_resilience``): medians, and the recovery's extra."""
    points = recovery_points()
    missing = missing_points(points)
    if missing:
        return {"skipped": missing}
    saver = InMemorySaver()
    graph = SYSTEMS["add_resilience"](saver, 2 * (rounds + warmup) + 10)
    into: dict[str, float] = {}
    seen: dict[bool, list[dict[str, float]]] = {True: [], False: []}
    with clocks([*points, *graph_points(graph)], into):
        for index in range(warmup + rounds):
            for recover in (True, False) if index % 2 else (False, True):
                into.clear()
                wall = run_turn(graph, saver, recover=recover, check=index == 0)
                if index >= warmup:
                    seen[recover].append({**into, "turn": wall})
    labels = ["turn", *dict.fromkeys(label for _, _, label in points)]
    labels += ["branches", "tally reducer"]
    rows = []
    for label in labels:
        recovered, clean = (
            statistics.median(turn.get(label, 0.0) for turn in seen[kind]) * 1e6
            for kind in (True, False)
        )
        rows.append({"piece": label, "recovery_us": recovered, "clean_us": clean})
    return {"rounds": rounds, "rows": rows}


def print_in_situ(found: dict[str, Any]) -> None:
    if "skipped" in found:
        print(f"\nIn situ: skipped ({found['skipped']})")
        return
    print(
        f"\nWhere add_resilience's recovery goes, timed in situ (InMemorySaver,\n"
        f"{found['rounds']} interleaved pairs; wall us per turn, medians). The pieces\n"
        "nest: our tools node > our step > ToolNode > the interception > the tool,\n"
        "except the retry, which the step runs outside ToolNode, through the executor\n"
        "ToolNode gave the call's first attempt."
    )
    print(f"{'piece':<18} {'503 turn':>9} {'clean':>9} {'extra':>9}")
    for row in found["rows"]:
        extra = row["recovery_us"] - row["clean_us"]
        print(
            f"{row['piece']:<18} {row['recovery_us']:>9.1f} {row['clean_us']:>9.1f} {extra:>9.1f}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run")
    parser.add_argument("--dsn", default=None, help=f"Postgres DSN (default {DEFAULT_DSN})")
    parser.add_argument("--json", default=None, help="write the results to this file")
    parser.add_argument("--no-memory", action="store_true", help="skip the InMemorySaver run")
    parser.add_argument(
        "--profile", action="store_true", help="also time a recovery's pieces in situ"
    )
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    results: list[dict[str, Any]] = []
    dsn = args.dsn or DEFAULT_DSN
    reason = probe_postgres(dsn)
    if reason is not None and args.dsn is not None:
        print(f"error: cannot reach {dsn}: {reason}", file=sys.stderr)
        return 2
    if reason is None:
        with postgres_saver(dsn) as saver:
            results.append(bench("PostgresSaver", saver, sizes))
        print_summary(results[-1])
    else:
        print(f"PostgresSaver skipped: {reason}")
    if not args.no_memory:
        results.append(bench("InMemorySaver", InMemorySaver(), sizes))
        print_summary(results[-1])
    if args.profile:
        found = in_situ(2 * sizes.rounds)
        print_in_situ(found)
        results.append({"in_situ": found})
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
