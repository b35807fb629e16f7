"""A secret of every kind, planted in every place a failure is shown, is found in none.

`PLANTED` is the table of the 15 kinds (with variants): the text that carries the
secret and the distinctive parts of it that must never come out. Each test puts the
text into one place (an exception's text, an HTTP body, a `ToolFailure`'s context
with nested lists, the repair prompt, the planner's prompt, the escalation request,
an emitted event) and searches what comes out for every distinctive part.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_core.messages import BaseMessage, HumanMessage
from langchain_core.tools import tool

from langgraph_resilience._graph.escalate import escalation_request
from langgraph_resilience._graph.repair import repair_prompt
from langgraph_resilience.core import add_secret_pattern
from langgraph_resilience.core.classification import classify
from langgraph_resilience.core.plan import (
    Diagnosis,
    Plan,
    PlanStep,
    PlanVerdict,
    RejectionReason,
    format_plan_request,
)
from langgraph_resilience.core.redaction import TRUNCATED, redact, redact_value
from langgraph_resilience.errors import ConfigurationError, FailureClass, ToolError, ToolFailure
from langgraph_resilience.events import Event, emit
from langgraph_resilience.testing import FakeHTTPError


@dataclass(frozen=True)
class Planted:
    """One kind of secret: the text carrying it and the parts that must not come out."""

    kind: str
    text: str
    parts: tuple[str, ...]
    structured: dict[str, Any] = field(default_factory=dict)
    """The same secret as a JSON-like value, for places that take one (a context)."""


PLANTED: tuple[Planted, ...] = (
    Planted(
        "authorization-bearer",
        "GET /v1 failed: Authorization: Bearer AuthBrr0Tok3nXyZ42",
        ("AuthBrr0Tok3nXyZ42",),
        {"headers": {"Authorization": "Bearer AuthBrr0Tok3nXyZ42"}},
    ),
    Planted(
        "authorization-basic",
        "proxy said authorization=Basic QmFzaWNVc2VyOkJhc2ljUHcx",
        ("QmFzaWNVc2VyOkJhc2ljUHcx",),
        {"request": [{"Proxy-Authorization": "Basic QmFzaWNVc2VyOkJhc2ljUHcx"}]},
    ),
    Planted(
        "bare-bearer",
        "upstream rejected bearer BareT0kenQq77.zz after retry",
        ("BareT0kenQq77",),
        {"sent": ["bearer BareT0kenQq77.zz"]},
    ),
    Planted(
        "api-key-shapes",
        "keys sk-proj-Sh4peSkKey0123 ghp_Sh4peGhKey012345 xoxb-1234-Sh4peSlack99 "
        "AKIASH4PEAWSKEY01234 all refused",
        ("Sh4peSkKey0123", "Sh4peGhKey012345", "Sh4peSlack99", "SH4PEAWSKEY01234"),
        {"tried": [["sk-proj-Sh4peSkKey0123"], {"gh": "ghp_Sh4peGhKey012345"}]},
    ),
    Planted(
        "jwt",
        "got eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJQbGFudGVkSnd0In0.PlantedJwtSig_x-42 "
        "and jwt=Opaq0eJwtVal99 back",
        ("eyJzdWIiOiJQbGFudGVkSnd0In0", "PlantedJwtSig", "Opaq0eJwtVal99"),
        {
            "id_token": "x",
            "claims": ["eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJQbGFudGVkSnd0In0.PlantedJwtSig"],
        },
    ),
    Planted(
        "cookie",
        "request headers: Cookie: sid=C00kieSid42; theme=dark; csrf=C00kieCsrf42",
        ("C00kieSid42", "C00kieCsrf42"),
        {"headers": [["Cookie", "sid=C00kieSid42; csrf=C00kieCsrf42"]]},
    ),
    Planted(
        "set-cookie",
        "response: Set-Cookie: session=SetC00kieVal77; Path=/; HttpOnly",
        ("SetC00kieVal77",),
        {"response": {"headers": {"set-cookie": "session=SetC00kieVal77; Path=/"}}},
    ),
    Planted(
        "session-id",
        "X-Session-Id: S3ssHdrVal31 and session_id=S3ssKvVal12 expired",
        ("S3ssHdrVal31", "S3ssKvVal12"),
        {"headers": [{"X-Session-Id": "S3ssHdrVal31"}], "sessionId": "S3ssKvVal12"},
    ),
    Planted(
        "pem-private-key",
        "private_key=-----BEGIN RSA PRIVATE KEY-----\nMIIEpQIBAAKCAQEAPemB0dyLine1\n"
        "PemB0dyLine2xYz==\n-----END RSA PRIVATE KEY-----\nwas rejected",
        ("PemB0dyLine1", "PemB0dyLine2"),
        {"config": {"signing": "-----BEGIN PRIVATE KEY-----\nPemB0dyLine1\nPemB0dyLine2"}},
    ),
    Planted(
        "passphrase",
        "unlock failed: passphrase=Tr0ub4dor &3 Phr4seW0rd",
        ("Tr0ub4dor", "Phr4seW0rd"),
        {"key": {"passphrase": "Tr0ub4dor &3 Phr4seW0rd"}},
    ),
    Planted(
        "password-unquoted",
        "login failed: password=Qz9 h0rse&3 b4tteryStaple",
        ("Qz9 h0rse", "h0rse&3", "b4tteryStaple"),
        {"attempts": [{"form": {"password": "Qz9 h0rse&3 b4tteryStaple"}}]},
    ),
    Planted(
        "password-quoted",
        "login password='Qz9 h0rse&3 b4tteryStaple' user=app failed",
        ("Qz9 h0rse", "h0rse&3", "b4tteryStaple"),
        {"dbPassword": "Qz9 h0rse&3 b4tteryStaple"},
    ),
    Planted(
        "password-json",
        'body {"user": "app", "password": "Qz9 h0rse&3 b4tt\\"eryStaple"} refused',
        ("Qz9 h0rse", "h0rse&3", "b4tt", "eryStaple"),
        {"body": '{"user": "app", "password": "Qz9 h0rse&3 b4tt\\"eryStaple"}'},
    ),
    Planted(
        "nested-secret-keys",
        'detail {"request": {"headers": [{"X-Api-Key": "N3stedApiKey55"}], '
        '"auth": {"password": "N3stedPw66"}}}',
        ("N3stedApiKey55", "N3stedPw66"),
        {
            "request": {
                "headers": [{"X-Api-Key": "N3stedApiKey55"}],
                "credentials": {"user": "u", "pin": "N3stedPin77"},
                "tries": [[{"apiKey": "N3stedApiKey55"}], ("password=N3stedPw66",)],
            }
        },
    ),
    Planted(
        "keyword-dsn",
        "connect failed: host=db user=app password='s3 cr&tKwDsn' dbname=x; "
        "host=db2 password=Kw0rdDsnPw2 sslmode=require",
        ("cr&tKwDsn", "Kw0rdDsnPw2"),
        {"conninfo": ["host=db user=app password='s3 cr&tKwDsn' dbname=x"]},
    ),
    Planted(
        "url-dsn-raw-at",
        "cannot reach postgresql://app:p@ssUrlDsn9@db.internal:5432/x now",
        ("ssUrlDsn9", "p@ss"),
        {"targets": [{"url": "postgresql://app:p@ssUrlDsn9@db.internal:5432/x"}]},
    ),
    Planted(
        "client-secret-access-key-token",
        "client_secret=Cl1entSec77 aws_secret_access_key=Acc3ssKey88 token=T0kPair99 "
        "access_token=AccT0k11 rejected",
        ("Cl1entSec77", "Acc3ssKey88", "T0kPair99", "AccT0k11"),
        {"oauth": [{"client_secret": "Cl1entSec77"}, {"note": "token=T0kPair99"}]},
    ),
    # the ten kinds issue 39 found surviving, each in its public format
    Planted(
        "stripe-secret-key",
        "stripe: Invalid API Key sk_live_51StrpSecKeyAbCdEfGh0123456789 (livemode)",
        ("StrpSecKeyAbCdEfGh0123456789",),
        {"charge": {"client": "sk_live_51StrpSecKeyAbCdEfGh0123456789"}},
    ),
    Planted(
        "stripe-restricted-key",
        "restricted key rk_live_51StrpRstKeyZyXwVu9876543210 lacks the scope",
        ("StrpRstKeyZyXwVu9876543210",),
        {"tried": ["rk_live_51StrpRstKeyZyXwVu9876543210"]},
    ),
    Planted(
        "google-api-key",
        "GET https://maps.example/geocode?address=x&k=AIzaSyGoogKeyA1b2C3d4E5f6G7h8I9j0K1l2M3 403",
        ("SyGoogKeyA1b2C3d4E5f6G7h8I9j0K1l2M3",),
        {"request": {"params": [["k", "AIzaSyGoogKeyA1b2C3d4E5f6G7h8I9j0K1l2M3"]]}},
    ),
    Planted(
        "azure-account-key",
        "DefaultEndpointsProtocol=https;AccountName=acct;"
        "AccountKey=AzAccKey0123456789abcdefGHIJKL+/mnopQRSTuvwx==;EndpointSuffix=core.windows.net",
        ("AzAccKey0123456789abcdefGHIJKL",),
        {"conn": "AccountName=acct;AccountKey=AzAccKey0123456789abcdefGHIJKL+/mnopQRSTuvwx=="},
    ),
    Planted(
        "azure-sas-signature",
        "PUT https://acct.blob.core.windows.net/c/b?sv=2022-11-02&se=2026-01-01&sp=rw"
        "&sig=AzSasSig0123abcdEFGH%2Bijkl%3D failed: 403",
        ("AzSasSig0123abcdEFGH",),
        {"url": "https://acct.blob.core.windows.net/c/b?sp=rw&sig=AzSasSig0123abcdEFGH%2B"},
    ),
    Planted(
        "slack-app-token",
        "socket mode refused xapp-1-A0SlkApp01-1234567890123-SlkAppTok0abcdef0123",
        ("SlkAppTok0abcdef0123", "A0SlkApp01"),
        {"slack": {"app": "xapp-1-A0SlkApp01-1234567890123-SlkAppTok0abcdef0123"}},
    ),
    Planted(
        "twilio-api-key",
        "twilio auth with SK0123456789abcdef0123456789abcdef failed: 20003",
        ("0123456789abcdef0123456789abcdef",),
        {"twilio": ["SK0123456789abcdef0123456789abcdef"]},
    ),
    Planted(
        "sendgrid-key",
        "sendgrid 401 for SG.SgId0123456789abcdefg.SgSecret0123456789abcdefghijklmnopqrstuvwxyzAB",
        ("SgId0123456789abcdefg", "SgSecret0123456789abcdefghij"),
        {"mail": {"client": "SG.SgId0123456789abcdefg.SgSecret0123456789abcdefghijklmnopqrstuvwx"}},
    ),
    Planted(
        "npm-token",
        "npm ERR! 401 with npm_NpmTok0123456789abcdefghijklmnopqrstuv",
        ("NpmTok0123456789abcdefghij",),
        {"npmrc": ["//registry.npmjs.org/:_auth=x", "npm_NpmTok0123456789abcdefghijklmnopqrstuv"]},
    ),
    Planted(
        "huggingface-token",
        "hub download failed with hf_HfTok0123456789abcdefghijklmnopqrst",
        ("HfTok0123456789abcdefghij",),
        {"hub": {"headers": {"X-Hub": "hf_HfTok0123456789abcdefghijklmnopqrst"}}},
    ),
)
KINDS = [pytest.param(p, id=p.kind) for p in PLANTED]


def leaked(output: str, planted: Planted) -> list[str]:
    """The distinctive parts of `planted` that appear in `output`."""
    return [part for part in planted.parts if part in output]


def dumped(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def prompt_text(messages: Iterable[BaseMessage]) -> str:
    return "\n".join(str(m.content) for m in messages)


# ------------------------------------------------------------------- the table


def test_the_table_covers_the_twenty_five_kinds() -> None:
    """Twenty-five kinds (the password one in three forms), each with its text and parts."""
    kinds = {"password" if p.kind.startswith("password-") else p.kind for p in PLANTED}
    assert len(kinds) == 25
    for planted in PLANTED:
        assert all(part in planted.text for part in planted.parts), planted.kind


@pytest.mark.parametrize("planted", KINDS)
def test_redact_removes_every_kind(planted: Planted) -> None:
    """Free text, read whole or to the default limit, keeps no part of the secret."""
    assert leaked(redact(planted.text), planted) == []
    assert leaked(redact(planted.text, limit=None), planted) == []
    assert redact(redact(planted.text)) == redact(planted.text)


@pytest.mark.parametrize("planted", KINDS)
def test_redact_value_removes_every_kind(planted: Planted) -> None:
    """The JSON-like form, nested in dicts, lists and tuples, keeps none of it either."""
    value = {"wrapped": [planted.structured, {"text": planted.text}], "top": planted.text}
    assert leaked(dumped(redact_value(value)), planted) == []


# ------------------------------------------------------------- the truncation cut


def _halves(planted: Planted) -> list[str]:
    return [part[: max(4, math.ceil(len(part) / 2))] for part in planted.parts]


@pytest.mark.parametrize("planted", KINDS)
def test_a_cut_through_the_secret_leaks_no_first_half(planted: Planted) -> None:
    """Wherever the limit cuts the text, no first half of a secret is left behind."""
    prefix = "upstream error, see details: "
    text = prefix + planted.text + " (end)"
    for limit in range(len(prefix) + 1, len(text) + 2):
        out = redact(text, limit=limit)
        assert len(out) <= limit
        assert [h for h in _halves(planted) if h in out] == [], (limit, out)
        if limit < len(text):
            assert out.endswith(TRUNCATED)


_CONTEXT = st.lists(
    st.sampled_from(
        [
            *(" ", "x", "ok", "=", ":", "&", ";", ",", '"', "'", "@", "/", "-", "_", "\n"),
            *("{", "}", "[", "]", "\\", "a=b", "token:", "pwd=", "Cookie:", "://", "user"),
            "password",
        ]
    ),
    max_size=12,
).map("".join)


@settings(max_examples=300, deadline=None)
@given(
    planted=st.sampled_from(PLANTED),
    before=_CONTEXT,
    after=_CONTEXT,
    cut=st.integers(min_value=0, max_value=400),
)
def test_secrets_survive_no_surrounding_text(
    planted: Planted, before: str, after: str, cut: int
) -> None:
    """Whatever stands around the secret, and wherever the cut falls, nothing leaks."""
    text = f"{before} {planted.text} {after}"
    assert leaked(redact(text, limit=None), planted) == []
    out = redact(text, limit=max(len(TRUNCATED) + 1, cut))
    assert [h for h in _halves(planted) if h in out] == []


# ------------------------------------------------------------------ the places


def _raised_from(outer: BaseException, cause: BaseException | None) -> BaseException:
    try:
        raise outer from cause
    except BaseException as exc:
        return exc


class BodyError(Exception):
    """An SDK-style error: a status and a parsed JSON body (``.body``)."""

    def __init__(self, status_code: int, body: Any) -> None:
        super().__init__(f"HTTP {status_code}")
        self.status_code = status_code
        self.body = body


@pytest.mark.parametrize("planted", KINDS)
def test_exception_text_to_envelope(planted: Planted) -> None:
    """The message the model reads, from the exception and from its cause chain."""
    for error in (
        RuntimeError(planted.text),
        _raised_from(RuntimeError(planted.text), TimeoutError("read timed out")),
        _raised_from(PermissionError(f"denied: {planted.text}"), ValueError(planted.text)),
    ):
        envelope = classify(error, tool="login", call_id="c1")
        assert envelope.message
        assert leaked(envelope.model_dump_json(), planted) == []


@pytest.mark.parametrize("planted", KINDS)
def test_http_body_to_envelope(planted: Planted) -> None:
    """The body of a 500 (text) and of a 403 (a parsed JSON body with nested lists)."""
    text_body = classify(FakeHTTPError(500, body=planted.text), tool="login")
    json_body = classify(
        BodyError(403, {"error": {"detail": planted.text, "items": [planted.structured]}}),
        tool="login",
    )
    for envelope in (text_body, json_body):
        assert "body" in envelope.context
        assert leaked(envelope.model_dump_json(), planted) == []


@pytest.mark.parametrize("planted", KINDS)
def test_tool_failure_context_to_envelope(planted: Planted) -> None:
    """A tool's own context: secrets inside lists of dicts, lists of lists, tuples."""
    error = ToolFailure(
        FailureClass.POLICY,
        f"refused: {planted.text}",
        context={
            "attempts": [{"detail": planted.text}, [planted.text, {"x": [planted.text]}]],
            "raw": (planted.text,),
            **planted.structured,
        },
    )
    envelope = classify(error, tool="login", call_id="c1")
    assert envelope.context["attempts"]
    assert leaked(envelope.model_dump_json(), planted) == []


