"""Secret redaction for everything that leaves a tool call: envelopes, events, logs.

An exception's text routinely carries what must never reach a model or a log:
``Authorization`` headers, bearer tokens, API keys, passwords, DSNs with
credentials. Redaction is applied once, where the envelope is built.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = ["REDACTED", "redact", "redact_value"]

REDACTED = "[REDACTED]"

_SECRET_KEY = re.compile(
    # a key that *is* a secret's name, or ends with one: "access_token" yes, "max_tokens" no
    r"^(?:.*[_\-.])?(authorization|password|passwd|pwd|secret|token|api[_-]?key|apikey|"
    r"cookie|set-cookie|credentials?|private[_-]?key|dsn|session[_-]?id|access[_-]?key)$",
    re.IGNORECASE,
)

_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    # scheme://user:password@host  ->  scheme://user:[REDACTED]@host
    # (the user may be empty: redis://:password@host)
    (re.compile(r"(\b[a-z][a-z0-9+.-]*://[^:/@\s]*:)([^@\s]+)(@)", re.IGNORECASE), r"\1***\3"),
    # Authorization: Bearer xyz / Basic xyz
    (
        re.compile(r"((?:proxy-)?authorization[\"']?\s*[:=]\s*[\"']?)([^\"',}\n]+)", re.IGNORECASE),
        r"\1" + REDACTED,
    ),
    (re.compile(r"\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{6,}", re.IGNORECASE), r"\1 " + REDACTED),
    # key=value and "key": "value" pairs whose key names a secret
    (
        re.compile(
            r"((?:password|passwd|pwd|secret|token|api[_-]?key|apikey|access[_-]?key|"
            r"client[_-]?secret)[\"']?\s*[:=]\s*[\"']?)([^\s\"'&,;}]+)",
            re.IGNORECASE,
        ),
        r"\1" + REDACTED,
    ),
    # well-known token shapes
    (re.compile(r"\bsk-[A-Za-z0-9_-]{8,}"), REDACTED),
    (re.compile(r"\b(?:ghp|gho|ghu|ghs|ghr|github_pat)_[A-Za-z0-9_-]{8,}"), REDACTED),
    (re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{8,}"), REDACTED),  # Slack uses a dash
    (re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"), REDACTED),
)


def redact(text: str) -> str:
    """Remove credentials from free text.

    >>> redact("GET failed: Authorization: Bearer abc.def.ghi")
    'GET failed: Authorization: [REDACTED]'
    >>> redact("postgresql://app:hunter2@db:5432/x")
    'postgresql://app:***@db:5432/x'
    """
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


def redact_value(value: Any, *, _depth: int = 0) -> Any:
    """Redact a JSON-like value: secret-named keys are blanked, strings scrubbed."""
    if _depth > 8:
        return REDACTED
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, Mapping):
        return {
            str(k): REDACTED if _SECRET_KEY.search(str(k)) else redact_value(v, _depth=_depth + 1)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [redact_value(v, _depth=_depth + 1) for v in value]
    if value is None or isinstance(value, bool | int | float):
        return value
    return redact(repr(value))
