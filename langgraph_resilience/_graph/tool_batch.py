"""Which calls a tools step runs: the batch, chosen before anything executes.

Per super-step the tools node runs only the calls of the latest `AIMessage` that
are new or whose retry is due, so a succeeding sibling never runs twice. A new
call passes the loop guard and the thread's memory of gone tools first; a call
that a budget stops, that names an unknown tool, or whose id is missing or
shared, is answered without running (a `Preflight`). Pure over the state and the
`ToolSettings`, except for the breaker reads behind `ToolSettings.breaker_open`.
"""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from langchain_core.messages import AIMessage, ToolCall, ToolMessage
from langchain_core.tools import BaseTool

from langgraph_resilience._graph.answers import (
    budget_error,
    call_id_error,
    invalid_call_error,
    last_error,
    loop_error,
)
from langgraph_resilience._graph.state import (
    PLAN_CALL_PREFIX,
    CallRecord,
    Tally,
    TaskTally,
    call_slot,
    current_task,
    last_ai_message,
    message_slot,
    read_messages,
    read_tally,
    task_view,
)
from langgraph_resilience.core.canonical import call_key
from langgraph_resilience.core.classification import Rule, classify, unknown_tool_error
from langgraph_resilience.core.clock import Clock
from langgraph_resilience.core.decision import remembered_gone
from langgraph_resilience.core.loops import detect_loop
from langgraph_resilience.core.policy import ResiliencePolicy
from langgraph_resilience.core.profile import ToolProfile
from langgraph_resilience.errors import ExhaustionReason, ToolError, ToolGoneError

__all__ = ["Batch", "Preflight", "ToolSettings", "plan_batch", "step_input", "tool_attempts"]

_DUE_TOLERANCE = 1e-3
"""Seconds of clock skew within which a scheduled retry counts as due."""


@dataclasses.dataclass(frozen=True, slots=True)
class ToolSettings:
    """What the tools step knows of its graph: policy, profiles, tools, and the three
    reads and writes of shared state it makes (breakers, the retry budget)."""

    policy: ResiliencePolicy
    profiles: Mapping[str, ToolProfile]
    rules: tuple[Rule, ...]
    tools: Mapping[str, BaseTool]
    clock: Clock
    rng: random.Random
    messages_key: str
    can_repair: bool
    can_replan: bool
    can_escalate: bool
    breaker_open: Callable[[str], bool]
    """Whether a tool's breaker is open now."""
    deposit: Callable[[str, float], None]
    """A first attempt earns retry tokens in the shared retry budget."""
    withdraw: Callable[[str, float], bool]
    """May this call retry? False when the shared retry budget is empty."""
    server_of: Callable[[str], str | None] = lambda tool: None
    """The MCP server serving a tool, or None (not an MCP tool)."""
    last_step: bool = False
    """The graph ends after this step (`create_agent`'s turn whose calls all return
    directly, or that holds its structured response): nothing comes back for a waiting
    call, so the step runs each retry and fallback itself, whatever the wait (repair,
    replan and a human are off)."""

    def max_attempts(self, tool: str) -> int:
        """The tool's `max_attempts`: its profile's, else the policy's."""
        profile = self.profiles.get(tool)
        if profile is not None and profile.max_attempts is not None:
            return profile.max_attempts
        return self.policy.max_attempts

    def loop_threshold(self, tool: str) -> int:
        """The tool's loop threshold: its profile's, else the policy's."""
        profile = self.profiles.get(tool)
        if profile is not None and profile.loop_threshold is not None:
            return profile.loop_threshold
        return self.policy.loop_threshold

    def fallbacks(
        self, primary: str, tried: Sequence[str], gone: Mapping[str, float], now: float
    ) -> list[str]:
        """`primary`'s fallbacks still worth a call: not tried for this call, breaker
        not open, not remembered as gone in this thread."""
        chain = self.profiles.get(primary)
        if chain is None:
            return []
        memory = self.policy.structural_memory_s
        return [
            name
            for name in chain.fallbacks
            if name not in tried
            and name in self.tools
            and remembered_gone(gone, name, now=now, memory=memory) is None
            and not self.breaker_open(name)
        ]


