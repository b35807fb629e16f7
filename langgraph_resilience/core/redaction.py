"""Secret redaction for everything that leaves a tool call: envelopes, prompts, events, logs.

An exception's text routinely carries what must never reach a model or a log:
``Authorization`` headers, bearer tokens, API keys, JWTs, cookies, session ids,
private keys, passwords, DSNs with credentials. `redact` scrubs free text,
`redact_value` JSON-like values (secret-named keys are blanked whatever they hold),
`mask_args` a tool call's arguments shown to a model or a human, and `unmask_args`
puts the real values back where a model (or a human) copied a masked one.

`redact` is linear in its input and reads a bounded prefix of it: the text is cut
to `limit` characters *first* (the token the cut splits is dropped, so a secret
cut in half cannot show its first half), then scrubbed by patterns without
catastrophic backtracking. A hostile upstream sending a megabyte of ``a-a-a-``
costs microseconds, not minutes.

What is caught, and by which scan:

* PEM private key blocks (``-----BEGIN ... PRIVATE KEY-----`` to its END, or to
  the end of the text when the END is missing).
* ``key=value`` / ``key: value`` / ``"key": "value"`` pairs whose key names a
  secret: a quoted value is redacted whole (escapes and all); an unquoted value of
  ``Authorization``/``Cookie``/``Set-Cookie`` runs to the end of the line (or to the
  closing quote of a header quoted whole, as a command's argument is), of a
  password-like key (``password``, ``passwd``, ``pwd``, ``pass``, ``passphrase``,
  ``secret``, ``client_secret``, ``private_key``) to the end of the pair (the next
  ``key=`` or the end of the line), of a token-like key (``token``,
  ``access_token``, ``api_key``, ``access_key``, ``jwt``, ``session_id``,
  ``X-Session-Id``) to the end of the word.
* ``scheme://user:password@host``: everything between the first ``:`` and the
  *last* ``@`` of the URL is the password, so a raw ``@`` in it leaves nothing.
* Keys announced by their context, whatever their shape: what follows a provider's
  ``API key provided:`` (``token``/``secret provided:`` too), and a bare ``key=``.
* Token shapes wherever they stand: ``Bearer``/``Basic`` credentials, JWTs
  (``eyJ...``), ``sk-``, ``ghp_``/``gho_``/..., ``xox?-``/``xapp-``, ``AKIA``/``ASIA``,
  Stripe ``sk_live_``/``rk_live_`` (and ``_test_``), Google ``AIza...``, Twilio
  ``SK`` + 32 hex, SendGrid ``SG.<id>.<secret>``, ``npm_``, Hugging Face ``hf_``;
  Azure's ``AccountKey=``/``SharedAccessKey=`` and a SAS URL's ``sig=`` as pairs.
* With detect-secrets installed (``pip install "langgraph-resilience[secrets]"``),
  every credential format of its plugin catalogue (`core.secret_catalogue`: AWS,
  GitLab, PyPI, Discord, Telegram, IBM, private-key headers, ...), first, since our
  rules may redact part of what a format needs around its secret. Not its entropy
  plugins: a commit hash or a uuid comes out as it went in. Its regexes were written for
  files, not hostile text (npm's is quadratic in a line), so none ever runs on more than
  `secret_catalogue.WINDOW` characters at a time: still linear.
* Patterns you add with `add_secret_pattern`.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping, Set
from typing import Any

from langgraph_resilience.core import secret_catalogue
from langgraph_resilience.errors import ConfigurationError

__all__ = [
    "DEFAULT_LIMIT",
    "REDACTED",
    "TRUNCATED",
    "add_secret_pattern",
    "is_secret_key",
    "mask_args",
    "redact",
    "redact_value",
    "unmask_args",
]

REDACTED = "[REDACTED]"
"""What a secret is replaced with (a URL's password becomes ``***``)."""

TRUNCATED = "…[truncated]"
"""The marker ending a text `redact` had to cut to its `limit`."""

DEFAULT_LIMIT = 4096
"""Characters of a text `redact` reads and returns by default (marker included)."""

_MAX_DEPTH = 8
_MISQUOTED_PAIRS = 8
"""How many pairs inside one quoted value are checked for quotes paired wrongly."""
_PARTIAL_TOKEN = 256
"""How far back from a cut `redact` looks for the start of the token the cut splits."""

# -------------------------------------------------------------------- secret names

_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_SECRET_NAME = re.compile(
    # the whole (normalized) key, or its last part after a separator: "access_token"
    # and "dbPassword" yes, "max_tokens", "author" and "password_hint" no
    r"(?:^|[_.\s])(?:authorization|auth|passwords?|passwd|pwd|pass|passphrase|secrets?|"
    r"secret_?key|token|api_?keys?|apikey|cookies?|credentials?|private_?key|dsn|"
    r"session_?id|sessid|access_?key|account_?key|sig|jwt|bearer)$"
)


@functools.lru_cache(maxsize=4096)
def _secret_name(name: str) -> bool:
    normalized = _CAMEL.sub("_", name[-64:]).lower().replace("-", "_")
    return _SECRET_NAME.search(normalized) is not None


def is_secret_key(key: object) -> bool:
    """True if a mapping key names a secret (its value is blanked whatever it is).

    >>> [is_secret_key(k) for k in ("password", "dbPassword", "X-Session-Id", "max_tokens")]
    [True, True, True, False]
    """
    return _secret_name(key if isinstance(key, str) else str(key))


# --------------------------------------------------------------- text: key=value
# Every pattern below is linear: an unbounded repetition either ends the pattern
# (nothing after it can fail and make the engine retry a shorter match) or stops at a
# character it does not repeat (possessive, so nothing is given back), and a scan
# that could start at every character of a run is guarded so that it starts once per
# run. Patterns begin with literals, not with a word boundary or a lookbehind (those
# cost the engine its fast scan for a first character): the token callbacks check
# what stands before a match instead, and cheap substring tests skip whole scans.

# a quoted key's quote, a subscript's ']' (``cfg["password"] =``, ``user[password]=``),
# then ':' or '=' (or ':=', '::', '=>', as in Go, Ruby, PHP)
_KEY_END = r"""(?:\\?["'])?\]?[ \t]*(?:=>|:[:=]|[:=])[ \t]*"""
_QUOTED = (
    r"""\\"(?:[^\\\n]|\\\\\\"|\\[^"\n])*+(?:\\")?"""  # \"...\" in JSON text in a JSON string
    r"""|[bBrRuU]?"(?:[^"\\\n]|\\.)*+"?"""  # "...", escapes included, to the line's end
    r"""|[bBrRuU]?'(?:[^'\\\n]|\\.)*+'?"""
)
_PAIR_END = (
    # the next pair (" user=", "&q=", ', "user":', not "x :" or "x://"), or the quote
    # closing the string this pair stands in, or the end of the line
    r"""(?<![\s&;,])[\s&;,]++["']?[A-Za-z_][\w.\-]*+(?:\[[\w.\-]*+\])*+["']?(?:=|:(?!//))"""
    r"""|["'](?=[ \t]*+(?:[,;}\])\r\n]|\Z))"""
    r"""|[\r\n]"""
)
_LINE_NAMES = r"authorization|cookie"  # the rest of the line: Proxy-Authorization, Set-Cookie
_PHRASE_NAMES = (  # up to the end of the pair ("bypass=", "compass:" are no "pass")
    r"pass(?:word|wd|phrase)|(?<![a-z])pass|pwd|secret(?:[_-]?key)?|private[_-]?key"
)
_WORD_NAMES = (  # one word (Azure's AccountKey=, SharedAccessKey=, a SAS URL's sig=)
    r"token|api[_-]?key|apikey|access[_-]?key|subscription[_-]?key|account[_-]?key|jwt"
    r"|session[_-]?id|sessionid|sessid|(?<![a-z])sig"
)
_WORD_VALUE = (
    # not the next secret pair ("token: X-Session-Id: abc" leaves that pair to its rule)
    rf"""(?![\w.\-]*?(?:{_LINE_NAMES}|{_PHRASE_NAMES}|{_WORD_NAMES})(?:\\?["'])?\]?[ \t]*[:=])"""
    r"""[^\s"'&,;<>(){}\[\]]*+"""
)
_PAIR = re.compile(
    rf"(?:(?P<line>{_LINE_NAMES})|(?P<phrase>{_PHRASE_NAMES})|{_WORD_NAMES}){_KEY_END}"
    rf"(?P<value>{_QUOTED}|(?(line)[^\r\n]*+|(?(phrase)(?:(?!{_PAIR_END}).)*+|{_WORD_VALUE})))",
    re.IGNORECASE | re.ASCII,
)
_QUOTE_OPEN = re.compile(r"""\\"|[bBrRuU]?["']""")
_QUOTED_HEADERS = 8
"""How many quoted headers one text may have cut at their closing quote: each cut scans
the rest of its line again, so a bound keeps the scan linear (past it, to the line's end)."""


def _blank(value: str) -> bool:
    """Whether a value has nothing left to redact: empty, or redacted already."""
    return not value or value in (REDACTED, "***")


def _pair(match: re.Match[str]) -> str:
    whole = match.group(0)
    value = match.group("value")
    start = match.start("value") - match.start()
    opened = _QUOTE_OPEN.match(value)
    if opened is not None:  # keep the quotes: '"password": "[REDACTED]"'
        quote = opened.group(0)
        closing = quote[-2:] if quote.startswith("\\") else quote[-1]
        inner = value[len(quote) :]
        closed = len(inner) >= len(closing) and inner.endswith(closing)
        if closed:
            inner = inner[: -len(closing)]
        if _blank(inner):
            return whole
        return whole[:start] + quote + REDACTED + (closing if closed else "")
    kept = value.rstrip()
    if _blank(kept):
        return whole
    return whole[:start] + REDACTED + value[len(kept) :]


def _pairs(text: str) -> str:
    parts: list[str] = []
    pos, cuts = 0, 0
    while (match := _PAIR.search(text, pos)) is not None:
        closed = _quoted_header_end(text, match) if cuts < _QUOTED_HEADERS else None
        if closed is not None:  # 'Authorization: Bearer x', up to its closing quote
            cuts += 1
            value = text[match.start("value") : closed].rstrip()
            parts += [text[pos : match.start()], text[match.start() : match.start("value")]]
            parts.append(value if _blank(value) else REDACTED)
            pos = match.start("value") + len(value)
            continue
        parts += [text[pos : match.start()], _pair(match)]
        pos = match.end()
        if _QUOTE_OPEN.match(match.group("value")):
            pos = _misquoted(text, match.start("value") + 1, pos, parts)
    return "".join(parts) + text[pos:] if parts else text


def _quoted_header_end(text: str, match: re.Match[str]) -> int | None:
    """Where a header's value ends when the whole header stands in quotes, as a command's
    argument does (``-H "Authorization: Bearer x"``, ``['-H', 'Cookie: a=b', url]``): at
    the closing quote, so what follows it stays readable. None: to the end of the line."""
    if match.group("line") is None or _QUOTE_OPEN.match(match.group("value")):
        return None
    if any(q in text[match.end("line") : match.start("value")] for q in "'\""):
        return None  # a quoted key ('"Authorization": ...'): the pair's own rule
    start = match.start()
    while (
        start > 0
        and match.start() - start < 64
        and (text[start - 1].isalnum() or text[start - 1] in "-_")
    ):
        start -= 1  # over "Proxy-", "Set-"
    quote = text[start - 1] if start > 0 else ""
    if quote not in ("'", '"'):
        return None
    at = match.start("value")
    while (at := text.find(quote, at, match.end())) != -1:
        if quote == "'" or text[at - 1] != "\\":
            return at
        at += 1
    return None


def _misquoted(text: str, probe: int, end: int, parts: list[str]) -> int:
    """A pair inside a quoted value whose own value runs past that value's closing
    quote (the quotes were paired wrongly: ``token:' ... password='s3 cr&t'``) is
    redacted to its end too. Returns where the redacted text now ends."""
    for _ in range(_MISQUOTED_PAIRS):  # a bounded search: linear, whatever the quoting
        inner = _PAIR.search(text, probe, end)
        if inner is None:
            break
        full = _PAIR.match(text, inner.start())
        stop = inner.end() if full is None else full.end()
        if stop > end:
            parts.append(REDACTED)
            end = stop
        probe = inner.end()
    return end


# ------------------------------------------------- text: elements and flags
# A SOAP fault or an S3 error echoes the XML it was sent (``<Password>x</Password>``);
# a failed command shows its arguments (``Command '['mysql', '--password', 'x']'``,
# ``curl -u user:x``). The element's or flag's name must end in a secret's name, as a
# pair's must.

_NAMED = re.compile(rf"(?:{_LINE_NAMES}|{_PHRASE_NAMES}|{_WORD_NAMES})\Z", re.I | re.A)
"""A secret's name ending an element's or a flag's name (checked apart: a name scanned
possessively keeps the scan linear on any input)."""
_ELEMENT = re.compile(
    r"<(?P<name>[\w.:-]{1,64}+)(?:[ \t][^<>]{0,256}+)?+>(?P<value>[^<]++)</(?P=name)>", re.A
)
_FLAG = re.compile(  # the value: quoted (a list's repr, a shell's quotes), or one word
    r"""--(?P<name>[A-Za-z][\w-]{0,63}+)["']?,?[ \t]++"""
    r"""(?P<value>"[^"\n]{0,256}+"?|'[^'\n]{0,256}+'?|(?!-)[^\s"',\[\])]++)""",
    re.A,
)

_USER_FLAG = re.compile(  # curl's and wget's ``-u user:password``, its password only
    r"""(?<![\w-])(?:-u|--user)(?:[ \t]++|=|'?,[ \t]*+')["']?[^\s:"',]{1,128}+:"""
    r"""(?P<value>[^\s"',]++)""",
    re.A,
)

# A pair percent-encoded once more, as a URL or a form body nests it: a query's
# ``?q=password%3Dx``, a JSON filter's ``%22token%22%3A%22x%22``, an OAuth body logged
# encoded (``client_secret%3Dx%26grant_type...``), or encoded again inside another URL's
# parameter (``%253D``: each ``%25`` is one more round of encoding). The value ends
# where an encoded quote, ``&``, ``,``, ``;`` or line break does.
_ENCODED = re.compile(
    rf"(?:{_LINE_NAMES}|{_PHRASE_NAMES}|{_WORD_NAMES})(?:%(?:25)*+2[27])?%(?:25)*+3[AD]"
    r"(?:%(?:25)*+2[027]|\+)*+"
    r"""(?P<value>(?:[^\s%&"'<>,;]|%(?!(?:25)*+(?:2[267C]|3B|0[AD]))[0-9A-F]{2})++)""",
    re.I | re.A,
)


def _element(match: re.Match[str]) -> str:
    if _NAMED.search(match.group("name")) is None:
        return match.group(0)
    if _blank(match.group("value").strip()):
        return match.group(0)
    start, end = match.start("value") - match.start(), match.end("value") - match.start()
    whole = match.group(0)
    return whole[:start] + REDACTED + whole[end:]


def _flag(match: re.Match[str]) -> str:
    if _NAMED.search(match.group("name")) is None:
        return match.group(0)
    return _pair(match)


# ------------------------------------------------- text: keys announced by context
# A provider's error often echoes the key it refused ("Incorrect API key provided:
# 0123...cdef."), and a message may carry a bare ``key=...``: whatever the value looks
# like, the words before it say it is a key.

_ANNOUNCED = re.compile(
    r"(?:(?P<provided>(?:key|token|secret)[ \t]++provided[ \t]*+:)"
    r"|(?P<bare>key(?:\\?[\"'])?\]?[ \t]*+(?:=>|:=|=)))"
    rf"""[ \t]*+(?P<value>{_QUOTED}|[^\s"'&,;<>(){{}}\[\]`]*+)""",
    re.IGNORECASE | re.ASCII,
)
_NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-.")


def _announced_key(match: re.Match[str]) -> str:
    whole = match.group(0)
    at = match.start()
    if match.group("bare") and at and match.string[at - 1] in _NAME_CHARS:
        return whole  # "monkey=", "sort_key=": not a key of their own
    value = match.group("value")
    if _QUOTE_OPEN.match(value):
        return _pair(match)
    kept = value.rstrip(".,:;!?")  # the sentence's period is not the key's
    if _blank(kept):
        return whole
    start = match.start("value") - at
    return whole[:start] + REDACTED + value[len(kept) :]


def _announced(text: str) -> str:
    return _ANNOUNCED.sub(_announced_key, text)


# ------------------------------------------------------------ text: other shapes

_PEM_BEGIN = re.compile(r"-----BEGIN [A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----")
_PEM_END = re.compile(r"-----END [A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----")

_WORD = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")
_B64URL = _WORD | {"-"}

_BEARER = re.compile(r"(?P<scheme>bearer|basic)\s++[A-Za-z0-9._~+/=-]{6,}+", re.I | re.A)
_TOKEN_HINT = re.compile(  # literals only: a group here costs the scan 10x
    r"eyJ|sk-|sk_|rk_|gh[pousr]_|github_pat_|xox|xapp-|AKIA|ASIA|AIza|SK|SG\.|npm_|hf_"
)
_TOKENS: tuple[tuple[tuple[str, ...], re.Pattern[str], frozenset[str]], ...] = (
    # (substrings one of which must be present, pattern, characters that may not precede)
    (("eyJ",), re.compile(r"eyJ[A-Za-z0-9_-]{8,}+(?:\.[A-Za-z0-9_-]*+){0,2}"), _B64URL),
    (("sk-",), re.compile(r"sk-[A-Za-z0-9_-]{8,}+"), _WORD),
    (
        ("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"),
        re.compile(r"(?:gh[pousr]|github_pat)_[A-Za-z0-9_-]{8,}+"),
        _WORD,
    ),
    (("xox", "xapp-"), re.compile(r"(?:xox[abposr]|xapp)-[A-Za-z0-9-]{8,}+"), _WORD),
    (("AKIA", "ASIA"), re.compile(r"(?:AKIA|ASIA)[0-9A-Z]{16}(?![A-Za-z0-9_])"), _WORD),
    # Stripe secret and restricted keys: sk_/rk_, the mode, then the key
    (
        ("sk_live_", "sk_test_", "rk_live_", "rk_test_"),
        re.compile(r"[sr]k_(?:live|test)_[A-Za-z0-9]{10,}+"),
        _WORD,
    ),
    (("AIza",), re.compile(r"AIza[A-Za-z0-9_-]{30,}+"), _B64URL),  # Google API keys
    (("SK",), re.compile(r"SK[0-9a-fA-F]{32}(?![A-Za-z0-9_])"), _WORD),  # Twilio API key SIDs
    # SendGrid: SG, an id, a secret, dot-separated
    (("SG.",), re.compile(r"SG\.[A-Za-z0-9_-]{10,}+\.[A-Za-z0-9_-]{10,}+"), _WORD),
    (("npm_",), re.compile(r"npm_[A-Za-z0-9]{20,}+"), _WORD),  # npm access tokens
    (("hf_",), re.compile(r"hf_[A-Za-z0-9]{20,}+"), _WORD),  # Hugging Face tokens
)

_URL_TOKEN = re.compile(r"""[^\s"'<>`]*+""")

_DELIMITERS = frozenset(" \t\r\n\f\v\"'`,;&=:<>()[]{}|\\@")


def _token_replacer(not_before: frozenset[str]) -> Callable[[re.Match[str]], str]:
    def replace(match: re.Match[str]) -> str:
        at = match.start()
        if at and match.string[at - 1] in not_before:  # "desk-12345678" holds no key
            return match.group(0)
        scheme = match.groupdict().get("scheme")
        return f"{scheme} {REDACTED}" if scheme else REDACTED

    return replace


_TOKEN_RULES = tuple((hints, pattern, _token_replacer(nb)) for hints, pattern, nb in _TOKENS)
_BEARER_RULE = _token_replacer(_WORD)


def _tokens(text: str) -> str:
    lowered = text.lower()  # only asked whether a word is there
    if "bearer" in lowered or "basic" in lowered:
        text = _BEARER.sub(_BEARER_RULE, text)
    if _TOKEN_HINT.search(text) is None:
        return text
    for hints, pattern, replace in _TOKEN_RULES:
        if any(hint in text for hint in hints):
            text = pattern.sub(replace, text)
    return text


def _pem(text: str) -> str:
    parts: list[str] = []
    pos = 0
    while (begin := _PEM_BEGIN.search(text, pos)) is not None:
        end = _PEM_END.search(text, begin.end())
        parts += [text[pos : begin.start()], REDACTED]
        pos = len(text) if end is None else end.end()  # no END: the key runs to the cut
    return "".join(parts) + text[pos:] if parts else text


def _userinfo(text: str, *, truncated: bool) -> str:
    """``scheme://user:password@host`` -> ``scheme://user:***@host``; the password is
    everything from the user's ``:`` to the URL's last ``@`` (a raw ``@`` included)."""
    parts: list[str] = []
    pos = 0
    at = text.find("://")
    while at >= 0:
        start = at + 3
        following = text.find("://", start)
        token = _URL_TOKEN.match(text, start, len(text) if following < 0 else following)
        end = start if token is None else token.end()
        stop = text.rfind("@", start, end)
        if stop < 0 and truncated and end == len(text):
            stop = end  # the cut came before the '@': what follows 'user:' may be a password
        if stop >= 0:
            colon = text.find(":", start, stop)
            if colon >= 0 and not any(c in text[start:colon] for c in "/?#"):
                password = text[colon + 1 : stop]
                if password and password != "***":
                    parts += [text[pos : colon + 1], "***"]
                    pos = stop
        at = following
    return "".join(parts) + text[pos:] if parts else text


_EXTRA: list[re.Pattern[str]] = []
"""The patterns users added (`add_secret_pattern`), in the order added."""


def add_secret_pattern(pattern: str | re.Pattern[str]) -> Callable[[], None]:
    """Redact every match of `pattern` too, wherever `redact` runs (envelopes, prompts,
    events, logs, our tables); returns a function that removes it again.

    It runs on every text redacted, so keep it linear: a literal prefix, no nested
    repetition (``acme_[A-Za-z0-9]{32}``, not ``(\\w+)+``). A pattern that matches the
    empty string is refused.

    >>> remove = add_secret_pattern(r"acme_[A-Za-z0-9]{8,}")
    >>> redact("acme said acme_9fQk2LmZ0p rejected")
    'acme said [REDACTED] rejected'
    >>> remove()
    """
    compiled = re.compile(pattern) if isinstance(pattern, str) else pattern
    if compiled.fullmatch("") is not None:
        raise ConfigurationError(
            f"secret pattern {compiled.pattern!r} matches the empty string: "
            "give it a literal prefix, e.g. r'acme_[A-Za-z0-9]{8,}'"
        )
    _EXTRA.append(compiled)

    def remove() -> None:
        if compiled in _EXTRA:
            _EXTRA.remove(compiled)

    return remove


def _scrub(text: str, *, truncated: bool = False) -> str:
    if "-----BEGIN" in text:
        text = _pem(text)
    text = _catalogued(text)  # before our rules: they may redact what a format needs around it
    if ":" in text or "=" in text:
        lowered = text.lower()
        if "key" in lowered or "provided" in lowered:  # first: "pwd= ... key provided: X"
            text = _announced(text)
        text = _pairs(text)
        if "://" in text and ("@" in text or truncated):
            text = _userinfo(text, truncated=truncated)
    if "</" in text:
        text = _ELEMENT.sub(_element, text)
    if "--" in text:
        text = _FLAG.sub(_flag, text)
    if "-u" in text or "--user" in text:
        text = _USER_FLAG.sub(_pair, text)
    if "%3" in text or "%25" in text:
        text = _ENCODED.sub(_pair, text)
    text = _tokens(text)
    for pattern in tuple(_EXTRA):
        text = pattern.sub(REDACTED, text)
    return text


def _catalogued(text: str) -> str:
    """What detect-secrets' formats find, redacted; nothing when it is not installed."""
    found = secret_catalogue.spans(text)
    if not found:
        return text
    parts: list[str] = []
    pos = 0
    for start, end in found:
        parts += [text[pos:start], REDACTED]
        pos = end
    return "".join(parts) + text[pos:]


def _head(text: str, limit: int) -> str:
    """`text` cut to `limit` characters, without the first part of a token the cut
    splits (unless that token is too long to be a credential of its own)."""
    if text[limit - 1] in _DELIMITERS or text[limit] in _DELIMITERS:
        return text[:limit]
    for index in range(limit - 1, max(-1, limit - 1 - _PARTIAL_TOKEN), -1):
        if text[index] in _DELIMITERS:
            return text[: index + 1]
    return text[:limit]


def redact(text: str, *, limit: int | None = DEFAULT_LIMIT) -> str:
    """Remove credentials from free text, reading at most `limit` characters of it.

    A longer text is cut first and ends with `TRUNCATED`; the result is never longer
    than `limit`. ``limit=None`` scrubs all of it (still in linear time).

    >>> redact("GET failed: Authorization: Bearer abc.def.ghi")
    'GET failed: Authorization: [REDACTED]'
    >>> redact("postgresql://app:p@ss@db:5432/x")
    'postgresql://app:***@db:5432/x'
    >>> redact("password=correct horse&3 battery user=app")
    'password=[REDACTED] user=app'
    >>> redact("retry failed: sk-abcdefghijklmnop", limit=30)  # never 'sk-abcdefghijklm'
    'retry failed: …[truncated]'
    """
    if limit is None:
        return _scrub(text)
    if limit <= len(TRUNCATED):
        return TRUNCATED[:limit] if limit > 0 else ""
    if len(text) <= limit:
        out = _scrub(text)
    else:
        out = _scrub(_head(text, limit), truncated=True) + TRUNCATED
    if len(out) > limit:  # "[REDACTED]" can be longer than what it replaced
        out = out[: limit - len(TRUNCATED)] + TRUNCATED
    return out


# ------------------------------------------------------------------ JSON values


def redact_value(value: Any, *, limit: int | None = DEFAULT_LIMIT, _depth: int = 0) -> Any:
    """Redact a JSON-like value: secret-named keys are blanked, strings scrubbed (each
    with `redact`'s `limit`), lists, tuples and sets of any depth walked (as lists);
    anything else becomes its scrubbed ``repr``. Deeper than 8 levels is blanked.

    >>> redact_value({"user": "u", "password": "x", "items": [{"note": "token=abc123"}]})
    {'user': 'u', 'password': '[REDACTED]', 'items': [{'note': 'token=[REDACTED]'}]}
    """
    if _depth > _MAX_DEPTH:
        return REDACTED
    if isinstance(value, str):
        return redact(value, limit=limit)
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, Mapping):
        return {
            str(k): REDACTED
            if is_secret_key(k)
            else redact_value(v, limit=limit, _depth=_depth + 1)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple | Set):
        if value and isinstance(value, list | tuple) and all(_is_pair(v) for v in value):
            # headers as [("Cookie", "sid=..."), ...]: a secret-named pair keeps its name
            # (scrubbed: ["<text with a key>", "x"] is a list of two texts, too)
            return [
                [
                    redact(k, limit=limit),
                    REDACTED
                    if is_secret_key(k)
                    else redact_value(v, limit=limit, _depth=_depth + 2),
                ]
                for k, v in value
            ]
        return [redact_value(v, limit=limit, _depth=_depth + 1) for v in value]
    return redact(repr(value), limit=limit)


