"""The classifier: exception (+ tool profile) -> redacted `ToolError` envelope."""

import asyncio
import datetime as dt
import email.utils
import json
from typing import Any

import pytest
from langchain_core.exceptions import (
    ContextOverflowError,
    ModelAPIError,
    ModelAuthenticationError,
    ModelConnectionError,
    ModelInvalidRequestError,
    ModelNotFoundError,
    ModelRateLimitError,
    ModelRefusalError,
)
from langchain_core.tools import ToolException
from langgraph.errors import GraphInterrupt
from pydantic import BaseModel, ValidationError

from langgraph_resilience import FailureClass, ToolError, ToolProfile
from langgraph_resilience.core import (
    DEFAULT_RULES,
    Verdict,
    classify,
    http_status,
    retriable,
    retry_after_ms,
)
from langgraph_resilience.errors import CircuitOpenError, ToolFailure
from langgraph_resilience.testing import FakeHTTPError

T = FailureClass.TRANSIENT
S = FailureClass.SEMANTIC
ST = FailureClass.STRUCTURAL
P = FailureClass.POLICY
U = FailureClass.UNKNOWN

NOW = 1_700_000_000.0
"""A fixed wall-clock time for HTTP-date Retry-After values."""


# ----------------------------------------------------------- library look-alikes
# Shaped like the real client errors, so duck typing is proven without importing them.


class _HttpxResponse:
    """httpx.Response: ``.status_code``, ``.headers``, ``.text``."""

    def __init__(self, status_code: int, headers: dict[str, str] | None = None, text: str = ""):
        self.status_code = status_code
        self.headers = dict(headers or {})
        self.text = text


class HTTPStatusError(Exception):
    """httpx.HTTPStatusError: the status lives on ``.response``."""

    def __init__(self, message: str, *, response: _HttpxResponse) -> None:
        super().__init__(message)
        self.request = None
        self.response = response


class ConnectError(Exception):
    """httpx.ConnectError: recognized by name only (not a builtin ConnectionError)."""


class ReadTimeout(Exception):
    """httpx.ReadTimeout: recognized by name only (not a TimeoutError subclass)."""


class HTTPError(OSError):
    """requests.HTTPError (an IOError): ``.response.status_code``."""

    def __init__(self, message: str, *, response: _HttpxResponse) -> None:
        super().__init__(message)
        self.response = response


