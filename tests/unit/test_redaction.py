"""Secret redaction of free text (`redact`) and JSON-like values (`redact_value`)."""

import pytest

from benchmarks.redaction import ADVERSARIAL, hostile_error
from langgraph_resilience.core import redact, redaction
from langgraph_resilience.core.classification import classify
from langgraph_resilience.core.redaction import (
    DEFAULT_LIMIT,
    REDACTED,
    TRUNCATED,
    is_secret_key,
    mask_args,
    redact_value,
    unmask_args,
)


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
        pytest.param("token := 'hunter2'", "hunter2", id="token-go-assign"),
        pytest.param("{'token' => 'hunter2'}", "hunter2", id="token-ruby-hash"),
        pytest.param("$password => hunter2;", "hunter2", id="password-php-arrow"),
        pytest.param('"sl_token"::"hunter2"', "hunter2", id="token-double-colon"),
        pytest.param('["sl_token"]::"hunter2"', "hunter2", id="token-subscript-colons"),
        pytest.param('config["password"] = "hunter2"', "hunter2", id="password-subscript"),
        pytest.param("params['api_key'] = 'abc123xyz'", "abc123xyz", id="api_key-subscript"),
        pytest.param('$cfg["token"] => "abc123xyz"', "abc123xyz", id="token-php-subscript"),
        pytest.param("user[name]=ann&user[password]=hunter2", "hunter2", id="password-form"),
        pytest.param("key => abc123xyz", "abc123xyz", id="key-arrow"),
        pytest.param("{'key' => 'abc123xyz'}", "abc123xyz", id="key-ruby-hash"),
        pytest.param("key := abc123xyz", "abc123xyz", id="key-go-assign"),
        pytest.param("<Password>hunter2</Password>", "hunter2", id="password-xml"),
        pytest.param(
            '<ns:SecretAccessKey a="1">wJalr/XUtn+FEMI</ns:SecretAccessKey>',
            "wJalr",
            id="secret-key-xml",
        ),
        pytest.param(
            "Command '['mysql', '--password', 'hunter2']' returned non-zero exit status 1.",
            "hunter2",
            id="password-argv",
        ),
        pytest.param("run --api-key abc123xyz --verbose", "abc123xyz", id="api-key-flag"),
        pytest.param('sh -c x --db-password "hunter 2"', "hunter", id="password-flag-quoted"),
        pytest.param("curl -u ann:hunter2 https://api", "hunter2", id="curl-user"),
        pytest.param("['curl', '-u', 'ann:hunter2', 'x']", "hunter2", id="curl-user-argv"),
        pytest.param("wget --user=ann:hunter2 x", "hunter2", id="wget-user"),
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
    assert redact("POST /login user[name]=ann&user[password]=hunter2&user[email]=a@b.c") == (
        f"POST /login user[name]=ann&user[password]={REDACTED}&user[email]=a@b.c"
    )
    assert redact("<Auth><User>ann</User><Password>hunter2</Password></Auth>") == (
        f"<Auth><User>ann</User><Password>{REDACTED}</Password></Auth>"
    )
    assert redact("Command '['mysql', '--password', 'hunter2']' failed") == (
        f"Command '['mysql', '--password', '{REDACTED}']' failed"
    )


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


@pytest.mark.parametrize(
    "text",
    [
        "Authorization: Bearer abc.def.ghi; postgresql://u:pw@h/db password=hunter2 sk-a1b2c3d4e5",
        'cfg["password"] = "hunter2"; user[password]=hunter2&x=1; key => abc123xyz',
        "<Password>hunter2</Password> --password hunter2 '--token', 'abc123xyz'",
        "curl -u ann:hunter2 https://api",
        "?q=password%3Dhunter2%26token%22%3A%22abc",
    ],
)
def test_redact_is_idempotent(text: str) -> None:
    """Redacting twice changes nothing more (an envelope's body is redacted as a value,
    then again as the text it is part of)."""
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


