"""A side effect runs only once the step that asked for it is saved: LangGraph's default
durability saves the model's step while the tools step runs, and an effect that landed
before that save would, after a crash, be asked for again by a model that never saw it.
``durability="exit"`` is refused before anything runs; a save that never comes stops the
run with the effect not run and its claim released."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, HumanMessage, ToolCall, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool
from langgraph.checkpoint.base import (
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    empty_checkpoint,
)
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph

from langgraph_resilience import (
    ConfigurationError,
    InMemoryIdempotencyStore,
    ResilienceMiddleware,
    StepNotSavedError,
    ToolProfile,
)
from langgraph_resilience.graph import saved_step, seen_saves
from langgraph_resilience.graph.saved_step import SavedStep, step_to_save
from langgraph_resilience.stores.saga import InMemorySagaLog
from langgraph_resilience.testing import FakeClock, ScriptedChatModel, text, tool_calls
from tests.conftest import build_graph


class DiskSaver(InMemorySaver):
    """A checkpointer that stands for one outliving the process (a subclass is not the
    plain in-process `InMemorySaver`), whose save of the model's step (step 1) can be
    held until the effect's wait has begun (`hold`), or until the test releases it
    (`late`); `waits` lists the tools whose wait it served."""

    def __init__(self, *, hold: bool = False, late: bool = False) -> None:
        super().__init__()
        self.hold, self.late = hold, late
        self.wait_began = threading.Event()
        self.waits: list[str] = []
        self.released = threading.Event()
        self.order: list[str] = []
        self.step_reads = 0

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: Any,
    ) -> RunnableConfig:
        if metadata.get("step") == 1:
            if self.late:
                self.released.wait(10)
            if self.hold:
                self.wait_began.wait(10)
            saved = super().put(config, checkpoint, metadata, new_versions)
            self.order.append("saved")
            return saved
        return super().put(config, checkpoint, metadata, new_versions)

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: Any,
    ) -> RunnableConfig:
        if metadata.get("step") == 1 and self.hold:
            await asyncio.to_thread(self.wait_began.wait, 10)
        if metadata.get("step") == 1 and self.late:
            await asyncio.to_thread(self.released.wait, 10)
        return self.put(config, checkpoint, metadata, new_versions)

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        found = super().get_tuple(config)
        if config["configurable"].get("checkpoint_id"):
            self.step_reads += 1
        return found

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return self.get_tuple(config)


@pytest.fixture(autouse=True)
def _told_of_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each effect's wait tells its `DiskSaver` it has begun."""
    until_saved = saved_step._until_saved

    def told(step: Any, tool: str) -> Any:
        if isinstance(step.checkpointer, DiskSaver):
            step.checkpointer.waits.append(tool)
            step.checkpointer.wait_began.set()
        return until_saved(step, tool)

    monkeypatch.setattr(saved_step, "_until_saved", told)


def _run(app: Any, inp: Any, config: Any, mode: str, **kwargs: Any) -> Any:
    if mode == "sync":
        return app.invoke(inp, config, **kwargs)
    return asyncio.run(app.ainvoke(inp, config, **kwargs))


def _payments_graph(
    saver: DiskSaver,
    payments: list[str],
    order: list[str] | None = None,
    *,
    turns: int = 1,
    resumed: bool = False,
    **compile_kwargs: Any,
) -> Any:
    """A graph paying 5 (then 6, ...) over `turns` turns; `resumed`: its model only
    answers, for a run that resumes at the tools step."""
    script = [
        r for n in range(turns) for r in (tool_calls(("pay", {"amount": 5 + n})), text("done"))
    ]

    @tool
    def pay(amount: int) -> str:
        """Pay."""
        payments.append(str(amount))
        if order is not None:
            order.append("paid")
        return f"paid {amount}"

    return build_graph(
        [pay],
        script[1:] if resumed else script,
        profiles={"pay": ToolProfile(side_effect=True)},
        checkpointer=saver,
        options={"idempotency": InMemoryIdempotencyStore(), "saga": InMemorySagaLog()},
        **compile_kwargs,
    ).app


