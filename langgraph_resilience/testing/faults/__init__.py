"""Seeded fault injection for any set of tools: the chaos harness behind ``bench``.

A `FaultPlan` says *what* goes wrong (a fault kind from `FAULT_KINDS`) and
*when* (a schedule: `Single`, `Persistent`, `Intermittent` with probability p,
`Burst` of k consecutive calls), optionally only for some tools. `inject` wraps
tools in `ChaosTool`s that apply the plan::

    plan = FaultPlan.of(
        intermittent(("http_503", "timeout"), p=0.15),
        persistent("schema_drift", tools=("get_order",)),
        name="flaky",
    )
    tools = inject([search, get_order], plan, seed=7, clock=FakeClock())
    ...  # build and run your graph with `tools`
    print(chaos_stats(tools))  # calls, real executions, faults fired, ...

Everything is deterministic from the seed: each tool keeps its own call counter
and, per plan entry, its own ``random.Random`` seeded from ``(seed, entry,
tool)``, so the n-th call of a tool gets the same fault in every run and for
every framework under test, whatever the other tools do. (Run parallel calls of
one tool serially, e.g. ``config={"max_concurrency": 1}``, when the order of
calls *within* one tool must be reproducible too.) Time is virtual: each call
charges ``latency`` seconds, a timeout ``timeout`` seconds, to a `FakeClock`.

Fault kinds are data. A status code is one line in `FAULT_KINDS`; the
behaviours are those of `testing.Fault` (raise before executing, raise after
the effect committed, replace the output) plus four that need the real call:
truncated output, semantically wrong output (every number negated), schema
drift (a required argument is renamed and the old name is rejected from then
on) and partial success (only part of a batch is executed). Tool removal and
schema drift are permanent once they fire.

A `ChaosTool` also keeps what a benchmark needs to judge a framework from the
outside: attempts per logical call and per identical call, calls after the tool
was removed, calls while a breaker *should* be open, and recovery latency on the
virtual clock. "Should be open" is decided by a shadow breaker per tool: the
package's own pure breaker (`breaker.admit` / `breaker.record`) with the
`BreakerConfig` given to `inject`, fed with the outcomes the tool really saw. A
call it would have refused counts in ``calls_while_open``, whatever framework
made it.

The shadow counts *logical calls*, as the package's breakers do (see
`BreakerConfig`): one outcome per call when it leaves the tool, a success if any
attempt succeeded, else the failure of its last attempt; attempts that are
retried on the same tool report nothing, and a half-open probe reports at once.
A logical call is a tool-call id within the caller's *epoch* (`inject`'s
`epoch`, e.g. the agent's reply count: providers that number ids per message
reuse ``call_0`` every turn), and an attempt without an id is a call of its own.
The harness cannot see when a framework gives up on a call, so it takes the
first evidence that the call has left its tool: its id reaching another tool of
the same `inject` (a fallback), an attempt from a later epoch (the agent's next
turn) or, without an epoch, from a later LangGraph step. Before that, its
failure is not counted: a framework that keeps retrying one call within a turn
is judged by the attempt budget, not as "calls while open". The shadows are
replayed from the call log when they are read, so that evidence may come after
the attempt it decides.

The rooms: `kinds` (the fault kinds), `plan` (schedules, specs, plans), `tool`
(`ChaosTool`, `inject`), `calls` (the call log and the shadow breakers) and
`stats` (`chaos_stats`).
"""

from langgraph_resilience.testing.faults.calls import CallLog
from langgraph_resilience.testing.faults.kinds import FAULT_KINDS, FaultKind
from langgraph_resilience.testing.faults.plan import (
    FaultPlan,
    FaultSpec,
    burst,
    intermittent,
    persistent,
    single,
)
from langgraph_resilience.testing.faults.schedules import (
    Burst,
    Intermittent,
    Persistent,
    Schedule,
    Single,
)
from langgraph_resilience.testing.faults.stats import ChaosStats, chaos_stats
from langgraph_resilience.testing.faults.tool import ChaosTool, inject

__all__ = [
    "FAULT_KINDS",
    "Burst",
    "CallLog",
    "ChaosStats",
    "ChaosTool",
    "FaultKind",
    "FaultPlan",
    "FaultSpec",
    "Intermittent",
    "Persistent",
    "Schedule",
    "Single",
    "burst",
    "chaos_stats",
    "inject",
    "intermittent",
    "persistent",
    "single",
]
