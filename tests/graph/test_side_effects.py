"""Side effects run exactly once: idempotency keys, reconciliation, compensation."""

from __future__ import annotations

import json
from typing import Any

from langchain_core.messages import ToolMessage
from langchain_core.tools import tool
from langgraph.types import Command

from langgraph_resilience import ToolProfile, current_idempotency_key
from langgraph_resilience.stores import EffectStatus
from langgraph_resilience.testing import Fault, FaultyTool, text, tool_calls
from tests.conftest import Runner, build_graph


class Bank:
    """A payment service that deduplicates nothing: every charge is a new payment."""

    def __init__(self) -> None:
        self.payments: list[tuple[str, int]] = []
        self.refunds: list[str] = []

    def status(self, key: str) -> EffectStatus:
        done = [p for p in self.payments if p[0] == key]
        return EffectStatus(done=bool(done), result=f"charged {done[0][1]}" if done else None)


def make_charge(bank: Bank) -> Any:
    @tool
    def charge(amount: int) -> str:
        """Charge the customer's card."""
        key = current_idempotency_key()
        assert key is not None
        bank.payments.append((key, amount))
        return f"charged {amount}"

    return charge


def tool_messages(state: dict[str, Any]) -> list[ToolMessage]:
    return [m for m in state["messages"] if isinstance(m, ToolMessage)]


def test_timeout_after_the_effect_is_reconciled_not_repeated(runner: Runner) -> None:
    """The charge happens, the response is lost; status_check finds it: one payment."""
    bank = Bank()
    charge = FaultyTool(make_charge(bank), [Fault.timeout(after_effect=True)])
    h = build_graph(
        [charge],
        [tool_calls(("charge", {"amount": 30})), text("paid")],
        profiles={"charge": ToolProfile(side_effect=True, status_check=bank.status)},
    )

    out = runner.invoke(h.app, {"messages": [("user", "pay 30")]}, h.config())

    assert len(bank.payments) == 1
    assert charge.executions == 1
    [message] = tool_messages(out)
    assert (message.status, message.content) == ("success", "charged 30")
    assert message.response_metadata["resilience"]["reconciled"] is True
    key = bank.payments[0][0]
    assert message.response_metadata["resilience"]["idempotency_key"] == key


def test_unknown_outcome_without_status_check_is_never_rerun(runner: Runner) -> None:
    """Without a way to ask, the effect of unknown outcome is not executed again."""
    bank = Bank()
    charge = FaultyTool(make_charge(bank), [Fault.timeout(after_effect=True)])
    h = build_graph(
        [charge],
        [tool_calls(("charge", {"amount": 30})), text("unsure")],
        profiles={"charge": ToolProfile(side_effect=True)},
    )

    out = runner.invoke(h.app, {"messages": [("user", "pay 30")]}, h.config())

    assert len(bank.payments) == 1
    [message] = tool_messages(out)
    envelope = json.loads(str(message.content))
    assert envelope["failure_class"] == "unknown"
    assert envelope["suggested_action"] == "query_status"


def test_one_exception_object_is_judged_by_each_tool_that_raises_it(runner: Runner) -> None:
    """A client that re-raises one stored exception object (its connection marked down)
    fails a read, then a charge after the charge went through. The read's verdict
    (transient: retry) is not the charge's: a lost answer there may hide a payment, so
    it is never re-run blindly."""
    bank = Bank()
    down = TimeoutError("payments.example: read timed out")

    @tool
    def balance() -> str:
        """The customer's balance."""
        raise down

    @tool
    def charge(amount: int) -> str:
        """Charge the customer's card."""
        bank.payments.append((current_idempotency_key() or "", amount))
        raise down  # the payment went through; its answer was lost

    h = build_graph(
        [balance, charge],
        [
            tool_calls(("balance", {})),
            tool_calls(("charge", {"amount": 30})),
            text("unsure"),
        ],
        profiles={"charge": ToolProfile(side_effect=True)},
    )

    out = runner.invoke(h.app, {"messages": [("user", "pay 30")]}, h.config())

    assert len(bank.payments) == 1
    read, paid = (json.loads(str(m.content)) for m in tool_messages(out))
    assert (read["tool"], read["failure_class"]) == ("balance", "transient")
    assert (paid["tool"], paid["failure_class"]) == ("charge", "unknown")
    assert paid["suggested_action"] == "query_status"