@tool
def login(user: str, password: str, note: str = "") -> str:
    """Log in."""
    return "ok"


def _args(planted: Planted) -> dict[str, Any]:
    return {
        "user": "u",
        "password": planted.parts[0],
        "note": planted.text,
        "options": [{"headers": planted.structured}],
    }


def _raw_envelope(planted: Planted) -> ToolError:
    """An envelope as another path could build it, not redacted by `classify`."""
    return ToolError(
        type="RuntimeError",
        failure_class=FailureClass.SEMANTIC,
        message=planted.text,
        suggested_action="fix_args",
        retriable=False,
        tool="login",
        call_id="c1",
        context={"detail": [planted.text], **planted.structured},
    )


@pytest.mark.parametrize("planted", KINDS)
def test_repair_prompt(planted: Planted) -> None:
    """The user's words, the failed arguments, the envelope and the earlier attempts."""
    record: Any = {
        "tool": "login",
        "args": _args(planted),
        "trail": [{"args": _args(planted), "error": {"message": planted.text}}],
    }
    messages = repair_prompt(
        [HumanMessage(f"please log in, {planted.text}")], login, record, _raw_envelope(planted)
    )
    text = prompt_text(messages)
    assert '"password": "[REDACTED]"' in text
    assert '"user": "u"' in text
    assert leaked(text, planted) == []