@dataclasses.dataclass(slots=True)
class Preflight:
    """A call answered without running: unknown tool, loop, spent budget, bad JSON."""

    error: ToolError
    exhausted: ExhaustionReason | None = None
    key: str = ""
    repairable: bool = False
    """Arguments that are not JSON: reflection repair may still produce a valid call."""
    slot: str = ""
    """The call's slot in the tally."""
    args: dict[str, Any] | None = None
    """The arguments the call asked for (None: they did not parse), shown to a human."""


@dataclasses.dataclass(slots=True)
class Batch:
    """One super-step of the tools node: what runs (with the arguments in force), what
    is answered without running, and the loop-guard bookkeeping."""

    ai_index: int
    ai: AIMessage
    now: float
    task: TaskTally
    """The current task's view of the tally (a fresh one when this turn starts it)."""
    runnable: list[ToolCall] = dataclasses.field(default_factory=list)
    preflight: list[Preflight] = dataclasses.field(default_factory=list)
    keys: dict[str, str] = dataclasses.field(default_factory=dict)
    slots: dict[str, str] = dataclasses.field(default_factory=dict)
    """Call id -> slot, for the calls that run."""
    loop_keys: dict[str, str] = dataclasses.field(default_factory=dict)
    """Call id -> the key the loop guard counted, for calls the agent issued now."""
    rerouted: dict[str, tuple[str, dict[str, Any]]] = dataclasses.field(default_factory=dict)
    """Calls sent straight to a fallback: call id -> (the remembered-gone tool, its args)."""
    item_keys: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    """Redone batch calls: the item keys of their first run."""
    spent: set[str] = dataclasses.field(default_factory=set)
    approved: set[str] = dataclasses.field(default_factory=set)
    informed: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """The tally's unknown effects the agent was told of, by key -> task."""
    held: Mapping[str, int] = dataclasses.field(default_factory=dict)
    """The side effects done that the thread holds, by call key -> how many."""
    seen: dict[str, int] = dataclasses.field(default_factory=dict)
    recent: list[str] = dataclasses.field(default_factory=list)
    owns: frozenset[str] | None = None
    """The slots this step finishes; None: every call of the turn. A step of one call
    (`only`) leaves its siblings to their own steps."""

    def only(self, call_id: str) -> Batch:
        """This batch cut down to one call: the step `create_agent` gives each tool call
        (its own task). Siblings plan the same batch, each up to itself (`plan_batch`
        with `upto`), so budgets and loop counts agree;
        each step reports only its own call's share of them."""
        position = next(
            (i for i, call in enumerate(self.ai.tool_calls) if call["id"] == call_id), None
        )
        slot = self.slots.get(call_id) or (
            call_slot(self.ai, self.ai_index, position) if position is not None else call_id
        )
        key = self.loop_keys.get(call_id)
        mine = {call_id}
        return dataclasses.replace(
            self,
            runnable=[call for call in self.runnable if call["id"] == call_id],
            preflight=[item for item in self.preflight if item.slot == slot],
            keys=_kept(self.keys, mine),
            slots=_kept(self.slots, mine),
            loop_keys=_kept(self.loop_keys, mine),
            rerouted=_kept(self.rerouted, mine),
            item_keys=_kept(self.item_keys, mine),
            spent=self.spent & mine,
            approved=self.approved & mine,
            seen={key: 1} if key is not None else {},
            recent=[key] if key is not None else [],
            owns=frozenset({slot}),
        )

    def told_before(self) -> frozenset[str]:
        """Unknown effects the agent was told of in an earlier task."""
        task = self.task.get("id", "")
        return frozenset(key for key, told in self.informed.items() if told != task)

    def told_now(self) -> frozenset[str]:
        """Unknown effects the agent was told of in this task: a re-issue of one of them
        is the agent asking again, answered from its outcome once that is known."""
        task = self.task.get("id", "")
        return frozenset(key for key, told in self.informed.items() if told == task)


