"""The fault mixes: what goes wrong in a run, and what else differs from the plain setting.

A mix is data (`MIXES`): a `FaultPlan`, the failure class it exercises and the
recovery paths ``resilient`` needs to meet the targets in it, and what else
differs from the plain setting: how the scripted agent behaves
(`tasks.AgentStyle`: re-issuing a failed call under a new id, ids numbered
per message), what runs (every task, the tasks with side effects, or
conversations of many tasks on one thread), the breaker (`Mix.breaker`: the
outage mixes use `DEMO_BREAKER`, the background mix `NOISE_BREAKER`) and the
shop's status service (up, flaky, none). Run it with `run_bench`;
`check_targets` lists the behaviour targets (counts, never timings) that
``resilient`` misses, leaving out those whose paths have not landed yet
(reported as *pending*). Besides the common targets, a mix may add some of
`EXTRA_TARGETS` (`Mix.checks`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from benchmarks.chaos.contenders import DEMO_BREAKER, NOISE_BREAKER
from benchmarks.chaos.tasks import (
    SIDE_EFFECT_TOOLS,
    TASKS,
    AgentStyle,
    Task,
)
from langgraph_resilience import (
    BreakerConfig,
    ConfigurationError,
)
from langgraph_resilience.testing.faults import (
    FaultPlan,
    burst,
    intermittent,
    persistent,
    single,
)

__all__ = [
    "EXTRA_TARGETS",
    "MIXES",
    "QUICK_CONVERSATIONS",
    "QUICK_MIXES",
    "QUICK_SEEDS",
    "STATUS_DOWN",
    "Mix",
    "quick_tasks",
]


_READS = ("get_customer", "get_order", "list_orders", "check_stock", "geocode", "get_weather")
_EFFECTS = tuple(sorted(SIDE_EFFECT_TOOLS))
_TRANSIENT = (
    "http_429",
    "http_429_retry_after",
    "http_500",
    "http_502",
    "http_503",
    "http_504",
    "timeout",
    "connection_reset",
)


_PLAIN_AGENT = AgentStyle()


@dataclasses.dataclass(frozen=True, slots=True)
class Mix:
    """A named fault plan, the failure class it exercises, and what (d) needs for it."""

    name: str
    fault_class: str
    plan: FaultPlan
    description: str
    requires: frozenset[str] = frozenset()
    """Recovery paths (d) needs to *recover* here; while one is missing, the success
    targets of this mix are pending rather than missed."""
    dedup_requires: frozenset[str] = frozenset()
    """Recovery paths (d) needs for zero duplicate side effects here. Empty when every
    fault fires before the tool runs: then any duplicate is a bug."""
    detect_requires: frozenset[str] | None = None
    """For a permanent fault: the paths (d) needs to make no call to the broken tool after
    detecting it (the 'no calls after detection' target); None: not applicable."""
    agent: AgentStyle = _PLAIN_AGENT
    """How the scripted agent behaves here (re-issues, id style); the default follows
    each step's ``on_error`` alone, with ids unique on the thread."""
    suite: Literal["tasks", "effects", "conversations"] = "tasks"
    """What runs: every task, the tasks with side effects, or the conversations (many
    tasks on one thread)."""
    breaker: BreakerConfig | None = None
    """The breaker of (d) and of the shadow breakers here (None: `RESILIENT_BREAKER`)."""
    status: Literal["up", "flaky", "none"] = "up"
    """The shop's status service (``ToolProfile.status_check``): up; down for
    `STATUS_DOWN` of the queries at random (503), so a lost answer sometimes cannot be
    reconciled at once; or none at all (nothing can tell whether a lost effect happened,
    as on AgentDojo)."""
    baseline: str = "clean"
    """The fault-free mix this one is compared with (``x clean`` ratios)."""
    checks: frozenset[str] = frozenset()
    """Extra targets of this mix, from `EXTRA_TARGETS`."""
    twin: str | None = None
    """A mix that differs from this one in the agent's id style alone: ids must not
    change what (d) achieves (the ``same_as_twin`` target)."""

    @property
    def detection(self) -> bool:
        """Whether the permanent-fault targets apply."""
        return self.detect_requires is not None

    @property
    def seeded(self) -> bool:
        """Whether anything here is random: else one seed says it all."""
        return bool(self.plan.specs) or self.status == "flaky"


