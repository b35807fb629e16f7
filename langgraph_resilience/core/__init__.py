"""Pure decisions, no I/O: the functions behind classification, backoff, keys and
redaction, for custom rules and for tests.

The modules inside are internal; import from here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from langgraph_resilience._lazy import lazy_exports as _lazy_exports

if TYPE_CHECKING:
    from langgraph_resilience.core.backoff import (
        backoff_delay,
    )
    from langgraph_resilience.core.canonical import (
        call_key,
        canonical_args,
    )
    from langgraph_resilience.core.classification import (
        DEFAULT_RULES,
        Verdict,
        classify,
        http_status,
        retriable,
        retry_after_ms,
    )
    from langgraph_resilience.core.clock import (
        Clock,
        SystemClock,
    )
    from langgraph_resilience.core.partial import (
        FailedItem,
    )
    from langgraph_resilience.core.redaction import (
        add_secret_pattern,
        redact,
    )
    from langgraph_resilience.core.reliability import (
        expected_attempts,
        max_error_rate,
        retries_needed,
        task_failure,
    )

_HOMES: dict[str, str] = {
    "backoff_delay": "langgraph_resilience.core.backoff",
    "call_key": "langgraph_resilience.core.canonical",
    "canonical_args": "langgraph_resilience.core.canonical",
    "DEFAULT_RULES": "langgraph_resilience.core.classification",
    "Verdict": "langgraph_resilience.core.classification",
    "classify": "langgraph_resilience.core.classification",
    "http_status": "langgraph_resilience.core.classification",
    "retriable": "langgraph_resilience.core.classification",
    "retry_after_ms": "langgraph_resilience.core.classification",
    "Clock": "langgraph_resilience.core.clock",
    "SystemClock": "langgraph_resilience.core.clock",
    "FailedItem": "langgraph_resilience.core.partial",
    "add_secret_pattern": "langgraph_resilience.core.redaction",
    "redact": "langgraph_resilience.core.redaction",
    "expected_attempts": "langgraph_resilience.core.reliability",
    "max_error_rate": "langgraph_resilience.core.reliability",
    "retries_needed": "langgraph_resilience.core.reliability",
    "task_failure": "langgraph_resilience.core.reliability",
}
"""Where each public name lives: imported from there on first use."""

__all__ = [
    "DEFAULT_RULES",
    "Clock",
    "FailedItem",
    "SystemClock",
    "Verdict",
    "add_secret_pattern",
    "backoff_delay",
    "call_key",
    "canonical_args",
    "classify",
    "expected_attempts",
    "http_status",
    "max_error_rate",
    "redact",
    "retriable",
    "retries_needed",
    "retry_after_ms",
    "task_failure",
]

__getattr__, __dir__ = _lazy_exports(__name__, _HOMES)