def test_two_identical_calls_of_one_message_are_two_effects(runner: Runner) -> None:
    """The model asks for the same charge twice in one message (the user said "charge 5
    twice"): as with plain ToolNode, both run, each under its own key (the position is
    part of the effect); neither is a re-issue of the other. Asked once more in a later
    turn, it runs a third time: the thread holds the two it did."""
    bank = Bank()
    h = build_graph(
        [make_charge(bank)],
        [
            tool_calls(("charge", {"amount": 5}), ("charge", {"amount": 5})),
            text("charged twice"),
            tool_calls(("charge", {"amount": 5})),
            text("charged again"),
        ],
        profiles={"charge": ToolProfile(side_effect=True)},
    )
    config = h.config()

    out = runner.invoke(h.app, {"messages": [("user", "charge 5 twice")]}, config)

    assert [(m.status, m.content) for m in tool_messages(out)] == [("success", "charged 5")] * 2
    assert len({key for key, _ in bank.payments}) == 2
    out = runner.invoke(h.app, {"messages": [("user", "and once more")]}, config)
    assert len(bank.payments) == 3
    assert tool_messages(out)[-1].content == "charged 5"


def charged(value: Any) -> str | None:
    """The charge tool's output contract: 'charged N'."""
    return None if str(value).startswith("charged ") else f"not a charge receipt: {value!r}"


def test_an_unusable_answer_from_a_done_effect_is_reconciled_not_repeated(
    runner: Runner,
) -> None:
    """The charge happens but answers garbage; the agent would re-issue it (a new call
    id, a new key). status_check finds the payment: its receipt answers the call."""
    bank = Bank()
    charge = FaultyTool(make_charge(bank), [Fault.malformed("{'trunc")])
    h = build_graph(
        [charge],
        [tool_calls(("charge", {"amount": 30})), text("paid")],
        profiles={
            "charge": ToolProfile(
                side_effect=True, status_check=bank.status, validate_output=charged
            )
        },
    )

    out = runner.invoke(h.app, {"messages": [("user", "pay 30")]}, h.config())

    assert len(bank.payments) == 1
    [message] = tool_messages(out)
    assert (message.status, message.content) == ("success", "charged 30")
    assert message.response_metadata["resilience"]["reconciled"] is True


def test_an_unusable_answer_from_an_effect_that_did_not_happen_is_semantic(
    runner: Runner,
) -> None:
    """The service says no payment was made: the contract failure stands (SEMANTIC)."""
    bank = Bank()
    charge = FaultyTool(make_charge(bank), [Fault.malformed("{'trunc")])
    h = build_graph(
        [charge],
        [tool_calls(("charge", {"amount": 30})), text("hm")],
        profiles={
            "charge": ToolProfile(
                side_effect=True,
                status_check=lambda key: EffectStatus(done=False),
                validate_output=charged,
            )
        },
    )

    out = runner.invoke(h.app, {"messages": [("user", "pay 30")]}, h.config())

    envelope = json.loads(str(tool_messages(out)[0].content))
    assert (envelope["failure_class"], envelope["context"]["stage"]) == ("semantic", "output")


def test_an_unusable_answer_without_status_check_is_unknown(runner: Runner) -> None:
    """No way to ask: the agent is told the outcome is unknown, not to fix its call."""
    bank = Bank()
    charge = FaultyTool(make_charge(bank), [Fault.malformed("{'trunc")])
    h = build_graph(
        [charge],
        [tool_calls(("charge", {"amount": 30})), text("unsure")],
        profiles={"charge": ToolProfile(side_effect=True, validate_output=charged)},
    )

    out = runner.invoke(h.app, {"messages": [("user", "pay 30")]}, h.config())

    assert len(bank.payments) == 1
    envelope = json.loads(str(tool_messages(out)[0].content))
    assert envelope["failure_class"] == "unknown"
    assert envelope["suggested_action"] == "query_status"
    assert envelope["context"]["problems"] == ['not a charge receipt: "{\'trunc"']


def test_refused_side_effect_is_retried_under_the_same_key(runner: Runner) -> None:
    """A 503 before anything happened releases the key; the retry pays once."""
    bank = Bank()
    charge = FaultyTool(make_charge(bank), [Fault.status(503)])
    h = build_graph(
        [charge],
        [tool_calls(("charge", {"amount": 30})), text("paid")],
        profiles={"charge": ToolProfile(side_effect=True, status_check=bank.status)},
    )

    runner.invoke(h.app, {"messages": [("user", "pay 30")]}, h.config())

    assert charge.calls == 2
    assert len(bank.payments) == 1