@pytest.mark.parametrize("planted", KINDS)
def test_planner_prompt(planted: Planted) -> None:
    """The goal, the envelopes, the failed arguments, the rejection and its plan."""
    rejected_plan = Plan(
        diagnosis=Diagnosis(failed_tool="login", failure_class="semantic", cause=planted.text),
        rationale=f"retry login with {planted.text}",
        steps=[PlanStep(id="s1", tool="login", args=_args(planted))],
    )
    messages = format_plan_request(
        goal=f"log in: {planted.text}",
        failures=[_raw_envelope(planted)],
        tools=[login],
        arguments={"c1": _args(planted)},
        rejected=PlanVerdict(reasons=(RejectionReason(code="invalid_args", message=planted.text),)),
        rejected_plan=rejected_plan,
    )
    text = prompt_text(messages)
    assert '"password": "[REDACTED]"' in text
    assert '"password": {' in text  # the tool's schema is shown as it is
    assert leaked(text, planted) == []


@pytest.mark.parametrize("planted", KINDS)
def test_escalation_request(planted: Planted) -> None:
    """What the human sees (and the checkpoint keeps): arguments masked, envelope redacted."""
    record: Any = {"tool": "login", "args": _args(planted)}
    request = escalation_request("c1", record, _raw_envelope(planted))
    assert request["args"]["password"] == "[REDACTED]"
    assert request["args"]["user"] == "u"
    assert leaked(dumped(request), planted) == []