class ClientResponseError(Exception):
    """aiohttp.ClientResponseError: ``.status``, ``.message`` and ``.headers`` on the error."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(f"{status}, message={message!r}")
        self.status = status
        self.message = message
        self.headers = headers


class RateLimitError(Exception):
    """openai.RateLimitError: ``.status_code``, ``.response.headers`` and a JSON ``.body``."""

    def __init__(
        self,
        message: str,
        *,
        headers: dict[str, str] | None = None,
        body: dict[str, Any] | None = None,
        status_code: int | None = 429,
    ) -> None:
        super().__init__(message)
        if status_code is not None:
            self.status_code = status_code
        self.response = _HeadersOnly(headers or {})
        self.body = body


class _HeadersOnly:
    """An httpx.Response seen only through its headers (no status, no text)."""

    def __init__(self, headers: dict[str, str]) -> None:
        self.headers = headers


class OverloadedError(Exception):
    """anthropic.OverloadedError: ``.status_code`` 529."""

    status_code = 529


class InventoryGone(Exception):
    """A domain exception the classifier has never heard of."""


class _Args(BaseModel):
    city: str
    days: int


def _validation_error() -> ValidationError:
    try:
        _Args.model_validate({"city": "Oslo", "days": "many"})
    except ValidationError as exc:
        return exc
    raise AssertionError("unreachable")


def _json_error() -> json.JSONDecodeError:
    try:
        json.loads('{"city": ')
    except json.JSONDecodeError as exc:
        return exc
    raise AssertionError("unreachable")


def _raised_from(outer: BaseException, cause: BaseException | None) -> BaseException:
    """`outer` as it is after ``raise outer from cause``."""
    try:
        raise outer from cause
    except BaseException as exc:
        return exc


def _raised_while_handling(outer: BaseException, context: BaseException) -> BaseException:
    """`outer` raised inside ``except`` for `context`, without ``from``."""
    try:
        try:
            raise context
        except BaseException:
            raise outer  # noqa: B904 - the implicit context is what is under test
    except BaseException as exc:
        return exc


def _status(code: int, **kwargs: Any) -> FakeHTTPError:
    return FakeHTTPError(code, **kwargs)


# ------------------------------------------------------------ the classification table

CASES = [
    # timeouts
    pytest.param(TimeoutError("read timed out"), T, "retry", id="TimeoutError"),
    # the alias is the builtin since 3.11; the row pins that asyncio's spelling still classifies
    pytest.param(asyncio.TimeoutError(), T, "retry", id="asyncio.TimeoutError"),  # noqa: UP041
    pytest.param(ReadTimeout("timed out"), T, "retry", id="ReadTimeout-by-name"),
    # connections
    pytest.param(ConnectionResetError(104, "reset by peer"), T, "retry", id="ConnectionReset"),
    pytest.param(ConnectionRefusedError(111, "refused"), T, "retry", id="ConnectionRefused"),
    pytest.param(BrokenPipeError(32, "broken pipe"), T, "retry", id="BrokenPipe"),
    pytest.param(ConnectError("[Errno 111] refused"), T, "retry", id="httpx-ConnectError"),
    # HTTP statuses: transient
    *(pytest.param(_status(code), T, "retry", id=f"http-{code}") for code in (408, 425, 429)),
    *(pytest.param(_status(code), T, "retry", id=f"http-{code}") for code in (500, 502, 503, 504)),
    pytest.param(OverloadedError("overloaded"), T, "retry", id="anthropic-529"),
    # HTTP statuses: structural
    *(pytest.param(_status(code), ST, "ask_human", id=f"http-{code}") for code in (404, 405, 410)),
    pytest.param(_status(501), ST, "ask_human", id="http-501"),
    pytest.param(_status(505), ST, "ask_human", id="http-505"),
    # HTTP statuses: semantic
    *(pytest.param(_status(code), S, "fix_args", id=f"http-{code}") for code in (400, 409, 422)),
    pytest.param(_status(413), S, "fix_args", id="http-413"),
    # HTTP statuses: policy
    *(pytest.param(_status(code), P, "ask_human", id=f"http-{code}") for code in (401, 402, 403)),
    pytest.param(_status(407), P, "ask_human", id="http-407"),
    pytest.param(_status(451), P, "ask_human", id="http-451"),
    pytest.param(
        _status(429, body='{"error": {"code": "insufficient_quota"}}'),
        P,
        "ask_human",
        id="http-429-insufficient-quota",
    ),
    # duck-typed client libraries
    pytest.param(
        HTTPStatusError("Server error '503'", response=_HttpxResponse(503)),
        T,
        "retry",
        id="httpx-HTTPStatusError-503",
    ),
    pytest.param(
        HTTPStatusError("Client error '422'", response=_HttpxResponse(422)),
        S,
        "fix_args",
        id="httpx-HTTPStatusError-422",
    ),
    pytest.param(
        HTTPError("404 Client Error", response=_HttpxResponse(404)),
        ST,
        "ask_human",
        id="requests-HTTPError-404",
    ),
    pytest.param(
        HTTPError("403 Client Error", response=_HttpxResponse(403)),
        P,
        "ask_human",
        id="requests-HTTPError-403",
    ),
    pytest.param(
        ClientResponseError(502, "Bad Gateway"), T, "retry", id="aiohttp-ClientResponseError-502"
    ),
    pytest.param(ClientResponseError(401, "Unauthorized"), P, "ask_human", id="aiohttp-401-policy"),
    pytest.param(RateLimitError("Error code: 429"), T, "retry", id="openai-RateLimitError"),
    pytest.param(
        RateLimitError(
            "Error code: 429",
            body={"error": {"type": "insufficient_quota", "code": "insufficient_quota"}},
        ),
        P,
        "ask_human",
        id="openai-RateLimitError-quota",
    ),
    pytest.param(RateLimitError("slow down", status_code=None), T, "retry", id="RateLimit-by-name"),
    # semantic evidence
    pytest.param(_validation_error(), S, "fix_arg:days", id="pydantic-ValidationError"),
    pytest.param(_json_error(), S, "fix_args", id="JSONDecodeError"),
    pytest.param(ToolException("city must be a city"), S, "fix_args", id="ToolException"),
    # policy evidence
    pytest.param(PermissionError("scope 'write' missing"), P, "ask_human", id="PermissionError"),
    # classified on purpose by the tool
    pytest.param(
        ToolFailure(FailureClass.STRUCTURAL, "v1 retired", suggested_action="use_tool:search_v2"),
        ST,
        "use_tool:search_v2",
        id="ToolFailure-structural",
    ),
    pytest.param(ToolFailure("policy", "refund limit"), P, "ask_human", id="ToolFailure-policy"),
    pytest.param(ToolFailure("transient", "busy"), T, "retry", id="ToolFailure-transient"),
    pytest.param(ToolFailure("semantic", "bad date"), S, "fix_args", id="ToolFailure-semantic"),
    # cause chains
    pytest.param(
        _raised_from(ToolException("search failed"), TimeoutError("read timed out")),
        T,
        "retry",
        id="ToolException-from-TimeoutError",
    ),
    pytest.param(
        _raised_from(RuntimeError("upstream failed"), _status(503)),
        T,
        "retry",
        id="RuntimeError-from-503",
    ),
    pytest.param(
        _raised_from(RuntimeError("lookup failed"), _status(404)),
        ST,
        "ask_human",
        id="RuntimeError-from-404",
    ),
    pytest.param(
        _raised_while_handling(RuntimeError("wrapped"), ConnectionResetError()),
        T,
        "retry",
        id="implicit-context-followed",
    ),
    pytest.param(
        _raised_from(RuntimeError("hidden"), None), U, "ask_human", id="from-None-suppresses"
    ),
    # langchain-core's provider-neutral model errors (no status code of their own)
    pytest.param(ModelRateLimitError("slow down"), T, "retry", id="ModelRateLimitError"),
    pytest.param(ModelConnectionError("reset"), T, "retry", id="ModelConnectionError"),
    pytest.param(ModelAPIError("overloaded"), T, "retry", id="ModelAPIError"),
    pytest.param(ModelAuthenticationError("bad key"), P, "ask_human", id="ModelAuthError"),
    pytest.param(ModelRefusalError(), P, "ask_human", id="ModelRefusalError"),
    pytest.param(ContextOverflowError("too long"), S, "shorten_input", id="ContextOverflow"),
    pytest.param(ModelInvalidRequestError("bad"), S, "fix_args", id="ModelInvalidRequest"),
    pytest.param(ModelNotFoundError("gpt-9"), ST, "ask_human", id="ModelNotFoundError"),
    # nothing we understand: never retried
    pytest.param(KeyError("sku"), U, "ask_human", id="KeyError"),
    pytest.param(ValueError("odd"), U, "ask_human", id="ValueError"),
    pytest.param(InventoryGone("no stock"), U, "ask_human", id="custom-exception"),
    pytest.param(_status(302), U, "ask_human", id="http-302-not-an-error"),
]


@pytest.mark.parametrize(("error", "expected", "action"), CASES)
def test_classification_table(error: BaseException, expected: FailureClass, action: str) -> None:
    """Each kind of evidence maps to its class and action; only TRANSIENT is retriable."""
    envelope = classify(error)
    assert envelope.failure_class is expected
    assert envelope.suggested_action == action
    assert envelope.retriable is (expected is T)
    assert envelope.type == type(error).__name__


@pytest.mark.parametrize(("error", "expected", "action"), CASES)
def test_retriable_predicate_matches_classify(
    error: BaseException, expected: FailureClass, action: str
) -> None:
    """`retriable()` says yes exactly for the TRANSIENT rows of the table."""
    assert retriable(error) is (expected is T)


def test_table_covers_every_routed_class() -> None:
    """The table exercises every class the default rules can produce."""
    assert len(CASES) >= 35
    produced = {classify(case.values[0]).failure_class for case in CASES}
    assert produced == {T, S, ST, P, U}


# ----------------------------------------------------------------- envelope details


def test_envelope_carries_call_identity_and_status_context() -> None:
    """tool, call_id and attempt are copied in and the status code lands in context."""
    envelope = classify(_status(503), tool="search", call_id="call_1", attempt=2)
    assert (envelope.tool, envelope.call_id, envelope.attempt) == ("search", "call_1", 2)
    assert envelope.context["status_code"] == 503
    assert envelope.message == "HTTP 503"


def test_connection_context_distinguishes_refused_from_lost() -> None:
    """A refused connection never reached the server; a reset one may have."""
    assert classify(ConnectionRefusedError()).context["connection"] == "refused"
    assert classify(ConnectError("x")).context["connection"] == "refused"
    assert classify(ConnectionResetError()).context["connection"] == "lost"


def test_validation_error_names_every_failing_field_without_inputs() -> None:
    """The first failing field becomes fix_arg:<field>; context lists problems, not inputs."""
    with pytest.raises(ValidationError) as raised:
        _Args.model_validate({"city": 7, "days": "sk-live-secret-value"})
    envelope = classify(raised.value)
    assert envelope.suggested_action == "fix_arg:city"
    fields = [item["field"] for item in envelope.context["errors"]]
    assert fields == ["city", "days"]
    assert "sk-live-secret-value" not in json.dumps(envelope.context)


def test_nested_validation_error_names_the_dotted_path() -> None:
    """A nested field is named by its dotted location."""

    class Item(BaseModel):
        qty: int

    class Order(BaseModel):
        items: list[Item]

    with pytest.raises(ValidationError) as raised:
        Order.model_validate({"items": [{"qty": 1}, {"qty": "two"}]})
    assert classify(raised.value).suggested_action == "fix_arg:items.1.qty"


def test_tool_failure_keeps_its_retry_after_and_context() -> None:
    """A ToolFailure's own retry_after_ms and context reach the envelope."""
    error = ToolFailure("transient", "queue full", retry_after_ms=1500, context={"queue": "q1"})
    envelope = classify(error)
    assert envelope.retry_after_ms == 1500
    assert envelope.context == {"queue": "q1"}
    assert envelope.message == "queue full"


