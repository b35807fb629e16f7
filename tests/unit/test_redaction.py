"""Secret redaction of free text (`redact`) and JSON-like values (`redact_value`)."""

import pytest

from langgraph_resilience import redact
from langgraph_resilience.redaction import REDACTED, redact_value


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        pytest.param("Authorization: Bearer abc.def.ghi", "abc.def.ghi", id="auth-bearer"),
        pytest.param("authorization=Basic dXNlcjpwYXNz", "dXNlcjpwYXNz", id="auth-basic"),
        pytest.param("Proxy-Authorization: Digest u=1,x", "Digest u=1", id="proxy-auth"),
        pytest.param(
            "headers={'Authorization': 'Bearer tok123456789'}", "tok123456789", id="auth-repr"
        ),
        pytest.param('{"authorization": "Token 5up3rs3cr3t"}', "5up3rs3cr3t", id="auth-json"),
        pytest.param("sent Bearer eyJhbGciOi.payload.sig upstream", "eyJhbGciOi", id="bearer"),
        pytest.param("login failed: password=hunter2 user=app", "hunter2", id="password-kv"),
        pytest.param("PGPASSWORD=hunter2 psql", "hunter2", id="env-password"),
        pytest.param("Password: hunter2", "hunter2", id="password-colon"),
        pytest.param('{"password": "hunter2", "user": "app"}', "hunter2", id="password-json"),
        pytest.param("{'passwd': 'hunter2'}", "hunter2", id="passwd-repr"),
        pytest.param("host=h user=u pwd=hunter2 dbname=x", "hunter2", id="pwd"),
        pytest.param("GET /v1?api_key=abc123xyz&q=1", "abc123xyz", id="api_key-query"),
        pytest.param("x-api-key: abc123xyz", "abc123xyz", id="api-key-header"),
        pytest.param("apikey=abc123xyz", "abc123xyz", id="apikey"),
        pytest.param('{"token": "abc123xyz"}', "abc123xyz", id="token-json"),
        pytest.param("client_secret=abc123xyz", "abc123xyz", id="client-secret"),
        pytest.param("aws_secret_access_key=wJalrXUtnFEMI", "wJalrXUtnFEMI", id="aws-secret"),
        pytest.param("key sk-abc123456789 rejected", "sk-abc123456789", id="openai-sk"),
        pytest.param("key sk-proj-Ab12_Cd34-Ef56 bad", "Ab12_Cd34", id="openai-project"),
        pytest.param("sk-ant-api03-abcdefgh1234", "abcdefgh1234", id="anthropic"),
        pytest.param("use ghp_abcdefghij0123456789", "ghp_abcdefghij", id="github-ghp"),
        pytest.param("gho_abcdefghij0123456789", "gho_abcdefghij", id="github-gho"),
        pytest.param("ghs_abcdefghij0123456789", "ghs_abcdefghij", id="github-ghs"),
        pytest.param("ghu_abcdefghij0123456789", "ghu_abcdefghij", id="github-ghu"),
        pytest.param("ghr_abcdefghij0123456789", "ghr_abcdefghij", id="github-ghr"),
        pytest.param("github_pat_11ABCDEFG0_xyz123456", "11ABCDEFG0", id="github-pat"),
        pytest.param("slack xoxb-1234567890-abcdefghij", "abcdefghij", id="slack-bot"),
        pytest.param("xoxp-1234567890-0987654321-abcd", "0987654321", id="slack-user"),
        pytest.param("id AKIAIOSFODNN7EXAMPLE in use", "AKIAIOSFODNN7EXAMPLE", id="aws-akia"),
        pytest.param("id ASIAIOSFODNN7EXAMPLE in use", "ASIAIOSFODNN7EXAMPLE", id="aws-asia"),
        pytest.param("postgresql://app:hunter2@db:5432/x", "hunter2", id="dsn-postgres"),
        pytest.param("postgres+psycopg://app:hunter2@db/x?ssl=1", "hunter2", id="dsn-driver"),
        pytest.param("amqp://guest:hunter2@rabbit//", "hunter2", id="dsn-amqp"),
        pytest.param("redis://:hunter2@cache:6379/0", "hunter2", id="dsn-no-user"),
    ],
)
def test_redact_removes_secret(text: str, secret: str) -> None:
    """Each kind of credential disappears from free text."""
    redacted = redact(text)
    assert secret not in redacted
    assert redacted != text