@pytest.mark.parametrize("planted", KINDS)
def test_emitted_event(planted: Planted, caplog: pytest.LogCaptureFixture) -> None:
    """An event carrying the secret (a string field, a nested one, a secret-named one)
    is logged without it."""
    with caplog.at_level(logging.INFO, logger="langgraph_resilience"):
        emit(
            Event(
                "attempt",
                tool="login",
                call_id="c1",
                error=planted.text,
                detail={"nested": [planted.text, planted.structured]},
                password=planted.parts[0],
            )
        )
    assert "attempt" in caplog.text
    assert leaked(caplog.text, planted) == []


# ---------------------------------------------------- generated credentials of every kind

_ALNUM = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
_HEX = "0123456789abcdef"


def _chars(alphabet: str, low: int, high: int | None = None) -> st.SearchStrategy[str]:
    return st.text(alphabet, min_size=low, max_size=low if high is None else high)


_ECHOED = _chars(_ALNUM + "-_.*+/=~!@#$%^:", 12, 60).filter(lambda s: s.strip(".") == s)
GENERATED: dict[str, st.SearchStrategy[tuple[str, str]]] = {
    # kind: (the credential as it stands in a text, the secret part that must not come out)
    "stripe": st.tuples(
        st.sampled_from(["sk", "rk"]), st.sampled_from(["live", "test"]), _chars(_ALNUM, 24, 99)
    ).map(lambda p: (f"{p[0]}_{p[1]}_{p[2]}", p[2])),
    "google": _chars(_ALNUM + "-_", 35).map(lambda s: (f"AIza{s}", s)),
    "azure-account-key": _chars(_ALNUM + "+/", 86).map(lambda s: (f"AccountKey={s}==;", s)),
    "azure-sas": _chars(_ALNUM + "%", 20, 60).map(lambda s: (f"?sv=2022-11-02&sig={s}&sp=r", s)),
    "slack-app": _chars(_HEX, 64).map(lambda s: (f"xapp-1-A0ABCDEFGHI-1234567890123-{s}", s)),
    "twilio": _chars(_HEX, 32).map(lambda s: (f"SK{s}", s)),
    "sendgrid": st.tuples(_chars(_ALNUM + "-_", 22), _chars(_ALNUM + "-_", 43)).map(
        lambda p: (f"SG.{p[0]}.{p[1]}", p[1])
    ),
    "npm": _chars(_ALNUM, 36).map(lambda s: (f"npm_{s}", s)),
    "huggingface": _chars(_ALNUM, 34).map(lambda s: (f"hf_{s}", s)),
    "openai": _chars(_ALNUM + "-_", 20, 80).map(lambda s: (f"sk-proj-{s}", s)),
    "anthropic": _chars(_ALNUM + "-_", 20, 80).map(lambda s: (f"sk-ant-api03-{s}", s)),
    "github": _chars(_ALNUM, 36).map(lambda s: (f"ghp_{s}", s)),
    "slack-bot": _chars(_ALNUM, 24).map(lambda s: (f"xoxb-123456789012-{s}", s)),
    "aws-access-key": _chars("ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", 16).map(lambda s: (f"AKIA{s}", s)),
    "jwt": _chars(_ALNUM + "-_", 16, 40).map(lambda s: (f"eyJhbGciOiJIUzI1NiJ9.eyJ{s}.sig", s)),
    "bearer": _chars(_ALNUM + "._~+/-", 16, 60).map(lambda s: (f"Authorization: Bearer {s}", s)),
    "password": _chars(_ALNUM + "!#$%^*", 12, 40).map(lambda s: (f"password={s}", s)),
    "dsn": _chars(_ALNUM, 12, 40).map(lambda s: (f"postgresql://app:{s}@db:5432/x", s)),
    "announced": _ECHOED.map(lambda s: (f"Incorrect API key provided: {s}.", s)),
    "key-pair": _chars(_ALNUM + "-_.", 16, 40).map(lambda s: (f"key={s}", s)),
    "x-api-key": _chars(_ALNUM + "-_.", 16, 40).map(lambda s: (f"x-api-key: {s}", s)),
}