def test_message_of_an_exception_without_text_is_its_type_name() -> None:
    """An exception with an empty message still explains itself."""
    assert classify(TimeoutError()).message == "TimeoutError"


def test_long_messages_are_truncated() -> None:
    """The model never receives an unbounded error message."""
    assert len(classify(RuntimeError("x" * 10_000)).message) == 500


@pytest.mark.parametrize(
    "error",
    [
        _status(429, headers={"Retry-After": "3"}),
        _validation_error(),
        ToolFailure("policy", "no", context={"limit": 5, "nested": {"a": [1, 2]}}),
        KeyError("k"),
    ],
)
def test_envelope_round_trips_through_json(error: BaseException) -> None:
    """The envelope is JSON-only: dump and validate give back an equal envelope."""
    envelope = classify(error, tool="t", call_id="c", attempt=1)
    assert ToolError.model_validate_json(envelope.model_dump_json()) == envelope


# -------------------------------------------------------------------------- GraphBubbleUp


def test_graph_interrupt_is_reraised_not_classified() -> None:
    """LangGraph control flow passes through classify untouched."""
    signal = GraphInterrupt()
    with pytest.raises(GraphInterrupt) as raised:
        classify(signal)
    assert raised.value is signal


def test_graph_interrupt_is_never_retriable() -> None:
    """The predicate form answers False rather than raising, as RetryPolicy expects."""
    assert retriable(GraphInterrupt()) is False


