"""Classification: exception (+ tool profile) -> `ToolError`, through an ordered rule table.

A rule is a pure function ``(error, profile) -> Verdict | None``. `classify`
walks the exception's cause chain from the outside in and, for each exception,
tries the rules in order; the first verdict wins. Nothing matched means
UNKNOWN and not retriable: an exception we do not understand is never retried.

Libraries are recognized by duck typing (``.status_code``, ``.status``,
``.response.status_code``, headers, class names), so httpx, requests, aiohttp,
openai and anthropic errors classify without this package importing them.

Users extend the table by putting their own rules first::

    def quota(error, profile):
        if isinstance(error, MyQuotaError):
            return Verdict(FailureClass.POLICY, "ask_human")
        return None

    add_resilience(builder, ..., rules=[quota])

`retriable` is the same decision as a predicate, for LangGraph's own hooks:
``RetryPolicy(retry_on=retriable)``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import difflib
import email.utils
import json
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.exceptions import (
    ContextOverflowError,
    ModelAuthenticationError,
    ModelError,
    ModelInvalidRequestError,
    ModelNotFoundError,
    ModelPermissionDeniedError,
    ModelRefusalError,
)
from langchain_core.tools import ToolException
from langgraph.errors import GraphBubbleUp
from pydantic import ValidationError

from langgraph_resilience.core.evidence import execution
from langgraph_resilience.core.mcp import MCP_RULES
from langgraph_resilience.core.profile import ToolProfile
from langgraph_resilience.core.redaction import redact, redact_value
from langgraph_resilience.core.verdict import Rule, Verdict
from langgraph_resilience.errors import (
    AttemptAbandoned,
    CircuitOpenError,
    FailureClass,
    OutputValidationError,
    ToolError,
    ToolFailure,
    ToolGoneError,
)

__all__ = [
    "DEFAULT_RULES",
    "Rule",
    "Verdict",
    "classify",
    "http_status",
    "retriable",
    "retry_after_ms",
    "unknown_tool_error",
]

_MAX_MESSAGE = 500
_MAX_BODY = 300
_MAX_CHAIN = 6


# --------------------------------------------------------------------- evidence


def http_status(error: BaseException) -> int | None:
    """The HTTP status an exception carries, found by duck typing, or None."""
    candidates = (
        getattr(error, "status_code", None),
        getattr(error, "status", None),
        getattr(getattr(error, "response", None), "status_code", None),
        getattr(getattr(error, "response", None), "status", None),
    )
    for value in candidates:
        if isinstance(value, int) and not isinstance(value, bool) and 100 <= value <= 599:
            return value
    return None


def _headers(error: BaseException) -> Mapping[str, Any]:
    for owner in (error, getattr(error, "response", None)):
        headers = getattr(owner, "headers", None)
        if headers is not None and hasattr(headers, "items"):
            try:
                return {str(k).lower(): v for k, v in headers.items()}
            except Exception:  # a broken headers object is no evidence
                return {}
    return {}


def _millis(seconds: float) -> int | None:
    """Whole milliseconds of a duration, or None if negative or not finite (even once
    multiplied: a huge finite value would overflow to infinity)."""
    millis = seconds * 1000
    return round(millis) if math.isfinite(millis) and millis >= 0 else None


def retry_after_ms(error: BaseException, *, now: float | None = None) -> int | None:
    """The server's requested wait in ms from ``Retry-After`` (seconds or HTTP date)
    or ``retry-after-ms``; None when absent or unparseable. `now` is wall time."""
    headers = _headers(error)
    raw_ms = headers.get("retry-after-ms")
    if raw_ms is not None:
        try:
            value = float(raw_ms)
        except (TypeError, ValueError):
            value = math.nan
        if math.isfinite(value) and value >= 0:
            return int(value)
    raw = headers.get("retry-after")
    if raw is None:
        raw = getattr(error, "retry_after", None)
    if raw is None:
        return None
    if isinstance(raw, int | float) and not isinstance(raw, bool):
        return _millis(raw)
    text = str(raw).strip()
    try:
        secs = float(text)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=dt.UTC)
        current = time.time() if now is None else now
        return _millis(max(0.0, when.timestamp() - current))
    return _millis(secs)


def text_of(error: BaseException) -> str:
    """An exception's text, whatever it does: one whose ``__str__`` raises (or returns
    something else) still gets classified, by its repr or, failing that, its type.

    >>> class Hostile(Exception):
    ...     def __str__(self): raise RuntimeError("no")
    >>> text_of(Hostile())
    'Hostile()'
    """
    try:
        text = str(error)
    except Exception:
        try:
            text = repr(error)
        except Exception:
            text = ""
    return text if isinstance(text, str) and text else type(error).__name__


def _mro_names(error: BaseException) -> tuple[str, ...]:
    return tuple(cls.__name__ for cls in type(error).__mro__)


def _body(error: BaseException) -> str | None:
    response = getattr(error, "response", None)
    text = getattr(response, "text", None)
    if callable(text) or text is None:
        body = getattr(error, "body", None)
        text = (
            json.dumps(redact_value(body), default=str) if isinstance(body, dict | list) else body
        )
    if isinstance(text, str) and text:
        # Cut first (redaction reads a bounded prefix, dropping a token the cut splits).
        return redact(text, limit=_MAX_BODY)
    return None


# ------------------------------------------------------------------------ rules


def tool_failure_rule(error: BaseException, profile: ToolProfile | None) -> Verdict | None:
    """A `ToolFailure` raised on purpose carries its own classification."""
    if not isinstance(error, ToolFailure):
        return None
    default_action = {
        FailureClass.TRANSIENT: "retry",
        FailureClass.SEMANTIC: "fix_args",
        FailureClass.STRUCTURAL: "ask_human",
        FailureClass.POLICY: "ask_human",
        FailureClass.PARTIAL: "retry",
        FailureClass.UNKNOWN: "query_status",
    }[error.failure_class]
    return Verdict(
        error.failure_class,
        error.suggested_action or default_action,
        retriable=error.failure_class is FailureClass.TRANSIENT,
        retry_after_ms=error.retry_after_ms,
        context=error.context,
    )


_QUOTA_MARKERS = ("insufficient_quota", "billing", "quota exceeded", "exceeded your current quota")


def circuit_rule(error: BaseException, profile: ToolProfile | None) -> Verdict | None:
    """An open breaker is STRUCTURAL: this path is out for now; the call never ran."""
    if not isinstance(error, CircuitOpenError):
        return None
    fallbacks = profile.fallbacks if profile is not None else ()
    return Verdict(
        FailureClass.STRUCTURAL,
        f"use_tool:{fallbacks[0]}" if fallbacks else "ask_human",
        retry_after_ms=math.ceil(round(error.retry_after * 1000, 6)),
        context={"breaker": "open", "breaker_key": error.key, **_server_down(error)},
    )


def _server_down(error: CircuitOpenError) -> dict[str, Any]:
    """An MCP server's open breaker: the server, and the tools it took down."""
    server = getattr(error, "server", None)
    if not isinstance(server, str):
        return {}
    tools = getattr(error, "tools", None) or []
    return {"server": server, "unavailable_tools": list(tools)} if tools else {"server": server}