# ------------------------------------------------ the kinds the old patterns missed


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            "password=correct horse&3 battery user=app",
            f"password={REDACTED} user=app",
            id="password-to-the-end-of-the-pair",
        ),
        pytest.param("password=correct horse&3 battery", f"password={REDACTED}", id="to-eol"),
        pytest.param(
            "login password='correct horse&3' user=app",
            f"login password='{REDACTED}' user=app",
            id="password-quoted",
        ),
        pytest.param(
            '{"password": "a \\"quoted\\" pw", "user": "app"}',
            f'{{"password": "{REDACTED}", "user": "app"}}',
            id="password-json-escapes",
        ),
        pytest.param(
            '{"error": "{\\"token\\": \\"abc\\\\\\"def\\"}"}',
            f'{{"error": "{{\\"token\\": \\"{REDACTED}\\"}}"}}',
            id="json-inside-a-json-string",
        ),
        pytest.param(
            "host=db user=app password='s3 cr&t' dbname=x",
            f"host=db user=app password='{REDACTED}' dbname=x",
            id="keyword-dsn-quoted",
        ),
        pytest.param(
            "host=db user=app password=s3cr&t dbname=x",
            f"host=db user=app password={REDACTED} dbname=x",
            id="keyword-dsn-unquoted",
        ),
        pytest.param("postgresql://app:p@ss@db/x", "postgresql://app:***@db/x", id="url-raw-at"),
        pytest.param(
            "redis://:a/b@c@cache:6379/0", "redis://:***@cache:6379/0", id="url-raw-slash-and-at"
        ),
        pytest.param(
            "Cookie: sid=abc123; theme=dark", f"Cookie: {REDACTED}", id="cookie-whole-line"
        ),
        pytest.param(
            "Set-Cookie: session=abc123; Path=/; HttpOnly\nServer: x",
            f"Set-Cookie: {REDACTED}\nServer: x",
            id="set-cookie",
        ),
        pytest.param(
            "X-Session-Id: s3ss10n next", f"X-Session-Id: {REDACTED} next", id="x-session-id"
        ),
        pytest.param("session_id=s3ss10n&x=1", f"session_id={REDACTED}&x=1", id="session_id"),
        pytest.param("jwt=opaque123 ok", f"jwt={REDACTED} ok", id="jwt-pair"),
        pytest.param(
            "got eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl back",
            f"got {REDACTED} back",
            id="jwt-bare",
        ),
        pytest.param(
            "key -----BEGIN RSA PRIVATE KEY-----\nMIIEabc\ndef==\n-----END RSA PRIVATE KEY----- ok",
            f"key {REDACTED} ok",
            id="pem-block",
        ),
        pytest.param(
            "key -----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXk\nAAAA",
            f"key {REDACTED}",
            id="pem-without-end",
        ),
        pytest.param("passphrase=open sesame 42", f"passphrase={REDACTED}", id="passphrase"),
        pytest.param("db_pass=xyz", f"db_pass={REDACTED}", id="pass"),
        pytest.param(
            "client_secret=abc123xyz access_key=AK1 token=t0k",
            f"client_secret={REDACTED} access_key={REDACTED} token={REDACTED}",
            id="secret-access-key-token",
        ),
        pytest.param(
            "token: X-Session-Id: s3ss10n",
            f"token: X-Session-Id: {REDACTED}",
            id="a-key-is-not-a-value",
        ),
        pytest.param(
            "token:' see host=db password='s3 cr&t' x",
            f"token:'{REDACTED}'{REDACTED} x",
            id="quotes-paired-wrongly",
        ),
        pytest.param(
            "401 - Incorrect API key provided: 0123456789abcdef0123456789abcdef. See docs",
            f"401 - Incorrect API key provided: {REDACTED}. See docs",
            id="provided-azure-hex",
        ),
        pytest.param(
            "Incorrect API key provided: sk-test-****abcd, retry",
            f"Incorrect API key provided: {REDACTED}, retry",
            id="provided-masked",
        ),
        pytest.param(
            "Invalid token provided: 'a b&c' for user",
            f"Invalid token provided: '{REDACTED}' for user",
            id="provided-quoted",
        ),
        pytest.param(
            "GET /maps?key=Zq9-anything.42&q=x failed",
            f"GET /maps?key={REDACTED}&q=x failed",
            id="bare-key-query",
        ),
        pytest.param("key = abc123 ok", f"key = {REDACTED} ok", id="bare-key-spaced"),
        pytest.param(
            "api-key: 77f0c3ab x-api-key: 9d2e",
            f"api-key: {REDACTED} x-api-key: {REDACTED}",
            id="api-key-headers",
        ),
        pytest.param(
            "Command '['curl', '-H', 'Authorization: Bearer abc123', 'https://x/y']' "
            "returned non-zero exit status 22.",
            f"Command '['curl', '-H', 'Authorization: {REDACTED}', 'https://x/y']' "
            "returned non-zero exit status 22.",
            id="quoted-header-argument",
        ),
        pytest.param(
            '-H "Proxy-Authorization: Digest username=\\"u\\", nonce=\\"n1\\"" https://x',
            f'-H "Proxy-Authorization: {REDACTED}" https://x',
            id="quoted-header-escaped-quotes",
        ),
        pytest.param(
            "['-H', 'Set-Cookie: sid=abc; Path=/', '-v']",
            f"['-H', 'Set-Cookie: {REDACTED}', '-v']",
            id="quoted-cookie-argument",
        ),
        pytest.param(
            "GET /login?next=%2Fhome&q=password%3Dhunter2+now%26x%3D1 failed",
            f"GET /login?next=%2Fhome&q=password%3D{REDACTED}%26x%3D1 failed",
            id="encoded-pair",
        ),
        pytest.param(
            "GET /x?filter=%7B%22api_key%22%3A%20%22sk1a2b3c%22%2C%22n%22%3A1%7D",
            f"GET /x?filter=%7B%22api_key%22%3A%20%22{REDACTED}%22%2C%22n%22%3A1%7D",
            id="encoded-json",
        ),
        pytest.param(
            "body: client_secret%3dS3cr%2Ft%26grant_type%3Dclient_credentials",
            f"body: client_secret%3d{REDACTED}%26grant_type%3Dclient_credentials",
            id="encoded-form",
        ),
        pytest.param(
            "h=Authorization%3A%20Bearer%20abc.def%0D%0AAccept%3A%20*",
            f"h=Authorization%3A%20{REDACTED}%0D%0AAccept%3A%20*",
            id="encoded-header",
        ),
        pytest.param(
            "302 to /sso?next=%2Flogin%3Fpassword%253Dhunter2%2526x%253D1 failed",
            f"302 to /sso?next=%2Flogin%3Fpassword%253D{REDACTED}%2526x%253D1 failed",
            id="encoded-twice",
        ),
        pytest.param(
            "next=%252522token%252522%25253A%252522abc%252522",
            f"next=%252522token%252522%25253A%252522{REDACTED}%252522",
            id="encoded-three-times",
        ),
    ],
)
def test_redact_whole_values(text: str, expected: str) -> None:
    """A value is redacted whole: quoted (escapes and all), to the end of the pair, to the
    end of the line (headers), or the whole password of a URL (a raw '@' included)."""
    assert redact(text) == expected
    assert redact(expected) == expected