# ------------------------------------------------------------------------------ Retry-After


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        pytest.param({"Retry-After": "7"}, 7000, id="seconds"),
        pytest.param({"Retry-After": " 7 "}, 7000, id="seconds-padded"),
        pytest.param({"Retry-After": "0"}, 0, id="zero"),
        pytest.param({"Retry-After": "1.5"}, 1500, id="float"),
        pytest.param({"Retry-After": "1.001"}, 1001, id="float-rounded-not-truncated"),
        pytest.param({"retry-after-ms": "250"}, 250, id="retry-after-ms"),
        pytest.param({"Retry-After-Ms": "250", "Retry-After": "9"}, 250, id="ms-wins"),
        pytest.param({"retry-after-ms": "soon", "Retry-After": "9"}, 9000, id="bad-ms-falls-back"),
        pytest.param({"RETRY-AFTER": "4"}, 4000, id="upper-case"),
        pytest.param({"retry-after": "4"}, 4000, id="lower-case"),
        pytest.param({"Retry-After": "soon"}, None, id="garbage"),
        pytest.param({"Retry-After": ""}, None, id="empty"),
        pytest.param({"Retry-After": "-3"}, None, id="negative"),
        pytest.param({"retry-after-ms": "-3"}, None, id="negative-ms"),
        pytest.param({"Retry-After": "nan"}, None, id="nan"),
        pytest.param({"Retry-After": "inf"}, None, id="inf"),
        pytest.param({"Retry-After": "1e308"}, None, id="overflows-in-ms"),
        pytest.param({"retry-after-ms": "1e400", "Retry-After": "2"}, 2000, id="ms-overflow"),
        pytest.param({}, None, id="absent"),
    ],
)
def test_retry_after_header_values(headers: dict[str, str], expected: int | None) -> None:
    """Retry-After (seconds) and retry-after-ms parse to exact milliseconds, else None."""
    assert retry_after_ms(_status(503, headers=headers), now=NOW) == expected


