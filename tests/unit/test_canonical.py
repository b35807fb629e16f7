"""Canonical arguments and call keys: the identity of "the same call"."""

import ast
import datetime as dt
import decimal
import enum
import json
import os
import random
import subprocess
import sys
import uuid
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from langgraph_resilience.core import call_key, canonical_args
from langgraph_resilience.core.canonical import DEFAULT_NOISE_FIELDS


class Color(enum.Enum):
    RED = "red"
    BLUE = 2


class Unit(enum.StrEnum):
    CELSIUS = "c"


class Query(BaseModel):
    q: str
    limit: int = 10
    reasoning: str = "model chatter"


# ------------------------------------------------------------------------ sameness


def test_reordered_keys_give_the_same_key() -> None:
    """Key order never matters, at any depth."""
    a = {"q": "x", "filters": {"lang": "en", "year": 2024}, "page": 1}
    b = {"page": 1, "filters": {"year": 2024, "lang": "en"}, "q": "x"}
    assert canonical_args(a) == canonical_args(b)
    assert call_key("search", a) == call_key("search", b)


def test_canonical_text_is_compact_sorted_json() -> None:
    """The canonical form is exact: sorted keys, no spaces, no noise."""
    assert canonical_args({"b": 1.0000001, "a": "x", "reasoning": "because"}) == '{"a":"x","b":1}'
    assert canonical_args({"z": [3, 1], "a": {"d": None, "c": True}}) == (
        '{"a":{"c":true,"d":null},"z":[3,1]}'
    )


@pytest.mark.parametrize(
    "noise", ["reasoning", "thought", "note", "request_id", "timestamp", "nonce"]
)
def test_noise_fields_are_ignored_at_any_depth(noise: str) -> None:
    """Adding a noise field anywhere does not make a different call."""
    base = {"q": "x", "filters": {"lang": "en"}, "items": [{"id": 1}]}
    noisy = {
        "q": "x",
        noise: "top",
        "filters": {"lang": "en", noise: {"deep": 1}},
        "items": [{"id": 1, noise: 42}],
    }
    assert canonical_args(noisy) == canonical_args(base)
    assert call_key("search", noisy) == call_key("search", base)


def test_default_noise_fields_are_documented() -> None:
    """The design's noise list is the default."""
    assert {"reasoning", "thought", "note", "request_id", "timestamp", "nonce"} <= (
        DEFAULT_NOISE_FIELDS
    )


def test_changed_value_gives_a_different_key() -> None:
    """A different argument value is a different call."""
    assert call_key("search", {"q": "x"}) != call_key("search", {"q": "y"})
    assert call_key("search", {"q": "x", "f": {"a": 1}}) != call_key(
        "search", {"q": "x", "f": {"a": 2}}
    )
    assert call_key("search", {"q": [1, 2]}) != call_key("search", {"q": [2, 1]})


def test_different_tool_gives_a_different_key() -> None:
    """The same arguments to another tool are another call; the key names the tool."""
    assert call_key("search", {"q": "x"}) != call_key("lookup", {"q": "x"})
    assert call_key("search", {"q": "x"}).startswith("search:")


def test_call_key_is_short_and_hex() -> None:
    """The key is the tool name and a 20-hex-digit digest."""
    tool, digest = call_key("search", {"q": "x"}).split(":")
    assert tool == "search"
    assert len(digest) == 20
    int(digest, 16)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        pytest.param(1.0000001, 1, id="rounds-to-int"),
        pytest.param(0.1 + 0.2, 0.3, id="float-noise"),
        pytest.param(2.0, 2, id="float-int"),
        pytest.param(-0.0, 0, id="negative-zero"),
        pytest.param(1.23456749, 1.234567, id="sixth-place"),
        pytest.param(decimal.Decimal("1.5"), 1.5, id="decimal"),
    ],
)
def test_floats_are_rounded_to_six_places(a: Any, b: Any) -> None:
    """Values equal to 6 decimal places are the same argument."""
    assert canonical_args({"x": a}) == canonical_args({"x": b})


def test_floats_differing_at_the_fifth_place_differ() -> None:
    """Rounding is to 6 places, not coarser."""
    assert canonical_args({"x": 1.00001}) != canonical_args({"x": 1.0})


