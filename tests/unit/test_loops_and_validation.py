"""Pure cores of the loop guard and of lossless argument coercion."""

from __future__ import annotations

import enum
from typing import Literal

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

from langgraph_resilience import ToolProfile
from langgraph_resilience.core import call_key
from langgraph_resilience.core.loops import detect_loop
from langgraph_resilience.core.validation import check_output, coerce_args
from langgraph_resilience.errors import OutputValidationError


class Currency(enum.Enum):
    USD = "USD"
    EUR = "EUR"


class Refund(BaseModel):
    order_id: int
    amount: float
    currency: Literal["USD", "EUR"]
    express: bool = False
    method: Currency | None = None


def replay(keys: list[str], threshold: int) -> list[str | None]:
    """Feed issued keys through detect_loop the way the tools node does."""
    seen: dict[str, int] = {}
    recent: list[str] = []
    verdicts = []
    for key in keys:
        verdicts.append(
            detect_loop(key, count=seen.get(key, 0), recent=recent, threshold=threshold)
        )
        seen[key] = seen.get(key, 0) + 1
        recent.append(key)
    return verdicts


def test_third_identical_call_is_a_repeat_loop() -> None:
    """With threshold 2 the third identical call is the loop, not the first two."""
    assert replay(["a", "a", "a"], threshold=2) == [None, None, "repeat"]


def test_alternating_pattern_is_caught_at_the_fourth_call() -> None:
    """A B A B: the fourth call closes the alternation."""
    assert replay(["a", "b", "a", "b"], threshold=5) == [None, None, None, "alternating"]


@given(
    st.lists(
        st.dictionaries(st.sampled_from(["city", "q", "page", "id"]), st.integers(), max_size=3),
        unique_by=lambda d: tuple(sorted(d.items())),
        max_size=30,
    )
)
def test_calls_with_different_arguments_are_never_loops(args: list[dict[str, int]]) -> None:
    """Distinct canonical arguments never trigger the guard, whatever the order."""
    keys = [call_key("search", a) for a in args]
    assert len(set(keys)) == len(keys)
    assert all(v is None for v in replay(keys, threshold=1))


def test_case_and_numeric_strings_are_coerced_losslessly() -> None:
    """usd -> USD, "12.5" -> 12.5, "3" -> 3, "true" -> True, "eur" -> EUR for an Enum."""
    result = coerce_args(
        {"order_id": "3", "amount": "12.5", "currency": "usd", "express": "true", "method": "eur"},
        Refund,
    )
    assert result.args == {
        "order_id": 3,
        "amount": 12.5,
        "currency": "USD",
        "express": True,
        "method": "EUR",
    }
    assert len(result.changes) == 5


def test_missing_values_are_never_invented() -> None:
    """A missing required field stays missing; lossless fixes still apply."""
    result = coerce_args({"order_id": 3, "currency": "eur"}, Refund)
    assert result.args == {"order_id": 3, "currency": "EUR"}


def test_unfixable_values_are_left_for_repair() -> None:
    """'dollars' matches no choice: the arguments are returned unchanged."""
    args = {"order_id": 3, "amount": 1.0, "currency": "dollars"}
    assert coerce_args(args, Refund).args == args
    assert coerce_args(args, Refund).changes == ()


def test_output_contract_checks() -> None:
    """output_schema and validate_output reject bad results and accept good ones."""

    class Order(BaseModel):
        order_id: str

    profile = ToolProfile(output_schema=Order)
    check_output('{"order_id": "A1"}', profile)
    with pytest.raises(OutputValidationError, match="order_id"):
        check_output('{"status": "ok"}', profile)
    strict = ToolProfile(validate_output=lambda v: None if v else "empty result")
    check_output("[1]", strict)
    with pytest.raises(OutputValidationError, match="empty result"):
        check_output("[]", strict)