def gone_rule(error: BaseException, profile: ToolProfile | None) -> Verdict | None:
    """A tool remembered as gone is STRUCTURAL: its fallback, else another path."""
    if not isinstance(error, ToolGoneError):
        return None
    fallbacks = profile.fallbacks if profile is not None else ()
    return Verdict(
        FailureClass.STRUCTURAL,
        f"use_tool:{fallbacks[0]}" if fallbacks else "ask_human",
        context={"remembered": True},
    )


def output_rule(error: BaseException, profile: ToolProfile | None) -> Verdict | None:
    """A result that fails its output contract is semantic: a retry would repeat it.
    From a side effect that ran with no way to check it, it is UNKNOWN instead."""
    if not isinstance(error, OutputValidationError):
        return None
    context = {"stage": "output", "problems": error.problems}
    if error.effect_unknown:
        return Verdict(FailureClass.UNKNOWN, "query_status", context=context)
    return Verdict(FailureClass.SEMANTIC, "fix_args", context=context)


def http_status_rule(error: BaseException, profile: ToolProfile | None) -> Verdict | None:
    """HTTP status mapping of DESIGN.md: 408/425/429/5xx transient (501 structural),
    400/409/413/422 and other 4xx semantic, 404/405/410 structural, 401/402/403/451 policy."""
    status = http_status(error)
    if status is None or status < 400:
        return None
    context: dict[str, Any] = {"status_code": status}
    body = _body(error)
    if body:
        context["body"] = body
    evidence = f"{text_of(error)} {body or ''}".lower()
    if status == 429 and any(marker in evidence for marker in _QUOTA_MARKERS):
        # OpenAI-style billing exhaustion arrives as 429 but no wait will fix it.
        return Verdict(FailureClass.POLICY, "ask_human", context=context)
    if status in (408, 425, 429) or (status >= 500 and status not in (501, 505)):
        return Verdict(
            FailureClass.TRANSIENT,
            "retry",
            retriable=True,
            context=context,
        )
    if status in (401, 402, 403, 407, 451):
        return Verdict(FailureClass.POLICY, "ask_human", context=context)
    if status in (404, 405, 410, 501, 505):
        return Verdict(FailureClass.STRUCTURAL, "ask_human", context=context)
    return Verdict(FailureClass.SEMANTIC, "fix_args", context=context)


