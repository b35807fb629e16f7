"""AgentDojo's functions as LangChain tools over a mutable environment, with faults.

Why this module exists: the contenders are LangGraph/LangChain agents, so they need
``BaseTool``s; the tasks are AgentDojo's, so the tools must run AgentDojo's real
functions on AgentDojo's real environment. A `Sandbox` holds the environment of
the task being run (replaced by a fresh copy before each task), draws each
attempt's fault from the `Mix`, and logs every attempt as an `Attempt`, from
which the runner counts duplicates, missed calls and tool executions.

Each tool is a ``StructuredTool`` whose schema is the function's own
``parameters`` model; it calls ``FunctionsRuntime.run_function(...,
raise_on_error=True)``, which validates the arguments and injects the
environment dependencies exactly as AgentDojo's own pipeline does. A function's
own error (e.g. deleting a file that is gone) is raised as is; results are
rendered with AgentDojo's ``tool_result_to_str`` (YAML), as its pipeline shows
them to a model.

With ``keyed=True`` the sandbox plays a service that honours an ``Idempotency-Key``
header, as payment APIs do: a call that carries a key the service has already run
gets that run's result back instead of a second run. A tool sends the key the
package gives it (`current_idempotency_key()`, as the README tells a user to);
tools of contenders that give none send no key and run every time.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import Counter
from collections.abc import Mapping
from typing import Any

from langchain_core.tools import BaseTool, StructuredTool

from agentdojo.agent_pipeline.tool_execution import tool_result_to_str
from agentdojo.functions_runtime import Function, TaskEnvironment
from langgraph_resilience import current_idempotency_key

from .faults import BEFORE_EXECUTION, Mix, make_error
from .suites import Suite, canonical_key


@dataclasses.dataclass(frozen=True, slots=True)
class Attempt:
    """One invocation of a wrapped function."""

    function: str
    key: str
    number: int
    """1 for the first attempt of this call (function + arguments) in the task."""
    fault: str | None
    ran: bool
    """The function body ran to completion (its effect, if any, is committed)."""
    delivered: bool
    """Its result reached the caller (no fault, no error of its own)."""
    error: str | None = None
    """The function's own exception, if it raised one."""
    changed: bool = False
    """The run changed the environment (its dump differs before and after). Measured
    for side-effecting functions only: a repeat that changes nothing (an idempotent
    write run again) is a repeat, not a duplicate effect."""


class Sandbox:
    """The environment and fault source for one contender's conversation."""

    def __init__(self, suite: Suite, mix: Mix, seed: int, *, keyed: bool = False) -> None:
        self.suite = suite
        self.keyed = keyed
        self._served: dict[str, str] = {}
        """Idempotency key -> the result of the run it made (``keyed`` only)."""
        self.mix = mix
        self.seed = seed
        self.runtime = suite.runtime
        self.env: TaskEnvironment | None = None
        self.task_id = ""
        self.attempts: list[Attempt] = []
        self._numbers: Counter[tuple[str, str]] = Counter()
        self._lock = threading.Lock()

    def start_task(self, task_id: str, env: TaskEnvironment) -> None:
        """Install the task's fresh environment; attempt numbers restart at 1."""
        with self._lock:
            self.task_id = task_id
            self.env = env
            self.attempts = []
            self._numbers.clear()
            self._served.clear()

    def draw(
        self, function: Function[Any, Any], args: Mapping[str, Any]
    ) -> tuple[str, int, str | None]:
        """(canonical key, attempt number, fault) of a new attempt of this call."""
        key = canonical_key(function, args)
        with self._lock:
            self._numbers[function.name, key] += 1
            number = self._numbers[function.name, key]
        fault = self.mix.draw(
            seed=self.seed,
            suite=self.suite.name,
            task=self.task_id,
            function=function.name,
            key=key,
            attempt=number,
        )
        return key, number, fault

    def call(
        self, function: Function[Any, Any], args: dict[str, Any], idempotency_key: str | None
    ) -> str:
        """One attempt over the HTTP-like transport: draw its fault, raise it as the
        real client error, before or after running the function as the kind says. A
        keyed service answers a key it has run from its record (see the module)."""
        key, number, fault = self.draw(function, args)
        if fault in BEFORE_EXECUTION:
            self.unrun(function.name, key, number, fault)
            raise make_error(fault, suite=self.suite.name, function=function.name)
        served = self._served.get(idempotency_key) if idempotency_key else None
        if served is not None:
            self._log(Attempt(function.name, key, number, fault, False, fault is None))
            result = served
        else:
            result = self.execute(function, args, key, number, fault)
            if self.keyed and idempotency_key:
                self._served[idempotency_key] = result
        if fault is not None:  # commit_timeout: the effect is in the environment
            raise make_error(fault, suite=self.suite.name, function=function.name)
        return result

    def unrun(self, function: str, key: str, number: int, fault: str) -> None:
        """Log an attempt that failed before reaching the function."""
        self._log(Attempt(function, key, number, fault, ran=False, delivered=False))

    def execute(
        self,
        function: Function[Any, Any],
        args: dict[str, Any],
        key: str,
        number: int,
        fault: str | None,
    ) -> str:
        """Run the function on the task's environment and log it (`fault`: the answer
        will be lost on the way back); its own error is raised as is."""
        with self._lock:
            env = self.env
        watch = env is not None and function.name in self.suite.side_effects
        before = env.model_dump() if watch and env is not None else None
        try:
            result, _ = self.runtime.run_function(env, function.name, args, raise_on_error=True)
        except Exception as exc:
            self._log(
                Attempt(function.name, key, number, fault, False, False, f"{type(exc).__name__}")
            )
            raise
        changed = before is not None and env is not None and env.model_dump() != before
        delivered = fault is None
        self._log(Attempt(function.name, key, number, fault, True, delivered, changed=changed))
        return tool_result_to_str(result)

    def _log(self, attempt: Attempt) -> None:
        with self._lock:
            self.attempts.append(attempt)


def make_tools(sandbox: Sandbox) -> list[BaseTool]:
    """One ``StructuredTool`` per function of the suite, bound to `sandbox`; a write sends
    the idempotency key the package gives it, if any (an ``Idempotency-Key`` header)."""
    writes = sandbox.suite.side_effects

    def wrap(function: Function[Any, Any]) -> BaseTool:
        def run(**kwargs: Any) -> str:
            key = current_idempotency_key() if function.name in writes else None
            return sandbox.call(function, kwargs, key)

        return StructuredTool(
            name=function.name,
            description=function.description,
            args_schema=function.parameters,
            func=run,
        )

    return [wrap(f) for f in sandbox.suite.functions.values()]