def test_redact_keeps_the_shape_of_the_text() -> None:
    """Only the secret is replaced, so the message still explains what happened."""
    assert redact("GET failed: Authorization: Bearer abc.def.ghi") == (
        f"GET failed: Authorization: {REDACTED}"
    )
    assert redact("connect postgresql://app:hunter2@db:5432/x failed") == (
        "connect postgresql://app:***@db:5432/x failed"
    )
    assert redact("login failed: password=hunter2 user=app") == (
        f"login failed: password={REDACTED} user=app"
    )
    assert redact('{"password": "hunter2", "user": "app"}') == (
        f'{{"password": "{REDACTED}", "user": "app"}}'
    )
    assert redact("key sk-abc123456789 rejected") == f"key {REDACTED} rejected"


def test_dsn_keeps_user_and_host() -> None:
    """A DSN stays useful for debugging: only the password goes."""
    redacted = redact("postgresql://app:hunter2@db.internal:5432/orders")
    assert redacted.startswith("postgresql://app:")
    assert redacted.endswith("@db.internal:5432/orders")


@pytest.mark.parametrize(
    "text",
    [
        "HTTP 503 Service Unavailable",
        "connection reset by peer",
        "see https://example.com/path?x=1&y=2 for details",
        "mailto user@example.com: mailbox full",
        "http://db:5432/x has no credentials",
        "the token count was 12",
        "password reset email sent",
        "tasks: 3 failed, 2 ok; skipping",
        "desk-12345678 booked",
        "Ünïcödé text with ✓ stays",
        "",
    ],
)
def test_redact_leaves_ordinary_text_alone(text: str) -> None:
    """Text without credentials comes back unchanged."""
    assert redact(text) == text


def test_redact_is_idempotent() -> None:
    """Redacting twice changes nothing more."""
    text = (
        "Authorization: Bearer abc.def.ghi; postgresql://u:pw@h/db password=hunter2 sk-a1b2c3d4e5"
    )
    once = redact(text)
    assert redact(once) == once


@pytest.mark.parametrize(
    "key",
    [
        "authorization",
        "Authorization",
        "password",
        "db_password",
        "token",
        "access_token",
        "api_key",
        "api-key",
        "apiKey",
        "secret",
        "client_secret",
        "dsn",
        "DATABASE_DSN",
        "cookie",
        "private_key",
        "session_id",
        "credentials",
    ],
)
def test_redact_value_blanks_secret_named_keys(key: str) -> None:
    """A value under a secret-named key is replaced whatever it is."""
    assert redact_value({key: "anything at all", "status": 503}) == {
        key: REDACTED,
        "status": 503,
    }


def test_redact_value_blanks_non_string_secrets() -> None:
    """Numbers, lists and nested dicts under a secret key are blanked too."""
    value = {"token": 123456, "password": ["a", "b"], "credentials": {"user": "u", "pw": "x"}}
    assert redact_value(value) == {"token": REDACTED, "password": REDACTED, "credentials": REDACTED}


def test_redact_value_recurses_into_nested_containers() -> None:
    """Secrets are found at any depth, in dicts, lists and tuples."""
    value = {
        "request": {
            "headers": {"Authorization": "Bearer abcdef123456", "Accept": "json"},
            "attempts": [{"dsn": "postgresql://u:hunter2@h/db"}, ("password=hunter2", 3)],
        },
        "ok": True,
        "ratio": 0.5,
        "missing": None,
    }
    assert redact_value(value) == {
        "request": {
            "headers": {"Authorization": REDACTED, "Accept": "json"},
            "attempts": [{"dsn": REDACTED}, [f"password={REDACTED}", 3]],
        },
        "ok": True,
        "ratio": 0.5,
        "missing": None,
    }


def test_redact_value_scrubs_strings_under_ordinary_keys() -> None:
    """A secret inside a harmless-looking field is still scrubbed."""
    redacted = redact_value({"detail": "retry with sk-abc123456789", "url": "redis://:pw1234@h/0"})
    assert "sk-abc123456789" not in str(redacted)
    assert "pw1234" not in str(redacted)


def test_redact_value_leaves_plain_json_unchanged() -> None:
    """A value without secrets comes back equal."""
    value = {
        "status_code": 503,
        "body": "busy",
        "items": [1, 2.5, None, True],
        "nested": {"a": "b"},
    }
    assert redact_value(value) == value


def test_redact_value_reduces_unknown_objects_to_redacted_text() -> None:
    """Non-JSON objects become their scrubbed repr, so the result is JSON."""

    class Conn:
        def __repr__(self) -> str:
            return "Conn(postgresql://u:hunter2@h/db)"

    redacted = redact_value({"conn": Conn()})
    assert redacted == {"conn": "Conn(postgresql://u:***@h/db)"}


def test_redact_value_bounds_depth() -> None:
    """Pathologically deep values are cut off instead of recursing forever."""
    deep: dict[str, object] = {"leaf": "password=hunter2"}
    for _ in range(50):
        deep = {"next": deep}
    assert "hunter2" not in str(redact_value(deep))
