"""The fault model: which tool attempt fails, how, and the real httpx error it raises.

Why this module exists: a comparison between frameworks is only fair if every
contender meets the same faults. Faults are drawn per tool *attempt* (one
invocation of the wrapped AgentDojo function), and the draw is a pure function of
``(seed, suite, task, function, canonical arguments, attempt number)``: those are
hashed (SHA-256) into the seed of a `random.Random`, which decides whether the
attempt fails (probability `Mix.rate`) and with which kind (the mix's weights).
So the n-th attempt of the same call in the same task meets the same fault in
every contender, however differently the contenders got there, and the draw does
not depend on how many other calls a contender made before. Every mix with
faults uses the same first draw for "does it fail" and the same rate, so all mixes
fault the same attempts (common random numbers) and differ only in the kind.

Kinds:

- ``http_429``: ``httpx.HTTPStatusError`` on a 429 response with ``Retry-After: 1``;
- ``http_503``: ``httpx.HTTPStatusError`` on a 503 response;
- ``connect_timeout``: ``httpx.ConnectTimeout``, raised *before sending*: the
  function does not run;
- ``connect_error``: ``httpx.ConnectError`` (connection refused), raised before
  sending: the function does not run;
- ``read_timeout_before``: ``httpx.ReadTimeout`` raised *without* running the
  function (the request was lost on the way, or the server dropped it): the
  client's evidence is ambiguous (it cannot tell this from a commit timeout), but
  the effect is not done;
- ``commit_timeout``: the function runs and mutates the environment, *then*
  ``httpx.ReadTimeout`` (the effect committed, the response was lost).

The first four are *definite refusals* (the error itself says nothing ran); the
last two are *ambiguous* (a read timeout: the client cannot know whether it ran).
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
from collections.abc import Mapping

import httpx

KINDS = (
    "http_429",
    "http_503",
    "connect_error",
    "connect_timeout",
    "read_timeout_before",
    "commit_timeout",
)
REFUSALS = frozenset({"http_429", "http_503", "connect_error", "connect_timeout"})
"""Kinds whose error is a definite refusal: nothing ran, and the error says so."""
BEFORE_EXECUTION = REFUSALS | {"read_timeout_before"}
"""Kinds that fail before the function runs; ``commit_timeout`` fails after."""
AMBIGUOUS = frozenset({"read_timeout_before", "commit_timeout"})
"""Kinds whose error (a read timeout) cannot tell whether the function ran."""

RATE = 0.15


@dataclasses.dataclass(frozen=True, slots=True)
class Mix:
    """A fault mix: the per-attempt failure probability and the kinds' weights."""

    name: str
    rate: float
    weights: Mapping[str, float]
    description: str

    def draw(
        self, *, seed: int, suite: str, task: str, function: str, key: str, attempt: int
    ) -> str | None:
        """The fault of this attempt (None: it succeeds). Deterministic; see the module."""
        if self.rate <= 0 or not self.weights:
            return None
        material = f"{seed}\x1f{suite}\x1f{task}\x1f{function}\x1f{key}\x1f{attempt}"
        rng = random.Random(hashlib.sha256(material.encode()).digest())
        if rng.random() >= self.rate:
            return None
        kinds = list(self.weights)
        return rng.choices(kinds, weights=[self.weights[k] for k in kinds])[0]


_REFUSAL_WEIGHTS = {"http_429": 1, "http_503": 1, "connect_error": 1, "connect_timeout": 1}
_TRANSIENT_WEIGHTS = {**_REFUSAL_WEIGHTS, "read_timeout_before": 1}

MIXES: Mapping[str, Mix] = {
    m.name: m
    for m in (
        Mix(
            "refusals",
            RATE,
            _REFUSAL_WEIGHTS,
            "e=0.15 per attempt; definite refusals only: 429 (Retry-After: 1), 503, "
            "connect refused, connect timeout, 1:1:1:1 (nothing ran)",
        ),
        Mix(
            "transient",
            RATE,
            _TRANSIENT_WEIGHTS,
            "e=0.15 per attempt; the refusals + a read timeout before the function ran "
            "(ambiguous, not done), 1:1:1:1:1",
        ),
        Mix(
            "transient+commit",
            RATE,
            {**_TRANSIENT_WEIGHTS, "commit_timeout": 5},
            "e=0.15 per attempt; the transient kinds 1:1:1:1:1 + a read timeout after "
            "the commit 5 (half the faults)",
        ),
        Mix(
            "commit",
            RATE,
            {"commit_timeout": 1},
            "e=0.15 per attempt; read timeout after commit only",
        ),
        Mix("clean", 0.0, {}, "no faults (validates the replay model and the grading)"),
        Mix(
            "mcp_refusals",
            RATE,
            {"mcp_refused": 1, "closed_before": 1},
            "MCP, e=0.15 per attempt; JSON-RPC error response, session closed before "
            "sending, 1:1 (nothing ran)",
        ),
        Mix(
            "mcp_transient",
            RATE,
            {"mcp_refused": 1, "closed_before": 1, "dropped_before": 1},
            "MCP, e=0.15 per attempt; the MCP refusals + connection dropped before the "
            "tool ran (ambiguous, not done), 1:1:1",
        ),
        Mix(
            "mcp_transient+commit",
            RATE,
            {"mcp_refused": 1, "closed_before": 1, "dropped_before": 1, "dropped_after": 3},
            "MCP, e=0.15 per attempt; mcp_transient 1:1:1 + connection dropped after the "
            "tool ran 3 (half the faults)",
        ),
        Mix(
            "mcp_commit",
            RATE,
            {"dropped_after": 1},
            "MCP, e=0.15 per attempt; connection dropped after the tool ran only",
        ),
    )
}
MCP_MIXES = frozenset(m for m in MIXES if m.startswith("mcp_"))
"""Mixes whose kinds are played by the MCP relay (`mcp_transport`), ``--transport mcp``."""
MCP_DEFAULT_MIXES: tuple[str, ...] = ("mcp_refusals", "mcp_transient", "mcp_transient+commit")
DEFAULT_MIXES: tuple[str, ...] = ("refusals", "transient", "transient+commit", "commit", "clean")


def make_error(kind: str, *, suite: str, function: str) -> Exception:
    """The exception a real HTTP client would raise for this fault."""
    request = httpx.Request("POST", f"https://{suite}.agentdojo.test/v1/{function}")
    if kind == "http_429":
        response = httpx.Response(429, headers={"Retry-After": "1"}, request=request)
    elif kind == "http_503":
        response = httpx.Response(503, request=request)
    elif kind == "connect_timeout":
        return httpx.ConnectTimeout("timed out while connecting", request=request)
    elif kind == "connect_error":
        return httpx.ConnectError("[Errno 111] Connection refused", request=request)
    elif kind in ("read_timeout_before", "commit_timeout"):
        return httpx.ReadTimeout("timed out while reading the response", request=request)
    else:
        raise ValueError(f"unknown fault kind {kind!r}")
    phrase = response.reason_phrase
    return httpx.HTTPStatusError(
        f"Server error '{response.status_code} {phrase}' for url '{request.url}'"
        if response.status_code >= 500
        else f"Client error '{response.status_code} {phrase}' for url '{request.url}'",
        request=request,
        response=response,
    )
