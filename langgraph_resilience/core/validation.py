"""Cheap fixes before an LLM call, and output checks a plain retry can never make.

`coerce_args` validates a call's arguments against the tool's schema and applies
only *lossless* coercions: a case-insensitive match of an enum/literal choice,
and numeric or boolean strings the schema wants as numbers or booleans. It
never invents a missing value and never drops a field: what it cannot fix
losslessly is left for the tool to report and for reflection repair to fix.

`check_output` applies a `ToolProfile`'s ``output_schema`` / ``validate_output``
to a result that looks successful, raising `OutputValidationError` (SEMANTIC)
when it is not what the caller was promised.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import types
import typing
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ValidationError

from langgraph_resilience.core.profile import ToolProfile
from langgraph_resilience.errors import OutputValidationError

__all__ = ["Coercion", "check_output", "coerce_args", "parsed_content"]


@dataclasses.dataclass(frozen=True, slots=True)
class Coercion:
    """The (possibly) fixed arguments and a human-readable line per change."""

    args: dict[str, Any]
    changes: tuple[str, ...] = ()


def _choices(annotation: Any) -> list[Any]:
    """The allowed values of a Literal/Enum annotation (through Optional/Annotated)."""
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return list(typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType, typing.Annotated):
        values: list[Any] = []
        for arg in typing.get_args(annotation):
            values.extend(_choices(arg))
        return values
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return [member.value for member in annotation]
    return []


def _case_fix(schema: type[BaseModel], field: str, value: str) -> Any | None:
    info = schema.model_fields.get(field)
    if info is None:
        return None
    folded = value.strip().casefold()
    matches = [
        c for c in _choices(info.annotation) if isinstance(c, str) and c.casefold() == folded
    ]
    return matches[0] if len(matches) == 1 else None


def _scalar(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def coerce_args(args: Mapping[str, Any], schema: Any) -> Coercion:
    """Return `args` with lossless fixes applied against a pydantic `schema`.

    >>> from typing import Literal
    >>> from pydantic import create_model
    >>> Refund = create_model("Refund", amount=(float, ...), currency=(Literal["USD", "EUR"], ...))
    >>> coerce_args({"amount": "12.5", "currency": "usd"}, Refund).changes
    ("currency: 'usd' -> 'USD'", "amount: '12.5' -> 12.5")
    """
    fixed = dict(args)
    if not (isinstance(schema, type) and issubclass(schema, BaseModel)):
        return Coercion(fixed)
    changes: list[str] = []
    try:
        model = schema.model_validate(fixed)
    except ValidationError as exc:
        for error in exc.errors(include_url=False):
            loc = error.get("loc") or ()
            if error["type"] not in ("literal_error", "enum") or len(loc) != 1:
                continue
            field, value = str(loc[0]), error.get("input")
            if isinstance(value, str) and (choice := _case_fix(schema, field, value)) is not None:
                fixed[field] = choice
                changes.append(f"{field}: {value!r} -> {choice!r}")
        try:
            model = schema.model_validate(fixed)
        except ValidationError:
            # Other problems remain: keep the lossless fixes, let the tool report the rest.
            return Coercion(fixed, tuple(changes))
    dumped = model.model_dump(mode="json")
    for field, value in args.items():
        new = dumped.get(field)
        if isinstance(value, str) and (_scalar(new) or isinstance(new, bool)):
            fixed[field] = new
            changes.append(f"{field}: {value!r} -> {new!r}")
    return Coercion(fixed, tuple(changes))


def parsed_content(content: Any) -> Any:
    """A tool result's content as its JSON value when it is JSON text, else as it is.

    >>> parsed_content('{"id": 7}'), parsed_content("plain text")
    ({'id': 7}, 'plain text')
    """
    if isinstance(content, str):
        try:
            return json.loads(content)
        except json.JSONDecodeError:
            return content
    return content


def check_output(content: Any, profile: ToolProfile | None) -> None:
    """Raise `OutputValidationError` if a successful-looking result breaks its contract."""
    if profile is None or (profile.output_schema is None and profile.validate_output is None):
        return
    value = parsed_content(content)
    if profile.output_schema is not None:
        try:
            profile.output_schema.model_validate(value)
        except ValidationError as exc:
            problems = [
                f"{'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['msg']}"
                for e in exc.errors(include_url=False, include_input=False)
            ]
            raise OutputValidationError(problems) from exc
    if profile.validate_output is not None:
        problem = profile.validate_output(value)
        if problem:
            raise OutputValidationError([str(problem)])