def _mix(
    name: str,
    fault_class: str,
    description: str,
    *specs: Any,
    requires: Iterable[str] = (),
    dedup_requires: Iterable[str] = (),
    detect_requires: Iterable[str] | None = None,
    **options: Any,
) -> Mix:
    checks = frozenset(options.pop("checks", ()))
    unknown = checks - set(EXTRA_TARGETS)
    if unknown:
        raise ConfigurationError(f"unknown targets {sorted(unknown)}; see EXTRA_TARGETS")
    return Mix(
        name,
        fault_class,
        FaultPlan(tuple(specs), name),
        description,
        frozenset(requires),
        frozenset(dedup_requires),
        None if detect_requires is None else frozenset(detect_requires),
        checks=checks,
        **options,
    )


EXTRA_TARGETS: Mapping[str, str] = {
    "hazard": "the mix is a hazard: (a) ToolNode makes duplicates, or calls while open",
    "breaker_opens": "(d)'s own breaker opens on the outage",
    "answered": "(d) answers every tool call the agent made",
    "same_as_twin": "(d) does as well as in the twin mix (ids alone differ)",
    "all_succeed": "(d) completes every conversation (every turn right, one thread)",
    "not_diverted": "every call (d)'s agent made ran on the tool it asked for",
    "breakers_closed": "(d)'s breakers never open, and it makes no call while one should be",
    "best_success": "(d)'s success (and per-turn success) >= every other contender's",
}
"""The targets a mix may add to the common ones (`Mix.checks`), by name."""

STATUS_DOWN = 0.5
"""In a ``flaky`` status mix, the share of status queries answered 503."""

_LOST = "side-effecting calls time out after committing, p=0.2"