@pytest.mark.parametrize(
    "text",
    [
        "bypass=true compass: north",
        "max_tokens=100 and tokens: 12",
        "password_hint=blue",
        "https://example.com/users/@alice",
        "retry in 3s: upstream busy",
        "ssh://git@github.com/org/repo.git",
        "monkey=banana sort_key=name cache.key=x",
        "monkey => banana, items[0] = 5, key_count=3",
        "<tokens_used>5</tokens_used><AccessKeyId>AKID</AccessKeyId>",
        "--no-password --verbose --password-file /etc/pw --token-count 5",
        "mysql -u root -p --user-agent x:y",
        "no API key provided in the request",
        "max_tokens%3D5&bypass%3Dyes&compass%3Dnorth&tokens%3D7&p=100%3D",
        "max_tokens%253D5%2526bypass%253Dyes%2526p%253D100%2525",
    ],
)
def test_redact_leaves_lookalikes_alone(text: str) -> None:
    """Names that only contain a secret's name, and URLs without a password, stay."""
    assert redact(text) == text


# ------------------------------------------------------------------- truncation


def test_quoted_headers_past_the_bound_run_to_the_end_of_the_line() -> None:
    """Each quoted header cut at its quote costs a scan of the rest of its line, so only
    the first few are; the rest are redacted to the line's end, as unquoted ones are."""
    many = " ".join(f"'Cookie: c{i}'" for i in range(12))
    out = redact(many)
    assert not any(f"c{i}" in out for i in range(12))
    assert out.count("'Cookie: [REDACTED]'") == 8


def test_redact_reads_a_bounded_prefix() -> None:
    """A long text is cut before it is scrubbed; the result says so and fits the limit."""
    text = "password=hunter2 user=app " + "x " * 10_000
    out = redact(text, limit=100)
    assert len(out) == 100
    assert out.startswith(f"password={REDACTED} user=app x x")
    assert out.endswith(TRUNCATED)
    assert len(redact("x" * 10_000)) == DEFAULT_LIMIT
    assert redact("x" * 10_000, limit=None) == "x" * 10_000


def test_the_token_a_cut_splits_is_dropped() -> None:
    """A credential cut in half by the limit shows none of its first half."""
    for secret in ("ghp_abcdefghijklmnop", "sk-abcdefghijklmnop", "AKIAIOSFODNN7EXAMPLE"):
        text = "x" * 40 + " " + secret + " tail"
        for limit in range(42, 42 + len(secret) + 5):
            out = redact(text, limit=limit)
            assert secret[:4] not in out, (limit, out)
            assert len(out) <= limit