@pytest.mark.parametrize(
    ("offset", "expected"), [(120.0, 120_000), (0.0, 0), (-30.0, 0), (3600.0, 3_600_000)]
)
def test_retry_after_http_date(offset: float, expected: int) -> None:
    """An HTTP-date Retry-After is measured from `now`; a date in the past means 0."""
    when = dt.datetime.fromtimestamp(NOW + offset, tz=dt.UTC)
    header = email.utils.format_datetime(when, usegmt=True)
    assert retry_after_ms(_status(503, headers={"Retry-After": header}), now=NOW) == expected


def test_retry_after_http_date_with_fractional_now() -> None:
    """Sub-second wall time still gives the exact remaining milliseconds."""
    when = dt.datetime.fromtimestamp(NOW + 10, tz=dt.UTC)
    header = email.utils.format_datetime(when, usegmt=True)
    error = _status(429, headers={"Retry-After": header})
    assert retry_after_ms(error, now=NOW + 0.25) == 9750


def test_retry_after_reaches_the_transient_envelope() -> None:
    """classify copies Retry-After into a TRANSIENT envelope."""
    when = dt.datetime.fromtimestamp(NOW + 42, tz=dt.UTC)
    header = email.utils.format_datetime(when, usegmt=True)
    envelope = classify(_status(503, headers={"Retry-After": header}), now=NOW)
    assert envelope.retry_after_ms == 42_000


def test_absurd_retry_after_does_not_crash_classify() -> None:
    """A header too large to express in milliseconds is ignored, not an OverflowError."""
    envelope = classify(_status(503, headers={"Retry-After": "1e308"}))
    assert (envelope.failure_class, envelope.retry_after_ms) == (T, None)


def test_retry_after_is_not_attached_to_non_transient_envelopes() -> None:
    """A 403 with Retry-After still goes to a human; no wait is suggested."""
    envelope = classify(_status(403, headers={"Retry-After": "5"}))
    assert envelope.failure_class is P
    assert envelope.retry_after_ms is None


def test_retry_after_from_duck_typed_libraries() -> None:
    """httpx (response headers), aiohttp (error headers) and openai (retry-after-ms) all parse."""
    httpx_like = HTTPStatusError("x", response=_HttpxResponse(429, {"Retry-After": "2"}))
    aiohttp_like = ClientResponseError(503, "busy", headers={"Retry-After": "3"})
    openai_like = RateLimitError("429", headers={"retry-after-ms": "1250", "retry-after": "2"})
    assert classify(httpx_like).retry_after_ms == 2000
    assert classify(aiohttp_like).retry_after_ms == 3000
    assert classify(openai_like).retry_after_ms == 1250


