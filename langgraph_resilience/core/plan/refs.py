"""``$steps`` references: how a plan step uses the outputs of the steps it depends on.

Reference syntax
----------------
Nothing is ever evaluated: a reference is a path of dict keys and list indices,
looked up with ``[]`` only (never ``getattr``), and substituted once (a
substituted value is data, so a tool output containing ``$steps...`` is never
resolved again).

- **Whole value**: a string that is *exactly* ``$steps.<id>.output`` or
  ``$steps.<id>.output.<seg>.<seg>...`` is replaced by that value, of any JSON
  type. A segment is ``[A-Za-z0-9_-]+``; on a list, an all-digit segment is an
  index; on a dict, every segment is a key.
- **Interpolation**: inside a longer string, ``{$steps.<id>.output.<seg>...}``
  is replaced by the value's text: a string as is, anything else as compact
  JSON (``true``, ``null``, ``[1,2]``).
- Step ids are ``[A-Za-z0-9_-]{1,64}``. Any other occurrence of ``$steps.`` in a
  string is a malformed reference: `verify` rejects it and `resolve_args`
  raises. Keys that contain other characters (dots, spaces) are not addressable.
- A step must list in ``depends_on`` every step it references. When a step
  failed and its fallback succeeded, `effective_outputs` lets the fallback's
  output stand in for it.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator, Mapping
from typing import Any, Literal, TypeAlias

from langgraph_resilience.core.plan.model import PlanError

__all__ = [
    "STEP_ID",
    "PlanReferenceError",
    "ReferenceProblem",
    "holds_reference",
    "is_malformed",
    "references",
    "resolve_args",
    "strings",
]

STEP_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
"""What a step id must match, whole."""

_REF = r"\$steps\.(?P<id>[A-Za-z0-9_-]{1,64})\.output(?P<path>(?:\.[A-Za-z0-9_-]+)*)"
_WHOLE_REF = re.compile(_REF)
_EMBEDDED_REF = re.compile(r"\{" + _REF + r"\}")
_MARKER = "$steps."

ReferenceProblem: TypeAlias = Literal[
    "missing_step", "missing_key", "missing_index", "not_traversable", "not_json", "malformed"
]
"""Why a reference did not resolve (`PlanReferenceError.problem`)."""


class PlanReferenceError(PlanError):
    """A ``$steps`` reference cannot be resolved: no such step output, key or index.

    `reference` is the reference text (the whole string when malformed),
    `step_id` the step it names and `problem` the `ReferenceProblem`, so the
    executor can report a precise failure instead of calling a tool with junk.
    """

    def __init__(self, reference: str, step_id: str | None, problem: ReferenceProblem) -> None:
        super().__init__(f"cannot resolve {reference!r}: {problem.replace('_', ' ')}")
        self.reference = reference
        self.step_id = step_id
        self.problem = problem


def strings(value: Any) -> Iterator[str]:
    """Every string value inside `value`, at any depth (dict keys are not values).

    >>> list(strings({"a": ["x", {"b": "y"}], "n": 1}))
    ['x', 'y']
    """
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from strings(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from strings(item)


def holds_reference(value: Any) -> bool:
    """True if some string inside `value` mentions ``$steps.`` (well-formed or not)."""
    return any(_MARKER in text for text in strings(value))


def is_malformed(text: str) -> bool:
    """True if `text` mentions ``$steps.`` outside a well-formed reference.

    >>> is_malformed("$steps.geo.output.lat"), is_malformed("$steps.geo.lat")
    (False, True)
    """
    if _MARKER not in text or _WHOLE_REF.fullmatch(text):
        return False
    return _MARKER in _EMBEDDED_REF.sub("", text)


def _refs_in(text: str) -> set[str]:
    whole = _WHOLE_REF.fullmatch(text)
    if whole:
        return {whole["id"]}
    return {match["id"] for match in _EMBEDDED_REF.finditer(text)}


def references(args: Mapping[str, Any]) -> set[str]:
    """The step ids that `args` reference, at any depth, whole or interpolated.

    The verifier checks them against the step's ``depends_on``.

    >>> sorted(references({"lat": "$steps.geo.output.lat", "q": "near {$steps.poi.output}"}))
    ['geo', 'poi']
    """
    found: set[str] = set()
    for text in strings(args):
        if _MARKER in text:
            found |= _refs_in(text)
    return found


def _lookup(match: re.Match[str], outputs: Mapping[str, Any]) -> Any:
    step_id = match["id"]
    if step_id not in outputs:
        raise PlanReferenceError(match[0], step_id, "missing_step")
    value = outputs[step_id]
    for segment in match["path"].split(".")[1:]:
        if isinstance(value, Mapping):
            if segment not in value:
                raise PlanReferenceError(match[0], step_id, "missing_key")
            value = value[segment]
        elif isinstance(value, list | tuple):
            if not segment.isdigit() or int(segment) >= len(value):
                raise PlanReferenceError(match[0], step_id, "missing_index")
            value = value[int(segment)]
        else:
            raise PlanReferenceError(match[0], step_id, "not_traversable")
    return value


def _as_text(value: Any, reference: str, step_id: str) -> str:
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError):
        raise PlanReferenceError(reference, step_id, "not_json") from None


def _resolve(value: Any, outputs: Mapping[str, Any]) -> Any:
    if isinstance(value, str):
        if _MARKER not in value:
            return value
        whole = _WHOLE_REF.fullmatch(value)
        if whole:
            return copy.deepcopy(_lookup(whole, outputs))
        if is_malformed(value):
            raise PlanReferenceError(value, None, "malformed")
        return _EMBEDDED_REF.sub(lambda m: _as_text(_lookup(m, outputs), m[0], m["id"]), value)
    if isinstance(value, Mapping):
        return {key: _resolve(item, outputs) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_resolve(item, outputs) for item in value]
    return value


def resolve_args(args: Mapping[str, Any], outputs: Mapping[str, Any]) -> dict[str, Any]:
    """Return `args` with every ``$steps`` reference replaced by the output it names.

    `outputs` maps step ids to outputs (see `effective_outputs` for fallbacks).
    Raises `PlanReferenceError` for a missing step, key or index, or a
    malformed reference; never evaluates anything.

    >>> resolve_args({"id": "$steps.s.output.items.0.id", "q": "id={$steps.s.output.n}"},
    ...              {"s": {"items": [{"id": "a1"}], "n": 2}})
    {'id': 'a1', 'q': 'id=2'}
    """
    return {key: _resolve(value, outputs) for key, value in args.items()}