def _is_pair(value: Any) -> bool:
    return isinstance(value, list | tuple) and len(value) == 2 and isinstance(value[0], str)


def mask_args(args: Mapping[str, Any]) -> dict[str, Any]:
    """A tool call's arguments as a model or a human may see them: every secret-named
    argument (at any depth) is ``[REDACTED]``, every string scrubbed.

    Use it wherever a call's arguments are shown (repair and planner prompts, the
    escalation request); `unmask_args` maps a masked value copied back to the real one.

    >>> mask_args({"user": "u", "password": "hunter2", "auth": {"token": "t"}})
    {'user': 'u', 'password': '[REDACTED]', 'auth': '[REDACTED]'}
    """
    masked = redact_value(dict(args))
    return masked if isinstance(masked, dict) else {}


def unmask_args(proposed: Mapping[str, Any], original: Mapping[str, Any]) -> dict[str, Any]:
    """`proposed` arguments with each value that is exactly what `mask_args` showed of
    `original` at the same place replaced by the original value.

    A model repairing a call (or a human editing it) sees ``"password": "[REDACTED]"``;
    sending that back means "keep it", never "set the password to [REDACTED]". Only
    values at the same path as in `original` are restored, so a masked secret never
    moves to another argument.

    >>> unmask_args({"user": "v", "password": REDACTED}, {"user": "u", "password": "pw"})
    {'user': 'v', 'password': 'pw'}
    """
    restored = _restore(dict(proposed), dict(original), 0, secret=False)
    return restored if isinstance(restored, dict) else dict(proposed)


def _restore(new: Any, old: Any, depth: int, *, secret: bool) -> Any:
    if secret or depth > _MAX_DEPTH:
        return old if new == REDACTED and old != REDACTED else new
    if isinstance(new, Mapping) and isinstance(old, Mapping):
        before = {str(k): v for k, v in old.items()}
        return {
            k: _restore(v, before[k], depth + 1, secret=is_secret_key(k)) if k in before else v
            for k, v in new.items()
        }
    if isinstance(new, list) and isinstance(old, list | tuple) and len(new) == len(old):
        if old and all(_is_pair(pair) for pair in old):  # shown as [name, value] pairs
            return [
                [a[0], _restore(a[1], b[1], depth + 2, secret=is_secret_key(b[0]))]
                if _is_pair(a) and a[0] == b[0]
                else a
                for a, b in zip(new, old, strict=True)
            ]
        return [_restore(a, b, depth + 1, secret=False) for a, b in zip(new, old, strict=True)]
    if (
        isinstance(new, str)
        and new != old
        and not isinstance(old, Mapping | list | tuple | Set)
        and new == redact_value(old, _depth=depth)
    ):
        return old
    return new
