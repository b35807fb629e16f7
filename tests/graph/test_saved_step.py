"""A side effect runs only once the step that asked for it is saved: LangGraph's default
durability saves the model's step while the tools step runs, and an effect that landed
before that save would, after a crash, be asked for again by a model that never saw it.
The wait reads the checkpoint back through public API only; a save that never comes
(``durability="exit"`` saves nothing until the run ends) stops the run with the effect
not run and its claim released."""

from __future__ import annotations

import asyncio
import threading
import uuid
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, HumanMessage, ToolCall, ToolMessage
from langchain_core.runnables import RunnableConfig, RunnableLambda
from langchain_core.tools import tool
from langgraph.checkpoint.base import (
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    empty_checkpoint,
)
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.runtime import ExecutionInfo

from langgraph_resilience import ResilienceMiddleware, ToolProfile, add_resilience
from langgraph_resilience._graph import saved_step
from langgraph_resilience._graph.saved_step import SavedStep, step_to_save
from langgraph_resilience.core.flow import Sleep, adrive, drive
from langgraph_resilience.errors import StepNotSavedError
from langgraph_resilience.stores import InMemoryIdempotencyStore
from langgraph_resilience.stores.saga import InMemorySagaLog
from langgraph_resilience.testing import FakeClock, ScriptedChatModel, text, tool_calls
from tests.conftest import State, build_graph


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


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_the_effect_runs_after_the_model_s_step_is_saved(mode: str) -> None:
    """The save of the model's step is held until the effect's wait has begun: the
    payment comes after the save, never before (without the wait it would run first,
    and the held save would time out after 10 s). The model's task's writes, saved
    while the step's checkpoint waits, are not enough
    (`test_new_input_drops_writes_no_checkpoint_holds`)."""
    saver, payments = DiskSaver(hold=True), []
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
def test_durability_sync_costs_one_read(mode: str) -> None:
    """Under durability='sync' the save came before the step: one read finds it, no
    sleep; under 'async' the effect waits for its step too."""
    saver, payments = DiskSaver(), []
    app = _payments_graph(saver, payments, turns=2)
    config = {"configurable": {"thread_id": "t"}}

    _run(app, {"messages": [("user", "pay")]}, config, mode, durability="sync")
    assert (saver.waits, saver.step_reads, payments) == (["pay"], 1, ["5"])

    _run(app, {"messages": [("user", "again")]}, config, mode, durability="async")
    assert saver.waits == ["pay", "pay"]
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
def test_durability_exit_stops_the_effect_unrun(mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """'exit' saves nothing until the run ends: the side effect's step is never saved,
    so the run stops with StepNotSavedError, nothing paid, and the same thread then runs
    it once under durability='sync'."""
    monkeypatch.setattr(saved_step, "SAVE_WAIT", 0.05)
    saver, payments = DiskSaver(), []
    app = _payments_graph(saver, payments)
    config = {"configurable": {"thread_id": "t"}}

    with pytest.raises(StepNotSavedError, match="durability='exit'"):
        _run(app, {"messages": [("user", "pay")]}, config, mode, durability="exit")
    assert payments == []

    _run(app, None, config, mode, durability="sync")
    assert payments == ["5"]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_subgraph_compiled_without_checkpoints_is_told_to_inherit(
    mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A child agent compiled with checkpointer=False, run inside a node of a parent
    that saves: LangGraph hands the child's tasks the parent's saver but saves none of
    the child's steps, so no public value tells it from a late save. Its side effect
    stops unrun and the error names the fix; compiled with checkpointer=None, the child
    saves under its parent's thread and pays once."""
    monkeypatch.setattr(saved_step, "SAVE_WAIT", 0.05)
    payments: list[str] = []

    @tool
    def pay(amount: int) -> str:
        """Pay."""
        payments.append(str(amount))
        return f"paid {amount}"

    def parent(child_checkpointer: Any) -> Any:
        model = ScriptedChatModel(responses=[tool_calls(("pay", {"amount": 5})), text("done")])
        child = StateGraph(State)
        child.add_node("agent", lambda state: {"messages": [model.invoke(state["messages"])]})
        add_resilience(
            child,
            agent="agent",
            tools=[pay],
            profiles={"pay": ToolProfile(side_effect=True)},
            idempotency=InMemoryIdempotencyStore(),
            saga=InMemorySagaLog(),
        )
        agent = child.compile(checkpointer=child_checkpointer)

        def ask(state: MessagesState) -> dict[str, Any]:
            return {"messages": agent.invoke({"messages": state["messages"]})["messages"]}

        async def aask(state: MessagesState) -> dict[str, Any]:
            return {"messages": (await agent.ainvoke({"messages": state["messages"]}))["messages"]}

        graph = StateGraph(MessagesState)
        graph.add_node("ask", RunnableLambda(ask, afunc=aask))
        graph.add_edge(START, "ask")
        return graph.compile(checkpointer=DiskSaver())

    config = {"configurable": {"thread_id": "t"}}
    with pytest.raises(StepNotSavedError, match=r"checkpointer=False.*checkpointer=None"):
        _run(parent(False), {"messages": [("user", "pay")]}, config, mode)
    assert payments == []

    _run(parent(None), {"messages": [("user", "pay")]}, config, mode)
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


def test_the_middleware_waits_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    """create_agent + ResilienceMiddleware: the same wait, the same stop under 'exit'."""
    refunds: list[str] = []

    held = DiskSaver(hold=True)
    held_order = held.order
    app = _refund_agent(held, refunds, "A1")
    app.invoke({"messages": [HumanMessage("refund A1")]}, {"configurable": {"thread_id": "t"}})
    assert refunds == ["A1"]
    assert held.waits == ["refund"]
    assert held_order[0] == "saved"

    monkeypatch.setattr(saved_step, "SAVE_WAIT", 0.05)
    config = {"configurable": {"thread_id": uuid.uuid4().hex}}
    with pytest.raises(StepNotSavedError):
        _refund_agent(DiskSaver(), refunds, "A1").invoke(
            {"messages": [HumanMessage("refund A1")]}, config, durability="exit"
        )
    assert refunds == ["A1"]


class _Runtime:
    """What a tool call's runtime tells of its execution (ToolRuntime.execution_info)."""

    def __init__(self, ns: str, checkpoint_id: str = "step-id") -> None:
        self.execution_info = ExecutionInfo(
            checkpoint_id=checkpoint_id, checkpoint_ns=ns, task_id="2", thread_id="t"
        )


def test_the_checkpoint_waited_for_is_the_one_of_the_tools_graph() -> None:
    """Inside a subgraph the step's checkpoint is in the subgraph's namespace (the task's
    without its own segment); a plain InMemorySaver or none has nothing to wait for."""
    saver = DiskSaver()
    step = step_to_save(saver, _Runtime("sub:1|tools:2", "sub-id"))
    assert step is not None
    assert step.config == {
        "configurable": {"thread_id": "t", "checkpoint_ns": "sub:1", "checkpoint_id": "sub-id"}
    }
    root = step_to_save(saver, _Runtime("tools:2", "root-id"))
    assert root is not None
    assert root.config["configurable"]["checkpoint_ns"] == ""
    assert step_to_save(InMemorySaver(), _Runtime("tools:2")) is None
    assert step_to_save(None, _Runtime("tools:2")) is None
    assert step_to_save(saver, object()) is None  # no execution info: nothing to read


def test_a_checkpoint_found_once_is_not_read_again() -> None:
    """The other calls of a step (and its retries) find their checkpoint remembered."""
    saver = DiskSaver()
    config, checkpoint, at = _checkpoint_of(uuid.uuid4().hex)
    saver.put(config, checkpoint, {"source": "loop", "step": 0}, {})
    runtime = _Runtime("tools:1", checkpoint["id"])
    runtime.execution_info = runtime.execution_info.patch(thread_id=at["configurable"]["thread_id"])

    first = step_to_save(saver, runtime)
    assert first is not None
    saved_step.wait_saved(first, "pay")
    assert step_to_save(saver, runtime) is None
    assert saver.step_reads == 1


def _checkpoint_of(thread: str) -> tuple[RunnableConfig, Any, SavedStep]:
    config: RunnableConfig = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    checkpoint = empty_checkpoint()
    at: RunnableConfig = {
        "configurable": {**config["configurable"], "checkpoint_id": checkpoint["id"]}
    }
    return config, checkpoint, at


def test_a_save_made_elsewhere_is_found_by_reading() -> None:
    """Saved by another worker: the wait reads it back."""
    saver = DiskSaver()
    config, checkpoint, at = _checkpoint_of(uuid.uuid4().hex)
    saver.put(config, checkpoint, {"source": "loop", "step": 0}, {})

    saved_step.wait_saved(SavedStep(saver, at), "pay")

    assert saver.step_reads >= 1


class _CountedEvent(threading.Event):
    """A poll's end, counting the calls that wait for it."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting = 0
        self.joined = threading.Condition()

    def wait(self, timeout: float | None = None) -> bool:
        with self.joined:
            self.waiting += 1
            self.joined.notify_all()
        return super().wait(timeout)


def test_the_calls_of_a_step_share_one_poll(monkeypatch: pytest.MonkeyPatch) -> None:
    """Eight parallel calls wait for one checkpoint saved late: one of them reads it
    back, the others wait for that poll (each polling took the pool the save needs)."""
    ends: list[_CountedEvent] = []
    real = saved_step._Poll

    def poll() -> Any:
        ends.append(_CountedEvent())
        return real(done=ends[-1])

    monkeypatch.setattr(saved_step, "_Poll", poll)
    saver = DiskSaver()
    config, checkpoint, at = _checkpoint_of(uuid.uuid4().hex)
    step = SavedStep(saver, at)
    calls = [threading.Thread(target=saved_step.wait_saved, args=(step, "pay")) for _ in range(8)]
    for call in calls:
        call.start()
    assert saver.wait_began.wait(10)
    (end,) = ends
    with end.joined:
        assert end.joined.wait_for(lambda: end.waiting == len(calls) - 1, 10)  # the others
    saver.put(config, checkpoint, {"source": "loop", "step": 0}, {})
    for call in calls:
        call.join(10)

    assert not any(call.is_alive() for call in calls)
    assert saver.waits == ["pay"]  # one poll
    assert step.key in saved_step.KNOWN
    assert saved_step._POLLS == {}


def test_the_calls_of_an_async_step_share_one_poll() -> None:
    saver = DiskSaver()
    config, checkpoint, at = _checkpoint_of(uuid.uuid4().hex)
    step = SavedStep(saver, at)

    async def save_once_all_wait() -> None:
        await asyncio.sleep(0)  # after every call's first step: the first polls, the rest join
        saver.put(config, checkpoint, {"source": "loop", "step": 0}, {})

    async def main() -> None:
        await asyncio.gather(
            *(saved_step.await_saved(step, "pay") for _ in range(8)), save_once_all_wait()
        )

    asyncio.run(main())
    assert saver.waits == ["pay"]
    assert saved_step._APOLLS == {}


def test_a_poll_that_times_out_stops_every_call_of_its_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(saved_step, "SAVE_WAIT", 0.05)
    saver = DiskSaver()
    _, _, at = _checkpoint_of(uuid.uuid4().hex)
    step = SavedStep(saver, at)
    failed: list[BaseException] = []

    def call() -> None:
        try:
            saved_step.wait_saved(step, "pay")
        except StepNotSavedError as exc:
            failed.append(exc)

    calls = [threading.Thread(target=call) for _ in range(4)]
    for thread in calls:
        thread.start()
    for thread in calls:
        thread.join(10)

    assert len(failed) == 4
    assert saved_step._POLLS == {}


class _WritingSaver(DiskSaver):
    """A saver that holds its ``lock`` while it writes, as LangGraph's own savers do."""

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()
        self.first_read = threading.Event()

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        found = super().get_tuple(config)
        self.first_read.set()
        return found


class _Sleeps:
    def __init__(self) -> None:
        self.slept: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)


def test_a_miss_while_the_saver_writes_reads_again_once_the_write_is_done() -> None:
    """The save under way when the first read missed: the wait reads again as soon as
    the saver's lock is free, without sleeping past it."""
    saver = _WritingSaver()
    config, checkpoint, at = _checkpoint_of(uuid.uuid4().hex)

    def write() -> None:
        with saver.lock:
            saver.first_read.wait(10)  # the write is under way when the read misses
            saver.put(config, checkpoint, {"source": "loop", "step": 0}, {})

    writer = threading.Thread(target=write)
    writer.start()
    sleeps = _Sleeps()
    try:
        drive(saved_step._until_saved(SavedStep(saver, at), "pay"), sleeps)
    finally:
        writer.join(10)

    assert saver.step_reads == 2
    assert sleeps.slept == []


def test_a_saver_always_busy_falls_back_to_sleeping() -> None:
    """A saver busy with other runs' writes at every miss: three reads follow its
    writes, then the wait sleeps, doubling, as for any saver."""
    saver = _WritingSaver()
    _, _, at = _checkpoint_of(uuid.uuid4().hex)
    flow = saved_step._until_saved(SavedStep(saver, at), "pay")
    seen: list[str] = []
    action = next(flow)
    for _ in range(10):
        if isinstance(action, Sleep):
            seen.append(f"sleep {action.seconds}")
            action = flow.send(None)
        elif action.sync is saved_step._after_write:
            seen.append("after write")
            action = flow.send(0.002)  # some write was under way
        else:
            seen.append("read")
            action = flow.send(None)  # not saved yet
    flow.close()

    assert seen == [
        *["read", "after write"] * 3,
        *["read", "sleep 0.001", "read", "sleep 0.002"],
    ]


def test_waiting_for_a_write_is_bounded_and_says_whether_one_was_under_way() -> None:
    lock = threading.Lock()
    assert saved_step._after_write(lock, 0.05) == 0.0
    with lock:
        assert saved_step._after_write(lock, 0.001) > 0.0
    assert saved_step._after_write(asyncio.Lock(), 0.05) == 0.0  # a loop's: not from a thread


def test_an_async_wait_follows_the_saver_s_write() -> None:
    async def main() -> tuple[float, float]:
        lock = asyncio.Lock()
        idle = await saved_step._aafter_write(lock, 0.05)
        await lock.acquire()
        asyncio.get_running_loop().call_soon(lock.release)
        return idle, await saved_step._aafter_write(lock, 5.0)

    idle, behind = asyncio.run(main())
    assert idle == 0.0
    assert 0.0 < behind < 5.0


class _CountingSaver(InMemorySaver):
    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        self.reads += 1
        return self.get_tuple(config)


def test_a_lock_this_loop_cannot_wait_on_falls_back_to_polling() -> None:
    """A saver made in another event loop holds an `asyncio.Lock` bound to that loop:
    waiting on it here raises, so the wait polls instead of failing the side effect."""
    saver = _CountingSaver()
    config, checkpoint, at = _checkpoint_of(uuid.uuid4().hex)
    lock = asyncio.Lock()

    async def hold_in_another_loop() -> None:
        await lock.acquire()
        waiter = asyncio.ensure_future(lock.acquire())  # binds the lock to this loop
        await asyncio.sleep(0)
        waiter.cancel()

    asyncio.run(hold_in_another_loop())
    saver.lock = lock  # type: ignore[attr-defined]
    slept: list[float] = []

    class SavesWhileAsleep:
        async def asleep(self, seconds: float) -> None:
            slept.append(seconds)
            saver.put(config, checkpoint, {"source": "loop", "step": 0}, {})

    async def main() -> None:
        with pytest.raises(RuntimeError, match="different event loop"):
            await saved_step._aafter_write(lock, 0.05)  # what the wait meets
        await adrive(saved_step._until_saved(SavedStep(saver, at), "pay"), SavesWhileAsleep())

    asyncio.run(main())
    assert saver.reads == 2  # a miss, the wait that could not wait, a sleep, found
    assert slept == [0.001]