_BEFORE_SEND_TIMEOUTS = ("ConnectTimeout", "PoolTimeout")
"""Client timeouts raised before the request left (httpx, requests, aiohttp name them
so): nothing reached the service, so even a side effect may be retried."""


def timeout_rule(error: BaseException, profile: ToolProfile | None) -> Verdict | None:
    """Timeouts (`TimeoutError`, httpx/requests/openai ``*Timeout*`` types) are transient.
    A connect or pool timeout is marked ``sent: False``: the request never left."""
    names = _mro_names(error)
    if isinstance(error, TimeoutError) or any("Timeout" in n for n in names):
        context: dict[str, Any] = {"timeout": True}
        if any(n in _BEFORE_SEND_TIMEOUTS for n in names):
            context["sent"] = False
        if isinstance(error, AttemptAbandoned) and error.grace > 0:
            context["in_flight_s"] = error.grace  # it may still land for this long
        return Verdict(FailureClass.TRANSIENT, "retry", retriable=True, context=context)
    return None


_CONNECTION_NAMES = (
    "ConnectError",
    "ConnectionError",
    "RemoteProtocolError",
    "NetworkError",
    "ServerDisconnected",
    "ProtocolError",
)


def connection_rule(error: BaseException, profile: ToolProfile | None) -> Verdict | None:
    """Connection refused/reset and network errors are transient."""
    names = _mro_names(error)
    if isinstance(error, ConnectionError) or any(n in _CONNECTION_NAMES for n in names):
        refused = isinstance(error, ConnectionRefusedError) or "ConnectError" in names
        return Verdict(
            FailureClass.TRANSIENT,
            "retry",
            retriable=True,
            context={"connection": "refused" if refused else "lost"},
        )
    return None


def rate_limit_rule(error: BaseException, profile: ToolProfile | None) -> Verdict | None:
    """A ``*RateLimit*`` error without a status code is still a 429."""
    if any("RateLimit" in n for n in _mro_names(error)):
        return Verdict(FailureClass.TRANSIENT, "retry", retriable=True)
    return None


def validation_rule(error: BaseException, profile: ToolProfile | None) -> Verdict | None:
    """Pydantic validation errors are semantic; the first failing field is named."""
    if not isinstance(error, ValidationError):
        return None
    errors = error.errors(include_url=False, include_input=False)
    fields = [".".join(str(p) for p in e["loc"]) for e in errors if e.get("loc")]
    action = f"fix_arg:{fields[0]}" if fields else "fix_args"
    detail = [{"field": f, "problem": e["msg"]} for f, e in zip(fields, errors, strict=False)]
    return Verdict(FailureClass.SEMANTIC, action, context={"errors": detail[:10]})


