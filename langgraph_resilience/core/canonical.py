"""Canonical tool arguments and call keys: the identity of "the same call".

Loop detection, idempotency keys and the replan verifier all ask whether two
calls are the same. Two calls are the same when their canonical arguments are
equal: keys sorted, noise fields (the model's reasoning, request ids,
timestamps, nonces) removed at every depth, floats rounded to 6 places, and
every value reduced to JSON deterministically, so the key is stable across
processes and Python versions (no ``hash()``, which is salted per process).
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import enum
import hashlib
import json
import math
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel

__all__ = ["DEFAULT_NOISE_FIELDS", "call_key", "canonical_args"]

DEFAULT_NOISE_FIELDS: frozenset[str] = frozenset(
    {"reasoning", "thought", "thoughts", "note", "notes", "request_id", "timestamp", "nonce"}
)
"""Argument names that never change what a call does, dropped before comparing."""

_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)
"""One encoder for every key: ``json.dumps`` with options builds a new one per call."""

_make_c_encoder = getattr(json.encoder, "c_make_encoder", None)
_C_ENCODE = (
    None
    if _make_c_encoder is None
    else _make_c_encoder(
        None, _ENCODER.default, json.encoder.encode_basestring, None, ":", ",", True, False, True
    )
)
"""CPython's C encoder with `_ENCODER`'s settings, built once: `JSONEncoder.encode`
rebuilds it on every call, which was half the cost of a key. No circular-reference
check: what it encodes is flat or freshly normalized, so it has no cycles."""

_FLAT = frozenset({str, int, bool, type(None)})
"""Scalar types that canonicalize to themselves (floats are rounded, so not here)."""

_FLOAT_DIGITS = 6
_MAX_DEPTH = 32


def _normalize(value: Any, noise: frozenset[str], depth: int) -> Any:
    if depth > _MAX_DEPTH:
        return "<max-depth>"
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if math.isnan(value):
            return {"$float": "nan"}
        if math.isinf(value):
            return {"$float": "inf" if value > 0 else "-inf"}
        rounded = round(value, _FLOAT_DIGITS)
        # 2.0 and 2 are the same argument to every JSON-speaking tool.
        return int(rounded) if rounded.is_integer() and abs(rounded) < 2**53 else rounded
    if isinstance(value, decimal.Decimal):
        return _normalize(float(value), noise, depth)
    if isinstance(value, enum.Enum):
        return _normalize(value.value, noise, depth + 1)
    if isinstance(value, BaseModel):
        return _normalize(value.model_dump(mode="json"), noise, depth + 1)
    if isinstance(value, Mapping):
        return {
            str(k): _normalize(v, noise, depth + 1)
            for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))
            if str(k) not in noise
        }
    if isinstance(value, bytes | bytearray | memoryview):
        return {"$bytes": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return {"$seconds": _normalize(value.total_seconds(), noise, depth + 1)}
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, set | frozenset):
        items = [_normalize(v, noise, depth + 1) for v in value]
        return sorted(items, key=lambda v: json.dumps(v, sort_keys=True))
    if isinstance(value, Iterable):
        return [_normalize(v, noise, depth + 1) for v in value]
    return {"$repr": type(value).__qualname__}


def canonical_args(args: Any, *, noise_fields: Iterable[str] = DEFAULT_NOISE_FIELDS) -> str:
    """Return the canonical JSON text of a call's arguments.

    >>> canonical_args({"b": 1.0000001, "a": "x", "reasoning": "because"})
    '{"a":"x","b":1}'
    """
    noise = noise_fields if isinstance(noise_fields, frozenset) else frozenset(noise_fields)
    if type(args) is dict and noise.isdisjoint(args):
        for key, value in args.items():
            if type(key) is not str or type(value) not in _FLAT:
                break
        else:
            return _encode(args)  # the common case: flat JSON scalars, nothing to drop
    return _encode(_normalize(args, noise, 0))


def _encode(value: Any) -> str:
    if _C_ENCODE is None:
        return _ENCODER.encode(value)
    return "".join(_C_ENCODE(value, 0))


def call_key(tool: str, args: Any, *, noise_fields: Iterable[str] = DEFAULT_NOISE_FIELDS) -> str:
    """Return a short, process-stable key for (tool, canonical args).

    >>> call_key("search", {"q": "x"}) == call_key("search", {"q": "x", "nonce": 7})
    True
    """
    digest = hashlib.sha256(
        canonical_args(args, noise_fields=noise_fields).encode("utf-8")
    ).hexdigest()
    return f"{tool}:{digest[:20]}"
