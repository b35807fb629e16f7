"""The failure taxonomy, the `ToolError` envelope and the exception tree.

Every tool failure becomes exactly one `ToolError`: the model sees it (as the
content of a `ToolMessage(status="error")`), events carry it and the tally
stores it. Its `failure_class` is the routing key of the whole package.

Exception tree (the subclasses defined next to the code that raises them)::

    Exception
    ├── ResilienceError                 base of everything raised at run time
    │   ├── ToolFailure                 a tool raises it on purpose, carrying a ToolError
    │   │   ├── BulkheadFullError       (bulkhead.py) no slot in a tool's bulkhead: TRANSIENT
    │   │   ├── McpReconnectingError    (mcp_sessions.py) a dropped MCP session's backoff
    │   │   ├── OutcomeUnknownError     (exactly_once.py) a side effect may have happened
    │   │   └── EffectNotDone           (exactly_once.py) not done, no attempt left
    │   ├── OutputValidationError       .problems: why a "successful" result is wrong
    │   ├── CircuitOpenError            .retry_after: seconds until half-open
    │   │   └── McpServerDownError      .server, .tools: an MCP server's breaker is open
    │   ├── McpToolError                .content: an MCP tool answered ``isError: true``
    │   ├── ToolGoneError               .tool: answered STRUCTURAL earlier in the thread
    │   ├── PlanError                   (plan/model.py) an unusable plan
    │   │   ├── PlanReferenceError      .reference: a $steps reference that cannot resolve
    │   │   └── PlanCycleError          .cycle: the steps that depend on each other
    │   ├── PersistenceError            cannot open the store; the DSN redacted
    │   │   └── SetupTimeoutError       start-up setup waited too long, never hangs
    │   ├── LedgerUnavailableError      .operation: our own ledger failed; never the tool's
    │   ├── StepNotSavedError           the step asking for a side effect was not saved
    │   ├── ThreadBusyError             another runner holds the thread
    │   │   └── ThreadLockLostError     this runner's lease lapsed or was taken over: it stopped
    │   └── ThreadNotFoundError         no checkpoint for the thread id
    ├── TimeoutError
    │   └── AttemptAbandoned            .grace: tool_timeout gave up; it may still land
    ├── ValueError
    │   └── ConfigurationError          misconfiguration, raised at construction
    └── Warning
        └── UserWarning
            └── ResilienceWarning       a setup that works but defeats resilience (warned)
"""

from __future__ import annotations

import enum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "AttemptAbandoned",
    "CircuitOpenError",
    "ConfigurationError",
    "FailureClass",
    "LedgerUnavailableError",
    "McpServerDownError",
    "McpToolError",
    "OutputValidationError",
    "PersistenceError",
    "ResilienceError",
    "ResilienceWarning",
    "SetupTimeoutError",
    "StepNotSavedError",
    "ThreadBusyError",
    "ThreadLockLostError",
    "ThreadNotFoundError",
    "ToolError",
    "ToolFailure",
    "ToolGoneError",
]


class FailureClass(enum.StrEnum):
    """Why a tool call failed, which decides the one recovery path that fits it."""

    TRANSIENT = "transient"
    """Timeouts, 408/429/5xx, connection resets: the same call may succeed later."""
    SEMANTIC = "semantic"
    """Bad arguments or output (validation, JSON, 400/422): the call must change."""
    STRUCTURAL = "structural"
    """The tool is missing, renamed, 404/410 or its breaker is open: use another path."""
    POLICY = "policy"
    """401/403, quota, business-rule refusal: only a human may decide."""
    PARTIAL = "partial"
    """A batch where some items failed: redo only those."""
    UNKNOWN = "unknown"
    """Unrecognized, or a side effect whose outcome is unknown: stop, never guess."""


SuggestedAction = str
"""One of ``retry``, ``fix_arg:<field>``, ``fix_args``, ``use_tool:<name>``,
``query_status``, ``ask_human``."""