def json_rule(error: BaseException, profile: ToolProfile | None) -> Verdict | None:
    """Malformed JSON (arguments or output) is semantic."""
    if isinstance(error, json.JSONDecodeError):
        return Verdict(FailureClass.SEMANTIC, "fix_args", context={"position": error.pos})
    return None


def permission_rule(error: BaseException, profile: ToolProfile | None) -> Verdict | None:
    """`PermissionError` is a policy refusal: a human decides."""
    if isinstance(error, PermissionError):
        return Verdict(FailureClass.POLICY, "ask_human")
    return None


def tool_exception_rule(error: BaseException, profile: ToolProfile | None) -> Verdict | None:
    """A plain `ToolException` is the tool telling the model its call was wrong.

    A `ToolException` with a cause passes, so the cause is classified instead.
    """
    if isinstance(error, ToolException) and error.__cause__ is None:
        return Verdict(FailureClass.SEMANTIC, "fix_args")
    return None


def model_error_rule(error: BaseException, profile: ToolProfile | None) -> Verdict | None:
    """langchain-core's provider-neutral `ModelError` types (after the HTTP status,
    which they also carry when there is one): a refusal or a credentials problem is
    for a human, an overflowing context or an invalid request must change, an
    unknown model is gone; otherwise the type's own ``is_retryable`` decides."""
    if not isinstance(error, ModelError):
        return None
    for types, failure_class, action in _MODEL_ERRORS:
        if isinstance(error, types):
            context = {"model_error": type(error).__name__}
            return Verdict(failure_class, action, context=context)
    if error.is_retryable:
        return Verdict(FailureClass.TRANSIENT, "retry", retriable=True)
    return None


_MODEL_ERRORS: tuple[tuple[tuple[type[ModelError], ...], FailureClass, str], ...] = (
    (
        (ModelAuthenticationError, ModelPermissionDeniedError, ModelRefusalError),
        FailureClass.POLICY,
        "ask_human",
    ),
    ((ContextOverflowError,), FailureClass.SEMANTIC, "shorten_input"),
    ((ModelInvalidRequestError,), FailureClass.SEMANTIC, "fix_args"),
    ((ModelNotFoundError,), FailureClass.STRUCTURAL, "ask_human"),
)


DEFAULT_RULES: tuple[Rule, ...] = (
    tool_failure_rule,
    circuit_rule,
    gone_rule,
    output_rule,
    *MCP_RULES,
    http_status_rule,
    model_error_rule,
    rate_limit_rule,
    timeout_rule,
    connection_rule,
    validation_rule,
    json_rule,
    permission_rule,
    tool_exception_rule,
)
"""The built-in table, most specific evidence first."""


# ------------------------------------------------------------------ classify()


def _chain(error: BaseException) -> list[BaseException]:
    chain: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and current not in chain and len(chain) < _MAX_CHAIN:
        chain.append(current)
        current = (
            _group_leaf(current)
            or current.__cause__
            or (None if current.__suppress_context__ else current.__context__)
        )
    return chain


def _group_leaf(error: BaseException) -> BaseException | None:
    """An exception group's first `Exception` (anyio task groups, as MCP's clients use,
    wrap the real failure, e.g. a refused connection, in one): that is the evidence."""
    if isinstance(error, BaseExceptionGroup):
        return next((e for e in error.exceptions if isinstance(e, Exception)), None)
    return None