def _kept(mapping: Mapping[str, Any], ids: set[str]) -> dict[str, Any]:
    return {call_id: value for call_id, value in mapping.items() if call_id in ids}


def tool_attempts(record: CallRecord) -> int:
    """Executions of the call by the tool serving it now: a fallback gets its own
    `max_attempts` and backoff, counted from when it took over."""
    return record["attempts"] - record.get("fallback_at", 0)


def plan_batch(cfg: ToolSettings, state: Any, *, upto: str | None = None) -> Batch | None:
    """The calls of the latest AIMessage this step runs, and those it answers at once.

    With `upto` (a call id), planning stops after that call: a call's plan depends on
    the siblings before it (budgets, loop counts), never on those after, so a step of
    one call (`Batch.only`) need not plan the rest of its message.
    """
    messages = read_messages(state, cfg.messages_key)
    found = last_ai_message(messages)
    if found is None:
        return None
    ai_index, ai = found
    tally = read_tally(state)
    calls = tally.get("calls") or {}
    gone = tally.get("gone") or {}
    task = task_view(tally, current_task(messages))
    batch = Batch(
        ai_index,
        ai,
        cfg.clock.time(),
        task,
        informed=tally.get("informed") or {},
        held=tally.get("held") or {},
    )
    answered = {m.tool_call_id for m in messages[ai_index + 1 :] if isinstance(m, ToolMessage)}
    repaired = _invalid_calls(cfg, batch, answered, calls)
    budget = [cfg.policy.max_tool_attempts - int(task.get("tool_attempts") or 0)]
    prefix = message_slot(ai, ai_index)
    valid = [(f"{prefix}:{i}", call) for i, call in enumerate(ai.tool_calls)]
    reused = _reused_ids(ai.tool_calls)
    for slot, call in [*valid, *repaired]:
        call_id = call["id"] or ""
        if call_id in answered:
            pass
        elif not call_id or call_id in reused:  # ToolMessages could not tell them apart
            count = reused.get(call_id, 0)
            error = call_id_error(call, count)
            batch.preflight.append(Preflight(error, slot=slot, args=call["args"]))
        else:
            _consider(cfg, batch, tally, slot, call, calls=calls, gone=gone, budget=budget)
        if upto is not None and call_id == upto and call_id not in reused:
            break
    return batch


def _reused_ids(calls: list[ToolCall]) -> Mapping[str | None, int]:
    """The tool-call ids a message uses more than once, with their counts (a provider
    may reuse one within a message); usually none."""
    if len({call["id"] for call in calls}) == len(calls):
        return {}
    counts = Counter(call["id"] for call in calls)
    return {call_id: n for call_id, n in counts.items() if n > 1}


def _consider(
    cfg: ToolSettings,
    batch: Batch,
    tally: Tally,
    slot: str,
    call: ToolCall,
    *,
    calls: Mapping[str, CallRecord],
    gone: Mapping[str, float],
    budget: list[int],
) -> None:
    """Run one call this step, answer it without running, or leave it (not due yet)."""
    record = calls.get(slot)
    if record is not None and (
        record["status"] != "scheduled" or (record["due"] or 0.0) > batch.now + _DUE_TOLERANCE
    ):
        return
    call_id = call["id"] or ""
    # a fallback serves the call under its original id
    name = (record.get("served_by") if record is not None else None) or call["name"]
    if name not in cfg.tools:
        error = unknown_tool_error(name, list(cfg.tools), call_id=call_id)
        batch.preflight.append(Preflight(error, slot=slot, args=call["args"]))
        return
    args = dict(record["args"]) if record is not None and "args" in record else call["args"]
    key = call_key(name, args, noise_fields=cfg.policy.noise_fields)
    if record is None:  # a call issued now, not a retry of one in the tally
        admitted = _admit(cfg, batch, call, key, slot, gone=gone)
        if admitted is None:
            return
        name, args, key = admitted
    # a human's retry or edit buys one more execution, past the task's budget too
    vouched = bool(record is not None and record.get("approved"))
    exhausted = _exhausted(cfg, batch, tally, budget[0], vouched=vouched)
    if exhausted is not None:
        error = last_error(record) or budget_error(call, exhausted)
        batch.preflight.append(Preflight(error, exhausted, key, slot=slot, args=args))
        return
    budget[0] -= 1
    _to_run(cfg, batch, slot, {**call, "name": name, "args": args}, key=key, record=record)