class ToolError(BaseModel):
    """The structured envelope of one failed tool call.

    It is what the model reads (JSON content of an error `ToolMessage`, like
    MCP's ``isError`` results), what events carry and what the tally stores, so
    it is JSON-only and never contains a secret: `classify` redacts it.

    >>> ToolError(type="HTTPError", failure_class="transient", message="503",
    ...           suggested_action="retry", retriable=True).failure_class
    <FailureClass.TRANSIENT: 'transient'>
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    type: str = Field(description="The exception type name, e.g. 'HTTPStatusError'.")
    failure_class: FailureClass
    message: str = Field(description="A redacted, human-readable explanation.")
    suggested_action: SuggestedAction = Field(
        description="What should happen next: retry, fix_arg:<field>, fix_args, "
        "use_tool:<name>, query_status or ask_human."
    )
    retriable: bool = Field(description="True only if the same call may succeed later.")
    retry_after_ms: int | None = Field(
        default=None, description="The server's Retry-After, in milliseconds."
    )
    tool: str | None = None
    call_id: str | None = None
    attempt: int = Field(default=0, description="How many times this call was executed.")
    context: dict[str, Any] = Field(
        default_factory=dict, description="Status code and redacted detail."
    )

    def for_call(self, *, tool: str, call_id: str, attempt: int) -> ToolError:
        """Return a copy bound to one tool call."""
        return self.model_copy(update={"tool": tool, "call_id": call_id, "attempt": attempt})


class ResilienceError(Exception):
    """Base of every exception this package raises at run time."""


class ToolFailure(ResilienceError):
    """Raise this from a tool to report a failure already classified by the tool.

    >>> raise ToolFailure(FailureClass.POLICY, "refund limit exceeded")  # doctest: +SKIP
    """

    def __init__(
        self,
        failure_class: FailureClass | str,
        message: str,
        *,
        suggested_action: SuggestedAction | None = None,
        retry_after_ms: int | None = None,
        context: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.failure_class = FailureClass(failure_class)
        self.message = message
        self.suggested_action = suggested_action
        self.retry_after_ms = retry_after_ms
        self.context = dict(context or {})


class OutputValidationError(ResilienceError):
    """A result that looks successful breaks the tool's declared output contract.

    `effect_unknown` is set when the tool is a side effect that ran and nothing could
    tell whether it took effect (no `status_check`): UNKNOWN, not SEMANTIC, because
    re-issuing the call could do it twice.
    """

    def __init__(self, problems: list[str], *, effect_unknown: bool = False) -> None:
        super().__init__("tool output failed validation: " + "; ".join(problems))
        self.problems = problems
        self.effect_unknown = effect_unknown


class CircuitOpenError(ResilienceError):
    """The tool's circuit breaker is open; calls fail fast until it half-opens."""

    def __init__(self, key: str, retry_after: float) -> None:
        super().__init__(f"circuit {key!r} is open; retry after {retry_after:.3f}s")
        self.key = key
        self.retry_after = retry_after


class McpServerDownError(CircuitOpenError):
    """An MCP server's breaker is open (the server is declared down): every tool it
    serves fails fast. ``.tools`` names them, so the agent can be told once."""

    def __init__(self, server: str, key: str, retry_after: float, tools: list[str]) -> None:
        super().__init__(key, retry_after)
        listed = ", ".join(tools) if tools else "its tools"
        self.args = (
            f"MCP server {server!r} is unavailable (circuit open; retry after "
            f"{retry_after:.3f}s): {listed} cannot be used now",
        )
        self.server = server
        self.tools = tools


class McpToolError(ResilienceError):
    """An MCP tool ran and reported a failure (``isError: true``): the tool's own
    failure, not the protocol's. ``.content`` is its text, which may be an envelope."""

    def __init__(self, content: str, *, server: str | None = None) -> None:
        super().__init__(content or "MCP tool returned an error with empty content")
        self.content = content
        self.server = server


class ToolGoneError(ResilienceError):
    """The tool answered STRUCTURAL (404/410) earlier in this thread: not called again
    while `ResiliencePolicy.structural_memory` lasts."""

    def __init__(self, tool: str, ago: float) -> None:
        super().__init__(
            f"tool {tool!r} answered a STRUCTURAL failure {ago:.0f}s ago in this thread "
            "(its endpoint is gone or changed), so it was not called again; use another "
            "tool or another path"
        )
        self.tool = tool
        self.ago = ago


class ThreadBusyError(ResilienceError):
    """Another runner holds the thread's lock: running it too would fork the thread.

    ``.thread_id`` names the thread. Wait for the other run, or lock with
    ``wait=True`` (or a number of seconds) to queue behind it.
    """

    def __init__(self, thread_id: str, target: str = "") -> None:
        where = f" ({target})" if target else ""
        super().__init__(
            f"thread {thread_id!r} is being run by another runner{where}; "
            "wait for that run to finish, or lock with wait=True to queue behind it"
        )
        self.thread_id = thread_id