@pytest.mark.parametrize("watched", [False, True])
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_the_effect_runs_after_the_model_s_step_is_saved(mode: str, watched: bool) -> None:
    """The save of the model's step is held until the effect's wait has begun: the
    payment comes after the save, never before (without the wait it would run first,
    and the held save would time out after 10 s). Also when the saver is watched from
    before the run, so the model's task's writes, saved while the step's checkpoint
    waits, were seen: they are not enough (`test_new_input_drops_writes_no_checkpoint_holds`)."""
    saver, payments = DiskSaver(hold=True), []
    if watched:
        seen_saves.watch(saver)
    app = _payments_graph(saver, payments, saver.order)

    out = _run(app, {"messages": [("user", "pay")]}, {"configurable": {"thread_id": "t"}}, mode)

    assert saver.order == ["saved", "paid"]
    assert payments == ["5"]
    assert out["messages"][-1].content == "done"


def test_new_input_drops_writes_no_checkpoint_holds() -> None:
    """Why a side effect waits for its step's own checkpoint, not for the model's task's
    writes (saved sooner, under the checkpoint before): LangGraph puts those writes back
    when the thread resumes, but new input on the thread drops them, and the model is
    asked again without the message that asked for the effect. Were an effect run on
    the writes alone and the process to die before the step's checkpoint, a user who
    writes again would get the effect planned anew, with no trace of the first."""

    class DiesBeforeTheStep(InMemorySaver):
        dead = True

        def put(
            self,
            config: RunnableConfig,
            checkpoint: Checkpoint,
            metadata: CheckpointMetadata,
            new_versions: Any,
        ) -> RunnableConfig:
            if self.dead and metadata.get("step") == 1:
                raise ConnectionError("the process died before the model's step was saved")
            return super().put(config, checkpoint, metadata, new_versions)

    asked: list[str] = []

    def model(state: MessagesState) -> dict[str, Any]:
        asked.append(f"m{len(asked)}")
        return {"messages": [AIMessage("", id=asked[-1], tool_calls=[_pay_call(asked[-1])])]}

    builder = StateGraph(MessagesState)
    builder.add_node("model", model)
    builder.add_node("tools", lambda state: {})
    builder.add_edge(START, "model")
    builder.add_edge("model", "tools")
    outcomes = []
    for then in ("resume", "new input"):
        saver, asked[:] = DiesBeforeTheStep(), []
        app = builder.compile(checkpointer=saver)
        config = {"configurable": {"thread_id": "t"}}
        with pytest.raises(ConnectionError):
            app.invoke({"messages": [("user", "pay")]}, config, durability="sync")
        [task] = app.get_state(config).tasks
        assert (task.name, bool(task.result)) == ("model", True)  # its writes were saved
        saver.dead = False
        out = app.invoke(None if then == "resume" else {"messages": [("user", "hi")]}, config)
        outcomes.append([m.id for m in out["messages"] if isinstance(m, AIMessage)])

    assert outcomes == [["m0"], ["m1"]]  # resumed: reapplied; new input: asked anew