def test_custom_noise_fields_replace_the_defaults() -> None:
    """A caller's noise list is used instead of the default one."""
    assert canonical_args({"a": 1, "trace": "t1"}, noise_fields={"trace"}) == '{"a":1}'
    assert canonical_args({"a": 1, "reasoning": "r"}, noise_fields={"trace"}) == (
        '{"a":1,"reasoning":"r"}'
    )
    assert call_key("t", {"a": 1, "trace": "t1"}, noise_fields=["trace"]) == call_key(
        "t", {"a": 1, "trace": "t2"}, noise_fields=["trace"]
    )


def test_no_noise_fields_keeps_everything() -> None:
    """An empty noise list compares every field."""
    assert call_key("t", {"a": 1, "nonce": 1}, noise_fields=()) != call_key(
        "t", {"a": 1, "nonce": 2}, noise_fields=()
    )


# ------------------------------------------------------------------ awkward values

AWKWARD: dict[str, Any] = {
    "nan": float("nan"),
    "inf": float("inf"),
    "ninf": float("-inf"),
    "bytes": b"\x00\xffpayload",
    "bytearray": bytearray(b"ab"),
    "datetime": dt.datetime(2024, 5, 1, 12, 30, tzinfo=dt.UTC),
    "naive": dt.datetime(2024, 5, 1, 12, 30),
    "date": dt.date(2024, 5, 1),
    "time": dt.time(8, 15),
    "delta": dt.timedelta(minutes=2),
    "decimal": decimal.Decimal("3.14159265"),
    "decimal_nan": decimal.Decimal("NaN"),
    "uuid": uuid.UUID("12345678-1234-5678-1234-567812345678"),
    "set": {"b", "a", "c"},
    "frozenset": frozenset({3, 1, 2}),
    "tuple": (1, "two", 3.0),
    "enum": Color.RED,
    "int_enum_value": Color.BLUE,
    "str_enum": Unit.CELSIUS,
    "model": Query(q="x"),
    "object": object(),
    "none": None,
    "bool": True,
    "big": 10**30,
    "unicode": "Zürich ✓",
}


def test_awkward_values_reduce_to_valid_json() -> None:
    """Every awkward value is handled and the result is strict JSON."""
    text = canonical_args(AWKWARD)
    parsed = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    assert parsed["nan"] == {"$float": "nan"}
    assert parsed["inf"] == {"$float": "inf"}
    assert parsed["ninf"] == {"$float": "-inf"}
    assert parsed["bytes"] == {"$bytes": "AP9wYXlsb2Fk"}
    assert parsed["datetime"] == "2024-05-01T12:30:00+00:00"
    assert parsed["date"] == "2024-05-01"
    assert parsed["time"] == "08:15:00"
    assert parsed["delta"] == {"$seconds": 120}
    assert parsed["decimal"] == 3.141593
    assert parsed["decimal_nan"] == {"$float": "nan"}
    assert parsed["uuid"] == "12345678-1234-5678-1234-567812345678"
    assert parsed["set"] == ["a", "b", "c"]
    assert parsed["frozenset"] == [1, 2, 3]
    assert parsed["tuple"] == [1, "two", 3]
    assert parsed["enum"] == "red"
    assert parsed["int_enum_value"] == 2
    assert parsed["str_enum"] == "c"
    assert parsed["model"] == {"limit": 10, "q": "x"}
    assert parsed["object"] == {"$repr": "object"}
    assert parsed["big"] == 10**30
    assert parsed["unicode"] == "Zürich ✓"


def test_awkward_values_are_deterministic() -> None:
    """The same awkward arguments always give the same key, whatever the insertion order."""
    shuffled_items = list(AWKWARD.items())
    random.Random(4).shuffle(shuffled_items)
    assert call_key("t", AWKWARD) == call_key("t", dict(shuffled_items))
    assert canonical_args(AWKWARD) == canonical_args(AWKWARD)


def test_nan_is_equal_to_itself() -> None:
    """NaN arguments compare equal (unlike float NaN), so a NaN retry loop is still a loop."""
    assert call_key("t", {"x": float("nan")}) == call_key("t", {"x": float("nan")})
    assert call_key("t", {"x": float("nan")}) != call_key("t", {"x": float("inf")})
    assert call_key("t", {"x": float("inf")}) != call_key("t", {"x": float("-inf")})


def test_set_order_never_matters() -> None:
    """Sets are sorted, so iteration order (salted per process for str) is irrelevant."""
    assert canonical_args({"s": {"pear", "apple", "fig"}}) == canonical_args(
        {"s": {"fig", "pear", "apple"}}
    )
    assert canonical_args({"s": {1, "1", (1, 2)}}) == canonical_args({"s": {(1, 2), "1", 1}})