def _side_effect_adjusted(
    verdict: Verdict, chain: Sequence[BaseException], profile: ToolProfile
) -> Verdict:
    """A TRANSIENT failure of a side effect is retried only when the evidence says the
    request was not processed (`core.evidence`); otherwise the effect may have
    happened: UNKNOWN, reconciled, never repeated blindly, unless the profile says a
    repeat is safe (`ToolProfile.safe_repeat`), in which case it stays TRANSIENT and
    is retried under the same key."""
    if verdict.failure_class is not FailureClass.TRANSIENT:
        return verdict
    context = verdict.context
    said_not_executed = (
        context.get("sent") is False  # the client says the request never left
        or context.get("reconciled") == "not_done"  # the service says it did not happen
    )
    if said_not_executed or execution(chain) == "refused":
        return verdict
    context = {**context, "maybe_executed": True}
    if profile.safe_repeat is not None:
        return dataclasses.replace(verdict, context=context)
    return Verdict(
        FailureClass.UNKNOWN,
        "query_status",
        retriable=False,
        retry_after_ms=verdict.retry_after_ms,
        context=context,
    )


def _verdict(
    chain: Sequence[BaseException], profile: ToolProfile | None, rules: Sequence[Rule]
) -> tuple[Verdict, BaseException]:
    for link in chain:
        for rule in rules:
            try:
                verdict = rule(link, profile)
            except Exception:  # a rule tripping over a hostile exception is no evidence
                continue
            if verdict is not None:
                return verdict, link
    return Verdict(FailureClass.UNKNOWN, "ask_human"), chain[0]


def classify(
    error: BaseException,
    *,
    tool: str | None = None,
    profile: ToolProfile | None = None,
    call_id: str | None = None,
    attempt: int = 0,
    rules: Sequence[Rule] = DEFAULT_RULES,
    now: float | None = None,
) -> ToolError:
    """Classify an exception into a redacted `ToolError` envelope.

    LangGraph control flow (`GraphBubbleUp`: interrupts, parent commands) is
    not a failure and is re-raised, never classified.

    >>> classify(TimeoutError("read timed out"), tool="search").failure_class
    <FailureClass.TRANSIENT: 'transient'>
    >>> classify(KeyError("x")).retriable
    False
    """
    if isinstance(error, GraphBubbleUp):
        raise error
    chain = _chain(error)
    verdict, evidence = _verdict(chain, profile, rules)
    if profile is not None and profile.side_effect:
        verdict = _side_effect_adjusted(verdict, chain, profile)
    retry_after = verdict.retry_after_ms
    if retry_after is None and verdict.failure_class is FailureClass.TRANSIENT:
        retry_after = retry_after_ms(evidence, now=now)
    if isinstance(evidence, ValidationError):
        # pydantic echoes input values (a password, say) into str(); name the problems only.
        problems = evidence.errors(include_url=False, include_input=False)
        text = f"invalid {'arguments' if tool else 'value'}" + (f" for {tool}" if tool else "")
        text += ": " + "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['msg']}" for e in problems
        )
    else:
        text = text_of(error)
    message = redact(text, limit=_MAX_MESSAGE)
    return ToolError(
        type=type(error).__name__,
        failure_class=verdict.failure_class,
        message=message,
        suggested_action=verdict.suggested_action,
        retriable=verdict.retriable and verdict.failure_class is FailureClass.TRANSIENT,
        retry_after_ms=retry_after,
        tool=tool,
        call_id=call_id,
        attempt=attempt,
        context=redact_value(dict(verdict.context)),
    )


def retriable(error: BaseException) -> bool:
    """True if `classify` would retry this exception; fits ``RetryPolicy(retry_on=...)``."""
    if isinstance(error, GraphBubbleUp):
        return False
    return classify(error).retriable


def unknown_tool_error(name: str, available: Sequence[str], *, call_id: str | None) -> ToolError:
    """The STRUCTURAL envelope for a call naming a tool the graph does not have."""
    close = difflib.get_close_matches(name, list(available), n=1)
    return ToolError(
        type="UnknownTool",
        failure_class=FailureClass.STRUCTURAL,
        message=f"Tool {name!r} does not exist. Available tools: {', '.join(sorted(available))}.",
        suggested_action=f"use_tool:{close[0]}" if close else "ask_human",
        retriable=False,
        tool=name,
        call_id=call_id,
        context={"available": sorted(available)},
    )