class ThreadLockLostError(ThreadBusyError):
    """This runner's thread lease is gone (it was not renewed in time: a paused or
    partitioned process, a database that did not answer; then another runner may have
    taken the thread over with a newer token): it stopped before its next write, and
    the database refuses the ledger writes of its old token. Resume the thread again
    (under the lock) to continue."""

    def __init__(self, thread_id: str, target: str = "") -> None:
        where = f" ({target})" if target else ""
        ResilienceError.__init__(
            self,
            f"the lock of thread {thread_id!r} was lost{where}: its lease lapsed or another "
            "runner took the thread over, so this run stopped before writing; resume the "
            "thread to continue",
        )
        self.thread_id = thread_id


class LedgerUnavailableError(ResilienceError):
    """The side-effect ledger (ours: the intent/outcome store, the saga log) failed after
    its retries. It is an infrastructure failure, never the tool's: raised before the
    effect runs, so nothing ran; the cause is chained."""

    def __init__(self, operation: str, cause: BaseException) -> None:
        super().__init__(
            f"the idempotency ledger is unavailable ({operation} failed: "
            f"{type(cause).__name__}); the side effect was not run. Check the database, "
            "then resume the thread"
        )
        self.operation = operation


class StepNotSavedError(ResilienceError):
    """The checkpoint of the step that asked for a side effect was not saved in time.

    Under ``durability="async"`` LangGraph saves a step while the next one runs; an
    effect that ran before the step asking for it was saved could, after a crash, be
    asked for again by a model that never saw it. So the effect waits for that save,
    and when it does not come the run stops here: nothing ran. Check the checkpointer's
    database, then resume the thread.
    """

    def __init__(self, tool: str, seconds: float) -> None:
        super().__init__(
            f"the checkpoint of the step that called {tool!r} was not saved within "
            f"{seconds:g}s, so the side effect was not run (a crash could lose the call "
            "that asked for it); check the checkpointer's database, then resume the thread. "
            "Under durability='exit' nothing is saved before the run ends: run a graph "
            "with side effects with durability='sync' or 'async'. A subgraph compiled with "
            "checkpointer=False saves nothing either, though its parent saves: compile it "
            "with checkpointer=None to save its steps under the parent's thread"
        )
        self.tool = tool


class AttemptAbandoned(TimeoutError):
    """`tool_timeout` stopped waiting for an attempt that may still be running (a thread
    cannot be killed; a remote service may still commit): for up to `grace` seconds its
    outcome is not known, so a side effect is not asked about before then."""

    def __init__(self, timeout: float, grace: float) -> None:
        super().__init__(f"tool did not finish within {timeout:g}s")
        self.timeout = timeout
        self.grace = grace


class ConfigurationError(ValueError):
    """Misconfiguration, raised at construction with a message saying how to fix it."""


class ResilienceWarning(UserWarning):
    """A setup that works but defeats part of the resilience, warned at construction
    with a message saying how to fix it (e.g. a wrapped chat model that retries on its
    own under `resilient_model`'s retries)."""


ExhaustionReason = Literal[
    "max_attempts",
    "max_tool_attempts",
    "max_thread_tool_attempts",
    "deadline",
    "side_effect",
    "max_repair",
    "max_recovery_llm_calls",
    "loop",
    "max_replans",
    "plan_failed",
    "retry_budget",
    "retry_after",
]
"""Why a failure went back to the agent instead of to (another) recovery step."""


class PersistenceError(ResilienceError):
    """The checkpointer or store could not be opened; the message names the target
    with any password redacted."""


class SetupTimeoutError(PersistenceError):
    """Creating our tables at start-up waited too long: another process held the setup
    lock (or a lock on our tables) for longer than start-up waits. It never hangs."""

    @classmethod
    def waiting(cls, what: str, *, seconds: str = "") -> SetupTimeoutError:
        """The error of a setup of `what` that gave up waiting."""
        waited = f" for {seconds}" if seconds else ""
        return cls(
            f"setting up {what} waited{waited} for another process's setup (or a lock on "
            "our tables) and gave up; start again once it is done, or create the tables "
            "once from a deploy step (open_postgres(dsn) or store.setup()) and start the "
            "workers with setup=False"
        )


class ThreadNotFoundError(ResilienceError):
    """`resume` was asked to continue a thread that has no checkpoint."""

    def __init__(self, thread_id: str) -> None:
        super().__init__(
            f"thread {thread_id!r} has no checkpoint to resume from; start it with "
            "app.invoke(inputs, config) first, or check the thread id and the checkpointer"
        )
        self.thread_id = thread_id