MIXES: Mapping[str, Mix] = {
    m.name: m
    for m in (
        _mix("clean", "none", "no faults"),
        _mix(
            "transient",
            "transient",
            "every call fails with p=0.15, kind drawn from 429 (+/- Retry-After), 500, 502, "
            "503, 504, timeout, connection reset",
            intermittent(_TRANSIENT, p=0.15),
            requires=("idempotency",),  # only for side-effecting tasks, see the targets
        ),
        _mix(
            "rate_limit",
            "transient",
            "bursts of 2 x 429 with Retry-After: 2 (onset p=0.1 per call)",
            burst("http_429_retry_after", length=2, start=None, p=0.1),
        ),
        _mix(
            "server_errors",
            "transient",
            "500/502/503/504 with p=0.15 per call",
            intermittent(("http_500", "http_502", "http_503", "http_504"), p=0.15),
            requires=("idempotency",),
        ),
        _mix(
            "timeouts",
            "transient",
            "timeout before executing, p=0.15 per call",
            intermittent("timeout", p=0.15),
            requires=("idempotency",),
        ),
        _mix(
            "connection_reset",
            "transient",
            "connection reset before executing, p=0.15 per call",
            intermittent("connection_reset", p=0.15),
            requires=("idempotency",),
        ),
        _mix(
            "burst_503",
            "transient",
            "the first 3 calls of every tool get 503",
            burst("http_503", length=3, start=0),
            requires=("idempotency",),
        ),
        _mix(
            "outage",
            "transient",
            "get_weather answers 503 from its first call on (an outage); demo-sized breaker",
            persistent("http_503", tools=("get_weather",)),
            requires=("replan",),
            detect_requires=("breaker",),
            breaker=DEMO_BREAKER,
            checks=("hazard", "breaker_opens"),
        ),
        _mix(
            "timeout_after_commit",
            "unknown",
            "side-effecting calls time out after committing, p=0.2",
            intermittent("timeout_after_commit", p=0.2, tools=_EFFECTS),
            requires=("idempotency",),
            dedup_requires=("idempotency",),
        ),
        _mix(
            "bad_request",
            "semantic",
            "the first call of every read tool gets 400",
            single("http_400", tools=_READS),
        ),
        _mix(
            "auth",
            "policy",
            "the first call of every tool gets 401 or 403",
            single(("http_401", "http_403")),
            requires=("escalation",),
        ),
        _mix(
            "not_found",
            "structural",
            "the first call of every read tool gets 404",
            single("http_404", tools=_READS),
            requires=("replan",),
        ),
        _mix(
            "malformed",
            "semantic",
            "truncated JSON output, p=0.1 per call",
            intermittent("malformed_output", p=0.1),
            requires=("idempotency",),
        ),
        _mix(
            "wrong_output",
            "semantic",
            "every number in the output negated, p=0.1 per call",
            intermittent("wrong_output", p=0.1),
            requires=("idempotency",),
        ),
        _mix(
            "schema_drift",
            "semantic",
            "get_order, create_order and get_weather rename their first argument (x -> x_v2)",
            persistent("schema_drift", tools=("get_order", "create_order", "get_weather")),
        ),
        _mix(
            "tool_removed",
            "structural",
            "geocode answers 404 'unknown tool' from its second call on; demo-sized breaker",
            persistent("tool_removed", start=1, tools=("geocode",)),
            requires=("replan",),
            detect_requires=("breaker",),
            breaker=DEMO_BREAKER,
            checks=("hazard",),
        ),
        _mix(
            "partial",
            "partial",
            "send_bulk_email sends only the first half of its recipients, first call",
            single("partial_success", tools=("send_bulk_email",)),
            requires=("partial",),
            dedup_requires=("partial",),
        ),
        _mix(
            "reissue",
            "unknown",
            f"{_LOST}; the agent re-issues a failed call once under a new id; the status "
            f"service answers 503 to {STATUS_DOWN:.0%} of queries",
            intermittent("timeout_after_commit", p=0.2, tools=_EFFECTS),
            requires=("idempotency",),
            dedup_requires=("idempotency",),
            agent=AgentStyle(reissue=True),
            suite="effects",
            status="flaky",
            checks=("hazard",),
        ),
        _mix(
            "per_message_ids",
            "unknown",
            "as reissue, with ids numbered per message (call_0, call_1 in every assistant message)",
            intermittent("timeout_after_commit", p=0.2, tools=_EFFECTS),
            requires=("idempotency",),
            dedup_requires=("idempotency",),
            agent=AgentStyle(reissue=True, ids="per_message"),
            suite="effects",
            status="flaky",
            checks=("hazard", "answered", "same_as_twin"),
            twin="reissue",
        ),
        _mix(
            "conversation",
            "none",
            "no faults; each conversation's tasks on ONE thread, one human message each, "
            "identical calls repeated across turns (one has 100+ tool calls)",
            suite="conversations",
            checks=("all_succeed", "not_diverted"),
        ),
        _mix(
            "background",
            "transient",
            "the conversations under independent faults at p=0.15 per attempt on every tool: "
            "429 (Retry-After: 2), 503, httpx.ConnectTimeout before sending; a 6-call breaker",
            intermittent(("http_429_retry_after", "http_503", "connect_timeout"), p=0.15),
            requires=("idempotency",),
            agent=AgentStyle(reissue=True),
            suite="conversations",
            breaker=NOISE_BREAKER,
            baseline="conversation",
            checks=("breakers_closed", "best_success"),
        ),
    )
}
"""Every mix, by name. Add a mix by adding an entry."""

QUICK_MIXES: tuple[str, ...] = (
    "clean",
    "transient",
    "schema_drift",
    "timeout_after_commit",
    "reissue",
    "per_message_ids",
    "conversation",
    "background",
)
"""What ``bench --quick`` runs: the issue's transient target, a repair path, the
lost-response hazard with an agent that re-issues (ids unique and per message), and
conversations of many tasks on one thread, clean and under background faults."""

QUICK_SEEDS = 2

QUICK_CONVERSATIONS: tuple[str, ...] = ("conv-shift",)
"""The conversations ``--quick`` runs: the long one (over 100 tool calls, the same
lookups in up to 7 turns, one email asked for twice)."""


def quick_tasks() -> tuple[Task, ...]:
    """The ``--quick`` suite: every 10-step task (the transient target's) and the first
    task of every other family."""
    kept: list[Task] = []
    families: set[str] = set()
    for task in TASKS:
        if task.calls == 10 or task.family not in families:
            kept.append(task)
        families.add(task.family)
    return tuple(kept)