def test_pydantic_model_equals_its_json_dump() -> None:
    """A model argument is its JSON dump, with noise fields still removed."""
    assert canonical_args(Query(q="x", reasoning="a")) == canonical_args({"q": "x", "limit": 10})


def test_tuple_and_list_are_the_same_argument() -> None:
    """Tuples become JSON arrays, like every tool sees them."""
    assert canonical_args({"p": (1, 2)}) == canonical_args({"p": [1, 2]})


def test_non_string_keys_are_stringified() -> None:
    """Integer keys do not crash sorting and read as their JSON object keys."""
    assert canonical_args({2: "b", 1: "a"}) == '{"1":"a","2":"b"}'


def test_very_deep_values_are_cut_off() -> None:
    """A pathological nesting depth does not blow the stack."""
    deep: Any = "leaf"
    for _ in range(2000):
        deep = [deep]
    assert "<max-depth>" in canonical_args({"x": deep})


# ------------------------------------------------------------ cross-process stability

_STABLE_ARGS = (
    "{'q': 'x', 'tags': {'beta', 'alpha', 'gamma', 'delta'}, 'n': 1.0000001, "
    "'nested': {'z': {'k1', 'k2', 'k3'}, 'a': [1, 2.5, None]}, 'nonce': 'abc'}"
)


@pytest.mark.slow
def test_call_key_is_stable_across_processes() -> None:
    """Hash randomization does not change a call key: it is safe to checkpoint."""
    expected = call_key("search", ast.literal_eval(_STABLE_ARGS))
    script = (
        "from langgraph_resilience.core import call_key\n"
        f"print(call_key('search', {_STABLE_ARGS}))\n"
    )
    seeds = ("0", "1", "4242", "random")
    children = [
        subprocess.Popen(
            [sys.executable, "-c", script],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
        )
        for seed in seeds
    ]
    for seed, child in zip(seeds, children, strict=True):
        out, err = child.communicate(timeout=120)
        assert child.returncode == 0, err
        assert out.strip() == expected, f"PYTHONHASHSEED={seed}"


# --------------------------------------------------------------------- properties

_KEYS = st.text(min_size=1, max_size=8).filter(lambda k: k not in DEFAULT_NOISE_FIELDS)
_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=10)
)
_JSON = st.recursive(
    _SCALARS,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(_KEYS, children, max_size=4),
    max_leaves=20,
)
_ARGS = st.dictionaries(_KEYS, _JSON, min_size=1, max_size=6)


def _reordered(value: Any, rnd: random.Random) -> Any:
    """The same value, with every dict rebuilt in a shuffled insertion order."""
    if isinstance(value, dict):
        items = list(value.items())
        rnd.shuffle(items)
        return {k: _reordered(v, rnd) for k, v in items}
    if isinstance(value, list):
        return [_reordered(v, rnd) for v in value]
    return value


@settings(deadline=None)
@given(args=_ARGS, seed=st.integers(0, 2**32 - 1))
def test_property_key_order_never_matters(args: dict[str, Any], seed: int) -> None:
    """Rebuilding every dict with a shuffled insertion order keeps the call key."""
    assert call_key("tool", _reordered(args, random.Random(seed))) == call_key("tool", args)


@settings(deadline=None)
@given(args=_ARGS, data=st.data())
def test_property_changed_value_changes_the_key(args: dict[str, Any], data: st.DataObject) -> None:
    """Replacing one top-level value with a different JSON value gives a different key."""
    key = data.draw(st.sampled_from(sorted(args)))
    new_value = data.draw(st.integers() | st.text(max_size=10))
    old = canonical_args(args[key])
    assume(canonical_args(new_value) != old)
    changed = {**args, key: new_value}
    assert call_key("tool", changed) != call_key("tool", args)


@settings(deadline=None)
@given(args=_ARGS)
def test_property_canonical_form_is_a_fixed_point(args: dict[str, Any]) -> None:
    """Canonicalizing the parsed canonical JSON gives the same text back."""
    text = canonical_args(args)
    assert canonical_args(json.loads(text)) == text


@settings(deadline=None)
@given(args=_ARGS, noise=st.sampled_from(sorted(DEFAULT_NOISE_FIELDS)), value=_JSON)
def test_property_noise_never_matters(args: dict[str, Any], noise: str, value: Any) -> None:
    """Adding any noise field with any value keeps the call key."""
    assert call_key("tool", {**args, noise: value}) == call_key("tool", args)