def _to_run(
    cfg: ToolSettings,
    batch: Batch,
    slot: str,
    call: ToolCall,
    *,
    key: str,
    record: CallRecord | None,
) -> None:
    """Add a call to the step's runnable calls, with what its run must know."""
    call_id = call["id"] or ""
    if record is not None:
        if record.get("item_keys"):
            batch.item_keys[call_id] = list(record["item_keys"])
        if tool_attempts(record) >= cfg.max_attempts(call["name"]):
            batch.spent.add(call_id)
        if record.get("approved"):
            batch.approved.add(call_id)
    batch.keys[call_id] = key
    batch.slots[call_id] = slot
    batch.runnable.append(call)


def _invalid_calls(
    cfg: ToolSettings, batch: Batch, answered: set[str], calls: Mapping[str, CallRecord]
) -> list[tuple[str, ToolCall]]:
    """Unparseable calls: new ones are answered (or sent to repair) in preflight;
    those a repair already fixed come back as ordinary calls (with their slots)."""
    repaired: list[tuple[str, ToolCall]] = []
    for position, invalid in enumerate(batch.ai.invalid_tool_calls):
        call_id = invalid.get("id")
        if not call_id or call_id in answered:
            continue
        slot = call_slot(batch.ai, batch.ai_index, position, invalid=True)
        if slot in calls:
            name = invalid.get("name") or ""
            repaired.append((slot, ToolCall(name=name, args={}, id=call_id, type="tool_call")))
            continue
        repairable = invalid.get("name") in cfg.tools
        error = invalid_call_error(invalid)
        batch.preflight.append(Preflight(error, repairable=repairable, slot=slot))
    return repaired


def _admit(
    cfg: ToolSettings,
    batch: Batch,
    call: ToolCall,
    key: str,
    slot: str,
    *,
    gone: Mapping[str, float],
) -> tuple[str, dict[str, Any], str] | None:
    """A new call passes the loop guard (the agent's calls only: plan steps are
    verified instead) and the thread's memory of gone tools: the tool, arguments
    and key to run, or None when it is answered without running."""
    if not (call["id"] or "").startswith(PLAN_CALL_PREFIX) and _is_loop(
        cfg, batch, call, key, slot
    ):
        return None
    if call["name"] not in gone:
        return call["name"], call["args"], key
    routed = _avoid_gone(cfg, batch, call, slot, gone)
    if routed is None:
        return None
    name, args = routed
    return name, args, call_key(name, args, noise_fields=cfg.policy.noise_fields)


def _is_loop(cfg: ToolSettings, batch: Batch, call: ToolCall, key: str, slot: str) -> bool:
    """Count a call the agent issues now; answer it with a loop envelope if it closes one."""
    failed = batch.task.get("failed") or {}
    count = (batch.task.get("seen") or {}).get(key, 0) + batch.seen.get(key, 0)
    failures = int(failed.get(key, 0))
    mine = batch.recent
    # the alternating pattern reads the last three issued keys only
    recent = mine[-3:] if len(mine) >= 3 else [*(batch.task.get("recent") or [])[-3:], *mine]
    loop = detect_loop(
        key,
        count=count,
        recent=recent,
        threshold=cfg.loop_threshold(call["name"]),
        failures=failures,
        failed=failed,
        changed=count > 0 and _written_since(cfg, [*(batch.task.get("recent") or []), *mine], key),
        is_write=lambda seen: _is_write(cfg, seen),
    )
    batch.seen[key] = batch.seen.get(key, 0) + 1
    mine.append(key)
    batch.loop_keys[call["id"] or ""] = key
    if loop is None:
        return False
    total = count + 1 + failures
    error = loop_error(call, key, loop, total)
    batch.preflight.append(Preflight(error, "loop", key, slot=slot, args=call["args"]))
    return True