def test_retry_after_attribute_in_seconds() -> None:
    """An exception's own ``retry_after`` (seconds) counts when there is no header."""
    assert retry_after_ms(CircuitOpenError("search", 2.5)) == 2500


def test_retry_after_cause_chain_uses_the_evidence_link() -> None:
    """The Retry-After is read from the exception in the chain that matched."""
    wrapped = _raised_from(RuntimeError("x"), _status(429, headers={"Retry-After": "6"}))
    assert classify(wrapped).retry_after_ms == 6000


def test_http_status_ignores_non_status_attributes() -> None:
    """Only an int in 100..599 is a status: bools, strings and out-of-range values are not."""

    class Odd(Exception):
        status = True
        status_code = "503"

    class OutOfRange(Exception):
        status_code = 42

    assert http_status(Odd()) is None
    assert http_status(OutOfRange()) is None
    assert http_status(_status(418)) == 418


# ------------------------------------------------------------------------- side effects

SIDE_EFFECT = ToolProfile(side_effect=True)


@pytest.mark.parametrize(
    "error",
    [
        pytest.param(TimeoutError("lost response"), id="timeout"),
        pytest.param(ReadTimeout("lost response"), id="read-timeout"),
        pytest.param(_status(502), id="502"),
        pytest.param(_status(504), id="504"),
        pytest.param(ConnectionResetError(), id="reset"),
    ],
)
def test_side_effect_lost_response_is_unknown(error: BaseException) -> None:
    """On a side-effecting tool a lost response may have executed: reconcile, never retry."""
    envelope = classify(error, profile=SIDE_EFFECT)
    assert envelope.failure_class is U
    assert envelope.suggested_action == "query_status"
    assert envelope.retriable is False
    assert envelope.context["maybe_executed"] is True


@pytest.mark.parametrize(
    "error",
    [
        pytest.param(_status(429, headers={"Retry-After": "2"}), id="429"),
        pytest.param(_status(503), id="503"),
        pytest.param(ConnectionRefusedError(), id="refused"),
        pytest.param(ConnectError("refused"), id="httpx-connect-error"),
    ],
)
def test_side_effect_never_executed_stays_transient(error: BaseException) -> None:
    """429, 503 and a refused connection prove the effect did not happen."""
    envelope = classify(error, profile=SIDE_EFFECT)
    assert envelope.failure_class is T
    assert envelope.retriable is True
    assert "maybe_executed" not in envelope.context


def test_side_effect_keeps_non_transient_classes() -> None:
    """Only TRANSIENT verdicts are reconsidered for side effects."""
    assert classify(_status(403), profile=SIDE_EFFECT).failure_class is P
    assert classify(_status(422), profile=SIDE_EFFECT).failure_class is S


def test_read_only_profile_changes_nothing() -> None:
    """A profile without side_effect classifies a timeout as TRANSIENT."""
    assert classify(TimeoutError(), profile=ToolProfile()).failure_class is T


# ------------------------------------------------------------------------------ user rules


def _maintenance_rule(error: BaseException, profile: ToolProfile | None) -> Verdict | None:
    if http_status(error) == 503 and "maintenance" in str(error):
        return Verdict(FailureClass.STRUCTURAL, "use_tool:mirror", context={"why": "maint"})
    return None


class MaintenanceError(FakeHTTPError):
    def __init__(self) -> None:
        super().__init__(503)
        self.args = ("scheduled maintenance",)


def test_user_rule_takes_precedence_over_defaults() -> None:
    """A rule placed before DEFAULT_RULES overrides what the defaults would say."""
    envelope = classify(MaintenanceError(), rules=(_maintenance_rule, *DEFAULT_RULES))
    assert envelope.failure_class is ST
    assert envelope.suggested_action == "use_tool:mirror"
    assert envelope.context == {"why": "maint"}
    assert classify(MaintenanceError()).failure_class is T