def _json_around(leaf: str) -> st.SearchStrategy[Any]:
    """A JSON value holding `leaf` somewhere under ordinary keys and lists."""
    return st.recursive(
        st.just(leaf),
        lambda inner: st.one_of(
            st.lists(inner, min_size=1, max_size=2),
            st.dictionaries(st.sampled_from(["detail", "note", "body"]), inner, min_size=1),
        ),
        max_leaves=4,
    )


@settings(max_examples=400, deadline=None)
@given(data=st.data(), kind=st.sampled_from(sorted(GENERATED)), before=_CONTEXT, after=_CONTEXT)
def test_generated_credentials_of_every_kind_never_come_out(
    data: st.DataObject, kind: str, before: str, after: str
) -> None:
    """A credential of any kind, generated in its public format (or of any shape after
    'API key provided:'), planted in text and in a JSON value, never comes out of
    `redact` or `redact_value`."""
    credential, secret = data.draw(GENERATED[kind])
    text = f"{before} {credential} {after}"
    assert secret not in redact(text, limit=None)
    assert secret not in redact(text)
    value = data.draw(_json_around(text))
    assert secret not in json.dumps(redact_value(value), ensure_ascii=False)


def test_a_pattern_of_your_own_is_redacted_everywhere() -> None:
    """`add_secret_pattern` adds a kind: redact and redact_value blank it until removed."""
    remove = add_secret_pattern(r"acme_[A-Za-z0-9]{16}")
    try:
        assert redact("got acme_0123456789abcdef back") == "got [REDACTED] back"
        assert redact_value({"note": ["acme_0123456789abcdef"]}) == {"note": ["[REDACTED]"]}
    finally:
        remove()
    assert redact("acme_0123456789abcdef") == "acme_0123456789abcdef"
    with pytest.raises(ConfigurationError, match="empty string"):
        add_secret_pattern(r"x*")