def test_a_url_cut_before_its_at_keeps_no_password() -> None:
    """A DSN the cut ends before its '@' (a long password) shows no password."""
    text = "postgresql://app:" + "p" * 400 + "@db/x"
    assert "ppp" not in redact(text, limit=300)


def test_redacted_output_never_exceeds_the_limit() -> None:
    """'[REDACTED]' may be longer than the secret it replaced; the limit still holds."""
    text = "pwd=a " * 40
    assert len(text) < 300 < len(redact(text, limit=None))
    assert len(redact(text, limit=300)) == 300


# -------------------------------------------------------- values, masking, unmasking


@pytest.mark.parametrize(
    "key",
    [
        *("dbPassword", "accessToken", "APIKey", "X-Session-Id", "set-cookie", "passphrase"),
        *("jwt", "Proxy-Authorization", "refresh_token", "passwords", "auth", "secret_key"),
    ],
)
def test_more_secret_named_keys(key: str) -> None:
    """camelCase, header spellings and plurals name secrets too."""
    assert is_secret_key(key)
    assert redact_value({key: "v"}) == {key: REDACTED}


@pytest.mark.parametrize(
    "key", ["max_tokens", "prompt_tokens", "author", "password_hint", "idempotency_key", "key"]
)
def test_keys_that_only_look_like_secrets(key: str) -> None:
    """A count of tokens or an idempotency key is no secret."""
    assert not is_secret_key(key)


def test_redact_value_walks_lists_of_dicts_and_header_pairs() -> None:
    """Lists of dicts, tuples, sets and header pairs are walked at any depth."""
    value = {
        "attempts": [{"headers": {"Cookie": "sid=1"}}, ({"token": "t"},)],
        "raw_headers": [("Authorization", "Bearer abcdef123"), ("Accept", "json")],
        "seen": {"password=hunter2"},
    }
    assert redact_value(value) == {
        "attempts": [{"headers": {"Cookie": REDACTED}}, [{"token": REDACTED}]],
        "raw_headers": [["Authorization", REDACTED], ["Accept", "json"]],
        "seen": [f"password={REDACTED}"],
    }


def test_mask_args_masks_secret_named_arguments_at_any_depth() -> None:
    """What a prompt or a human sees of a call's arguments."""
    args = {"user": "u", "password": "p w&d", "opts": {"apiKey": "k", "q": "token=abc"}}
    assert mask_args(args) == {
        "user": "u",
        "password": REDACTED,
        "opts": {"apiKey": REDACTED, "q": f"token={REDACTED}"},
    }
    assert args["password"] == "p w&d"  # the call's own arguments are untouched


def test_unmask_args_restores_what_was_copied_back_masked() -> None:
    """A repair that keeps the masked password keeps the real one; a change is a change."""
    original = {"user": "u", "password": "p w&d", "opts": {"apiKey": "k", "q": "token=abc"}}
    proposed = {**mask_args(original), "user": "v"}
    assert unmask_args(proposed, original) == {**original, "user": "v"}
    assert unmask_args({"password": "new"}, original) == {"password": "new"}
    # a masked value never moves to another argument
    assert unmask_args({"note": REDACTED}, original) == {"note": REDACTED}


# ------------------------------------------------------------------ linear time


@pytest.mark.parametrize("text", [pytest.param(t, id=k) for k, t in ADVERSARIAL.items()])
def test_redaction_reads_a_bounded_input(text: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever the size of the text, `redact` scrubs at most `limit` characters of it
    (plus nothing): the work per call is bounded, a megabyte costs what 4 KB cost."""
    scrubbed: list[int] = []
    scrub = redaction._scrub

    def measured(part: str, *, truncated: bool = False) -> str:
        scrubbed.append(len(part))
        return scrub(part, truncated=truncated)

    monkeypatch.setattr(redaction, "_scrub", measured)
    out = redact(text)
    assert scrubbed
    assert max(scrubbed) <= DEFAULT_LIMIT
    assert len(out) <= DEFAULT_LIMIT


def test_classifying_a_huge_hostile_error_scrubs_a_bounded_input(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A 1 MB exception text and a 1 MB 500-body cost a bounded amount of redaction
    (its time is `benchmarks/redaction.py`'s, never a unit test's)."""
    scrubbed: list[int] = []
    scrub = redaction._scrub

    def measured(part: str, *, truncated: bool = False) -> str:
        scrubbed.append(len(part))
        return scrub(part, truncated=truncated)

    monkeypatch.setattr(redaction, "_scrub", measured)
    envelope = classify(hostile_error(), tool="search")
    assert scrubbed
    assert max(scrubbed) <= DEFAULT_LIMIT
    assert len(envelope.message) <= 500
    assert len(envelope.context["body"]) <= 300