def test_user_rule_passing_falls_through_to_defaults() -> None:
    """A rule returning None leaves the default table in charge."""
    envelope = classify(_status(503), rules=(_maintenance_rule, *DEFAULT_RULES))
    assert envelope.failure_class is T


def test_user_rule_recognizes_a_domain_exception() -> None:
    """Users teach the classifier about their own exceptions."""

    def inventory(error: BaseException, profile: ToolProfile | None) -> Verdict | None:
        if isinstance(error, InventoryGone):
            return Verdict(FailureClass.TRANSIENT, "retry", retriable=True, retry_after_ms=900)
        return None

    envelope = classify(InventoryGone("restocking"), rules=(inventory, *DEFAULT_RULES))
    assert (envelope.failure_class, envelope.retriable, envelope.retry_after_ms) == (T, True, 900)


def test_retriable_verdict_outside_transient_is_not_retriable() -> None:
    """Only TRANSIENT envelopes are retriable, whatever a rule claims."""

    def sloppy(error: BaseException, profile: ToolProfile | None) -> Verdict:
        return Verdict(FailureClass.SEMANTIC, "fix_args", retriable=True)

    assert classify(KeyError("x"), rules=(sloppy,)).retriable is False


def test_empty_rule_table_classifies_everything_unknown() -> None:
    """With no rules nothing is understood, so nothing is retried."""
    envelope = classify(TimeoutError(), rules=())
    assert (envelope.failure_class, envelope.retriable) == (U, False)


# -------------------------------------------------------------------------------- secrets

SECRETS = ("sk-abc123456789", "abc123456789", "hunter2", "tok_9f8e7d6c5b4a", "ghp_Zx81bc9d0e1f2")


@pytest.mark.parametrize(
    "message",
    [
        pytest.param("401 calling API with Authorization: Bearer sk-abc123456789", id="auth"),
        pytest.param("request failed: Bearer sk-abc123456789 rejected", id="bearer"),
        pytest.param("cannot connect to postgresql://u:hunter2@h/db", id="dsn"),
        pytest.param("login failed for password=hunter2 user=app", id="password"),
        pytest.param(
            "Authorization: Bearer sk-abc123456789 at postgresql://u:hunter2@h/db password=hunter2",
            id="all-at-once",
        ),
    ],
)
def test_secrets_never_reach_the_envelope(message: str) -> None:
    """No credential from the message or the response body survives into the JSON."""
    error = FakeHTTPError(
        500,
        headers={"Authorization": "Bearer sk-abc123456789"},
        body='{"access_token": "tok_9f8e7d6c5b4a", "hint": "ghp_Zx81bc9d0e1f2"}',
    )
    error.args = (message,)
    dumped = classify(error, tool="t", call_id="c").model_dump_json()
    for secret in SECRETS:
        assert secret not in dumped
    assert "[REDACTED]" in dumped or "***" in dumped


def test_secrets_in_a_cause_chain_message_are_redacted() -> None:
    """The outer message is what the model sees, and it is scrubbed too."""
    error = _raised_from(RuntimeError("retrying with password=hunter2"), TimeoutError())
    assert "hunter2" not in classify(error).model_dump_json()


def test_secrets_in_tool_failure_context_are_redacted() -> None:
    """Secret-named context keys are blanked and secret-shaped values scrubbed."""
    error = ToolFailure(
        "policy",
        "denied",
        context={"api_key": "plain-value-1", "detail": "token=abc123xyz", "ok": 1},
    )
    dumped = classify(error).model_dump_json()
    assert "plain-value-1" not in dumped
    assert "abc123xyz" not in dumped
    assert '"ok":1' in dumped


def test_token_straddling_the_body_limit_does_not_leak() -> None:
    """A token cut by the body's length limit is still redacted, not left half-visible."""
    body = "x" * 290 + " ghp_abcdefghijklmnopqrstuvwxyz"
    dumped = classify(FakeHTTPError(500, body=body)).model_dump_json()
    assert "ghp_" not in dumped
    assert "abcde" not in dumped