def _pay_call(call_id: str) -> ToolCall:
    return ToolCall(name="pay", args={"amount": 5}, id=call_id, type="tool_call")


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_durability_sync_waits_for_nothing(mode: str) -> None:
    """Under durability='sync' the save came before the step: no wait, no read; under
    'async' the effect waits for its step."""
    saver, payments = DiskSaver(), []
    app = _payments_graph(saver, payments, turns=2)
    config = {"configurable": {"thread_id": "t"}}

    _run(app, {"messages": [("user", "pay")]}, config, mode, durability="sync")
    assert (saver.waits, saver.step_reads, payments) == ([], 0, ["5"])

    _run(app, {"messages": [("user", "again")]}, config, mode, durability="async")
    assert saver.waits == ["pay"]
    assert payments == ["5", "6"]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_save_that_never_comes_stops_the_run_and_releases_the_claim(
    mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The model's step is not saved in time: the run stops with StepNotSavedError,
    nothing paid; once the late save has landed, resuming pays once (the claim was
    released, so the call is not an effect of unknown outcome)."""
    monkeypatch.setattr(saved_step, "SAVE_WAIT", 0.02)
    saver, payments = DiskSaver(late=True), []
    until_saved = saved_step._until_saved

    def gives_up(step: Any, tool: str) -> Any:
        try:
            return (yield from until_saved(step, tool))
        finally:
            saver.released.set()  # the save lands only once the wait has given up

    monkeypatch.setattr(saved_step, "_until_saved", gives_up)
    app = _payments_graph(saver, payments)
    config = {"configurable": {"thread_id": "t"}}

    with pytest.raises(StepNotSavedError, match=r"'pay' was not saved within 0\.02s"):
        _run(app, {"messages": [("user", "pay")]}, config, mode)
    assert payments == []

    out = _run(app, None, config, mode, durability="sync")
    assert payments == ["5"]
    [answer] = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    assert answer.content == "paid 5"


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_durability_exit_is_refused_before_anything_runs(mode: str) -> None:
    """'exit' saves nothing until the run ends: a side effect there is refused at once,
    nothing claimed, and the same thread then runs it once under durability='sync'."""
    saver, payments = DiskSaver(), []
    app = _payments_graph(saver, payments)
    config = {"configurable": {"thread_id": "t"}}

    with pytest.raises(ConfigurationError, match=r"durability='exit'.*durability='sync'"):
        _run(app, {"messages": [("user", "pay")]}, config, mode, durability="exit")
    assert payments == []

    _run(app, None, config, mode, durability="sync")
    assert payments == ["5"]


def _refund_agent(saver: DiskSaver, refunds: list[str], *order_ids: str) -> Any:
    """create_agent + ResilienceMiddleware refunding `order_ids`, one turn each."""

    @tool
    def refund(order_id: str) -> str:
        """Refund an order."""
        refunds.append(order_id)
        return f"refunded {order_id}"

    turns = [
        r
        for order in order_ids
        for r in (tool_calls(("refund", {"order_id": order})), text("done"))
    ]
    middleware = ResilienceMiddleware(
        clock=FakeClock(),
        profiles={"refund": ToolProfile(side_effect=True)},
        idempotency=InMemoryIdempotencyStore(),
        saga=InMemorySagaLog(),
    )
    return create_agent(
        ScriptedChatModel(responses=turns), [refund], middleware=[middleware], checkpointer=saver
    )


def test_the_middleware_waits_and_refuses_alike() -> None:
    """create_agent + ResilienceMiddleware: the same wait, the same refusal."""
    refunds: list[str] = []

    held = DiskSaver(hold=True)
    held_order = held.order
    app = _refund_agent(held, refunds, "A1")
    app.invoke({"messages": [HumanMessage("refund A1")]}, {"configurable": {"thread_id": "t"}})
    assert refunds == ["A1"]
    assert held.waits == ["refund"]
    assert held_order[0] == "saved"

    config = {"configurable": {"thread_id": uuid.uuid4().hex}}
    with pytest.raises(ConfigurationError, match="durability='exit'"):
        _refund_agent(DiskSaver(), refunds, "A1").invoke(
            {"messages": [HumanMessage("refund A1")]}, config, durability="exit"
        )
    assert refunds == ["A1"]


def test_the_checkpoint_waited_for_is_the_one_of_the_tools_graph() -> None:
    """Inside a subgraph the step's checkpoint is the subgraph's (its namespace without
    the task's own segment); a plain InMemorySaver or none has nothing to wait for."""
    saver = DiskSaver()
    conf = {
        "__pregel_checkpointer": saver,
        "thread_id": "t",
        "checkpoint_ns": "sub:1|tools:2",
        "checkpoint_map": {"": "root-id", "sub:1": "sub-id"},
    }
    step = step_to_save({"configurable": conf}, "pay")
    assert step is not None
    assert step.config == {
        "configurable": {"thread_id": "t", "checkpoint_ns": "sub:1", "checkpoint_id": "sub-id"}
    }
    root = step_to_save({"configurable": {**conf, "checkpoint_ns": "tools:2"}}, "pay")
    assert root is not None
    assert root.config["configurable"]["checkpoint_id"] == "root-id"
    plain = {**conf, "__pregel_checkpointer": InMemorySaver(), "__pregel_durability": "exit"}
    assert step_to_save({"configurable": plain}, "pay") is None
    assert step_to_save({"configurable": {**conf, "__pregel_checkpointer": None}}, "pay") is None


def _checkpoint_of(thread: str) -> tuple[RunnableConfig, Any, SavedStep]:
    config: RunnableConfig = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    checkpoint = empty_checkpoint()
    at: RunnableConfig = {
        "configurable": {**config["configurable"], "checkpoint_id": checkpoint["id"]}
    }
    return config, checkpoint, at


def test_a_save_this_process_did_not_see_is_found_by_reading() -> None:
    """Saved before the saver was watched (as by another worker): the wait reads it."""
    saver = DiskSaver()
    config, checkpoint, at = _checkpoint_of(uuid.uuid4().hex)
    saver.put(config, checkpoint, {"source": "loop", "step": 0}, {})

    saved_step.wait_saved(SavedStep(saver, at), "pay")

    assert saver.step_reads >= 1


def test_no_read_while_this_process_saves_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """While the watched save runs here, the wait reads nothing: it wakes on the save,
    which is let through only after the wait has timed out three times (the waits are
    short here: a fresh checkpoint's first wait is the 1 s backstop's)."""
    monkeypatch.setattr(saved_step, "_FIRST_POLL", 1e-4)
    monkeypatch.setattr(saved_step, "_BACKSTOP", 1e-4)
    timeouts = threading.Semaphore(0)
    wait = seen_saves.Seen.wait

    def counted(self: seen_saves.Seen, timeout: float) -> bool:
        woke = wait(self, timeout)
        if not woke:
            timeouts.release()
        return woke

    monkeypatch.setattr(seen_saves.Seen, "wait", counted)
    saver = DiskSaver(late=True)
    seen_saves.watch(saver)
    config, checkpoint, at = _checkpoint_of(uuid.uuid4().hex)
    saving = threading.Thread(
        target=saver.put, args=(config, checkpoint, {"source": "loop", "step": 1}, {})
    )
    saving.start()
    while not seen_saves.seen(seen_saves.key_of(at["configurable"], checkpoint["id"])).saving:
        time.sleep(0)  # the save has begun

    def release() -> None:
        for _ in range(3):
            timeouts.acquire()
        saver.released.set()

    releaser = threading.Thread(target=release)
    releaser.start()
    saved_step.wait_saved(SavedStep(saver, at), "pay")
    saving.join(10)
    releaser.join(10)

    assert saver.released.is_set()
    assert saver.step_reads == 0


def test_a_fresh_checkpoint_saved_elsewhere_is_found_by_the_backstop_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Made after the watch, its save was expected here; saved behind the watch's back
    (as by another worker) and never loaded here, it is still found: by one backstop
    read, not a poll."""
    monkeypatch.setattr(saved_step, "_BACKSTOP", 0.01)
    saver = DiskSaver()
    seen_saves.watch(saver)
    config, checkpoint, at = _checkpoint_of(uuid.uuid4().hex)
    InMemorySaver.put(saver, config, checkpoint, {"source": "loop", "step": 1}, {})

    saved_step.wait_saved(SavedStep(saver, at), "pay")

    assert saver.step_reads == 1


def test_a_fresh_checkpoint_this_process_loaded_needs_no_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Saved by another worker after the watch, then loaded here (a re-queued run's loop
    reads the thread's latest checkpoint): the load noted it, so the wait returns at
    once. The backstop is pushed past the test, so a wait the load did not note would
    hang it, not pass."""
    monkeypatch.setattr(saved_step, "_BACKSTOP", 60.0)
    monkeypatch.setattr(saved_step, "SAVE_WAIT", 60.0)
    saver = DiskSaver()
    seen_saves.watch(saver)
    config, checkpoint, at = _checkpoint_of(uuid.uuid4().hex)
    InMemorySaver.put(saver, config, checkpoint, {"source": "loop", "step": 1}, {})
    assert saver.get_tuple(config) is not None  # the latest, as a loop loads it

    saved_step.wait_saved(SavedStep(saver, at), "pay")

    assert saver.step_reads == 0


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_run_re_queued_on_a_watched_worker_is_woken_by_its_load(
    mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Worker 1 saves the model's step and stops before the tools (a run re-queued);
    worker 2, whose saver is watched since an earlier effect, resumes it: the effect's
    wait is woken by worker 2 loading that checkpoint, with no read (the backstop is
    pushed past the test), and the payment happens once."""
    monkeypatch.setattr(saved_step, "_BACKSTOP", 60.0)
    monkeypatch.setattr(saved_step, "SAVE_WAIT", 60.0)
    first, second, payments = DiskSaver(), DiskSaver(), []
    second.storage, second.writes, second.blobs = first.storage, first.writes, first.blobs
    seen_saves.watch(second)
    worker_1 = _payments_graph(first, payments, interrupt_before=["tools"])
    config = {"configurable": {"thread_id": uuid.uuid4().hex}}
    _run(worker_1, {"messages": [("user", "pay")]}, config, mode)
    assert payments == []
    worker_2 = _payments_graph(second, payments, resumed=True)
    reads = second.step_reads

    out = _run(worker_2, None, config, mode)

    assert payments == ["5"]
    assert second.waits == ["pay"]
    assert second.step_reads == reads
    assert out["messages"][-1].content == "done"


def test_which_saves_are_waited_for_without_reading(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only a checkpoint LangGraph made after the saver was watched, and recently."""
    saver = DiskSaver()
    _, _, before = _checkpoint_of("t")
    since = seen_saves.watch(saver)
    _, checkpoint, after = _checkpoint_of("t")

    assert saved_step._noted_here(SavedStep(saver, after), since) is True
    assert saved_step._noted_here(SavedStep(saver, before), since) is False
    assert saved_step._noted_here(SavedStep(saver, after), None) is False
    made = seen_saves.created_ticks(checkpoint["id"])
    assert made is not None
    monkeypatch.setattr(saved_step, "now_ticks", lambda: made + 11 * 10_000_000)
    assert saved_step._noted_here(SavedStep(saver, after), since) is False  # 11 s old
    not_uuid6 = {"configurable": {**after["configurable"], "checkpoint_id": "custom-id"}}
    assert saved_step._noted_here(SavedStep(saver, not_uuid6), since) is False


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_in_a_real_run_the_wait_is_woken_by_the_loop_s_own_save(
    mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """LangGraph's loop saves through the watched saver under the key the wait expects:
    on the second turn (the saver watched since the first) no read is made. The backstop
    read is pushed past `SAVE_WAIT`, so a wait the save did not wake would read once and
    fail this test, not just be slower."""
    monkeypatch.setattr(saved_step, "_BACKSTOP", 60.0)
    monkeypatch.setattr(saved_step, "SAVE_WAIT", 60.0)
    saver, payments = DiskSaver(), []
    app = _payments_graph(saver, payments, turns=2)
    config = {"configurable": {"thread_id": uuid.uuid4().hex}}
    _run(app, {"messages": [("user", "pay")]}, config, mode)
    reads = saver.step_reads

    _run(app, {"messages": [("user", "again")]}, config, mode)

    assert saver.waits == ["pay", "pay"]
    assert saver.step_reads == reads
    assert payments == ["5", "6"]


def test_under_create_agent_the_wait_is_woken_by_the_loop_s_own_save(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same under create_agent + ResilienceMiddleware (each call its own task)."""
    monkeypatch.setattr(saved_step, "_BACKSTOP", 60.0)
    monkeypatch.setattr(saved_step, "SAVE_WAIT", 60.0)
    refunds: list[str] = []
    saver = DiskSaver()
    app = _refund_agent(saver, refunds, "A1", "B2")
    config = {"configurable": {"thread_id": uuid.uuid4().hex}}
    app.invoke({"messages": [HumanMessage("refund A1")]}, config)
    reads = saver.step_reads

    app.invoke({"messages": [HumanMessage("refund B2")]}, config)

    assert saver.waits == ["refund", "refund"]
    assert saver.step_reads == reads
    assert refunds == ["A1", "B2"]