def _is_write(cfg: ToolSettings, key: str) -> bool:
    """Whether a call key's tool is a side effect."""
    profile = cfg.profiles.get(key.rpartition(":")[0])
    return profile is not None and profile.side_effect


def _written_since(cfg: ToolSettings, recent: Sequence[str], key: str) -> bool:
    """Whether `key` is a read and a side effect was issued after its last identical
    call among the `recent` issued keys (or at all among them, once it fell out)."""
    if _is_write(cfg, key):
        return False
    last = max((i for i, seen in enumerate(recent) if seen == key), default=-1)
    return any(_is_write(cfg, seen) for seen in recent[last + 1 :])


def _avoid_gone(
    cfg: ToolSettings, batch: Batch, call: ToolCall, slot: str, gone: Mapping[str, float]
) -> tuple[str, dict[str, Any]] | None:
    """A new call to a tool this thread saw answer STRUCTURAL: send it straight to a
    fallback (the tool and arguments to run), else answer it as STRUCTURAL (None).
    Once the memory has lapsed, the tool itself runs again."""
    name, args = call["name"], call["args"]
    at = remembered_gone(gone, name, now=batch.now, memory=cfg.policy.structural_memory_s)
    if at is None:
        return name, args
    call_id = call["id"] or ""
    candidates = cfg.fallbacks(name, [name], gone, batch.now)
    if candidates:
        fallback = candidates[0]
        profile = cfg.profiles[name]
        routed = profile.fallback_args(fallback, dict(args)) if profile.fallback_args else args
        batch.rerouted[call_id] = (name, dict(args))
        return fallback, dict(routed)
    error = classify(
        ToolGoneError(name, batch.now - at),
        tool=name,
        profile=cfg.profiles.get(name),
        call_id=call_id,
        rules=cfg.rules,
    )
    batch.preflight.append(Preflight(error, slot=slot, args=args))
    return None


def _exhausted(
    cfg: ToolSettings, batch: Batch, tally: Tally, budget_left: int, *, vouched: bool = False
) -> ExhaustionReason | None:
    """The task budget (or the thread's lifetime cap) that stops a call from running. A
    call a human let run again (`vouched`) passes the task's budget, not the thread's
    cap: an operator's ceiling on what one thread may cost."""
    started_at = batch.task.get("started_at")
    deadline = cfg.policy.deadline_s
    past = deadline is not None and started_at is not None and batch.now - started_at >= deadline
    if past and not vouched:
        return "deadline"
    if budget_left <= 0 and not vouched:
        return "max_tool_attempts"
    lifetime = cfg.policy.max_thread_tool_attempts
    if lifetime is not None and int(tally.get("tool_attempts") or 0) + len(batch.runnable) >= (
        lifetime
    ):
        return "max_thread_tool_attempts"
    return None


def step_input(cfg: ToolSettings, state: Any, batch: Batch) -> dict[str, Any]:
    """ToolNode's input: the history up to the AIMessage, which holds only the due calls.
    The state itself when it is that already (the AIMessage is the latest message and
    all its calls run as issued): a clean step copies neither the history nor the
    message."""
    messages = read_messages(state, cfg.messages_key)
    if (
        isinstance(state, dict)
        and batch.ai_index == len(messages) - 1
        and batch.runnable == batch.ai.tool_calls
    ):
        return state
    history = messages[: batch.ai_index]
    only_due = batch.ai.model_copy(update={"tool_calls": batch.runnable})
    base = dict(state) if isinstance(state, Mapping) else {}
    return {**base, cfg.messages_key: [*history, only_due]}
