"""The values every ledger backend stores and reads the same way: durations and limits
validated, outcomes as JSON text, arguments redacted, rows stamped in UTC, the claim of
a record already there."""

from __future__ import annotations

import datetime as dt
import json
import math
from typing import Any, cast

from langgraph_resilience.core.effects import Claim, IdempotencyRecord, OutcomeStatus
from langgraph_resilience.core.redaction import redact_value

__all__ = [
    "audited",
    "check_limit",
    "claim_found",
    "duration_seconds",
    "json_text",
    "outcome_status",
    "stored_json",
    "utc",
]


def duration_seconds(value: float | dt.timedelta, *, field: str, positive: bool) -> float:
    """A duration as finite seconds: > 0 when `positive`, else >= 0 (ValueError otherwise)."""
    seconds = value.total_seconds() if isinstance(value, dt.timedelta) else value
    ok = (
        not isinstance(seconds, bool)
        and isinstance(seconds, int | float)
        and math.isfinite(seconds)
        and (seconds > 0 if positive else seconds >= 0)
    )
    if not ok:
        bound = "> 0" if positive else ">= 0"
        raise ValueError(
            f"{field} must be a number of seconds or a timedelta {bound}, got {value!r}"
        )
    return float(seconds)


def check_limit(limit: int | None) -> int | None:
    """`limit` when it is None or an int >= 1 (ValueError otherwise)."""
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit must be None or an int >= 1, got {limit!r}")
    return limit


def json_text(value: Any, *, what: str) -> str:
    """JSON text of an outcome: the ledger holds JSON only, in every backend."""
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"{what} must be JSON-serializable (dicts, lists, str, numbers, bool, None): {exc}"
        ) from None


def stored_json(value: Any, *, what: str) -> str:
    """JSON text of a value the package stores (an outcome, a saga entry's detail), with
    secrets redacted: secret-named fields blanked, credentials in strings scrubbed, no
    string cut (``limit=None``). A replay from the ledger returns this redacted form."""
    json_text(value, what=what)  # refuse what is not JSON before redact_value repr()s it
    return json_text(redact_value(value, limit=None), what=what)


def audited(args_json: str) -> Any:
    """The stored copy of the arguments, as a JSON value: secret-named fields redacted."""
    try:
        parsed = json.loads(args_json)
    except ValueError:
        raise TypeError("args_json must be JSON text, e.g. canonical_args(args)") from None
    return redact_value(parsed)


def outcome_status(status: str) -> OutcomeStatus:
    """`status` when it is an outcome's (``done`` or ``failed``); ValueError otherwise."""
    if status not in ("done", "failed"):
        raise ValueError(f"outcome status must be 'done' or 'failed', got {status!r}")
    return cast("OutcomeStatus", status)


def utc(timestamp: float) -> dt.datetime:
    """An aware UTC datetime from epoch seconds (how the local backends stamp rows)."""
    return dt.datetime.fromtimestamp(timestamp, dt.UTC)


def claim_found(record: IdempotencyRecord) -> Claim:
    """The claim that found `record` already in the ledger: ``pending`` or ``done``."""
    return Claim("pending" if record.status == "pending" else "done", record)