def test_the_key_is_stable_across_retries_and_absent_outside_effects(runner: Runner) -> None:
    """Both attempts of one call see the same key; nothing leaks outside the call."""
    bank = Bank()
    charge = FaultyTool(make_charge(bank), [Fault.timeout(after_effect=True)])
    h = build_graph(
        [charge],
        [tool_calls(("charge", {"amount": 5})), tool_calls(("charge", {"amount": 5})), text("x")],
        profiles={"charge": ToolProfile(side_effect=True, status_check=lambda k: None)},
    )

    runner.invoke(h.app, {"messages": [("user", "pay")]}, h.config())

    keys = [key for key, _ in bank.payments]
    assert len(keys) == 3  # call 1 ran, was reconciled as not done, ran again; call 2 ran
    assert keys[0] == keys[1] != keys[2]
    assert current_idempotency_key() is None


def test_abort_compensates_effects_newest_first(runner: Runner) -> None:
    """Three charges, then a refusal escalated and aborted: three refunds, in reverse."""
    bank = Bank()
    charge = make_charge(bank)

    def refund(key: str, result: Any) -> str:
        bank.refunds.append(key)
        return "refunded"

    @tool
    def ship(order: str) -> str:
        """Ship the order."""
        return "shipped"

    blocked = FaultyTool(ship, [Fault.status(403)])
    script = [
        tool_calls(("charge", {"amount": 1})),
        tool_calls(("charge", {"amount": 2})),
        tool_calls(("charge", {"amount": 3})),
        tool_calls(("ship", {"order": "o1"})),
        text("unreachable"),
    ]
    h = build_graph(
        [charge, blocked],
        script,
        escalate=True,
        profiles={"charge": ToolProfile(side_effect=True, compensate=refund)},
    )
    config = h.config()
    runner.invoke(h.app, {"messages": [("user", "buy")]}, config)

    out = runner.invoke(h.app, Command(resume={"action": "abort"}), config)

    assert out["resilience"]["task"]["aborted"] is True
    keys = [key for key, _ in bank.payments]
    assert bank.refunds == list(reversed(keys))
    assert [amount for _, amount in bank.payments] == [1, 2, 3]


def test_a_reconciled_effect_is_compensated_too(runner: Runner) -> None:
    """A charge whose answer was lost and that status_check found done enters the saga
    like any other: an abort refunds it."""
    bank = Bank()
    charge = FaultyTool(make_charge(bank), [Fault.timeout(after_effect=True)])

    def refund(key: str, result: Any) -> str:
        bank.refunds.append(key)
        return "refunded"

    @tool
    def ship(order: str) -> str:
        """Ship the order."""
        return "shipped"

    blocked = FaultyTool(ship, [Fault.status(403)])
    h = build_graph(
        [charge, blocked],
        [tool_calls(("charge", {"amount": 7})), tool_calls(("ship", {"order": "o1"})), text("x")],
        escalate=True,
        profiles={
            "charge": ToolProfile(side_effect=True, status_check=bank.status, compensate=refund)
        },
    )
    config = h.config()
    first = runner.invoke(h.app, {"messages": [("user", "buy")]}, config)
    assert tool_messages(first)[0].response_metadata["resilience"]["reconciled"] is True

    runner.invoke(h.app, Command(resume={"action": "abort"}), config)

    assert bank.refunds == [bank.payments[0][0]]


def test_an_abandoned_intent_replays_as_unknown_never_as_failed(runner: Runner) -> None:
    """The charge's answer is lost and a human is asked; meanwhile the intent is settled
    as abandoned (`settle_stale`). The human's retry meets "outcome unknown" (and the
    human is asked again): the charge is not run again, and it is not called failed."""
    from langgraph_resilience.stores import (  # noqa: PLC0415
        InMemoryIdempotencyStore,
        settle_stale,
    )
    from langgraph_resilience.stores.saga import InMemorySagaLog  # noqa: PLC0415

    bank = Bank()
    charge = FaultyTool(make_charge(bank), [Fault.timeout(after_effect=True)])
    ledger = InMemoryIdempotencyStore()
    h = build_graph(
        [charge],
        [tool_calls(("charge", {"amount": 9})), text("x")],
        escalate=True,
        profiles={"charge": ToolProfile(side_effect=True)},
        options={"idempotency": ledger, "saga": InMemorySagaLog()},
    )
    config = h.config()
    runner.invoke(h.app, {"messages": [("user", "pay")]}, config)
    [settled] = settle_stale(ledger, lambda thread: False, grace=0, sees_all=True)
    assert settled.reason == "thread_gone"

    out = runner.invoke(h.app, Command(resume={"action": "retry"}), config)

    assert len(bank.payments) == 1
    [asked] = out["__interrupt__"]
    assert asked.value["envelope"]["failure_class"] == "unknown"
    assert "abandoned" in asked.value["envelope"]["context"]["reason"]
