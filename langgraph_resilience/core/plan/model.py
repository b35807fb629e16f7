"""The `Plan` a planner model answers with: a small DAG of `PlanStep`\\s and a `Diagnosis`.

The docstrings and field descriptions below are sent to the planner model as the
schema of its answer (``with_structured_output(Plan)``), so they address it.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from langgraph_resilience.errors import FailureClass, ResilienceError

__all__ = ["DEFAULT_MAX_STEPS", "Diagnosis", "Plan", "PlanError", "PlanStep"]

DEFAULT_MAX_STEPS = 8
"""Steps a plan may have by default: replanning finds a path, not a program."""


class PlanStep(BaseModel):
    """One tool call of the plan."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(description="Unique step id: letters, digits, '_' or '-' (e.g. 'geo').")
    tool: str = Field(description="Name of one of the available tools.")
    args: dict[str, Any] = Field(
        default_factory=dict,
        description="The tool's arguments as a JSON object. A value that is exactly "
        "'$steps.<id>.output' or '$steps.<id>.output.<key>.<index>' is replaced by that "
        "step's output (or part of it); '{$steps.<id>.output.<key>}' inside a longer "
        "string is replaced by its text.",
    )
    depends_on: list[str] = Field(
        default_factory=list,
        description="Ids of the steps that must succeed before this one; must include "
        "every step whose output the args reference.",
    )
    fallback: str | None = Field(
        default=None,
        description="Id of another step that runs only if this one fails; its output "
        "then stands in for this step's output.",
    )


class Diagnosis(BaseModel):
    """Why the old path failed: the failed tool, its failure class and the evidence."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    failed_tool: str = Field(description="Name of the tool that failed.")
    failure_class: FailureClass = Field(
        description="The failure class reported in that tool's error."
    )
    cause: str = Field(
        description="The concrete cause, from the error: status, message, missing "
        "field, removed endpoint. Not 'something went wrong'."
    )

    @field_validator("failure_class", mode="before")
    @classmethod
    def _lowercase_class(cls, value: Any) -> Any:
        # Models often answer "STRUCTURAL"; the enum values are lowercase.
        return value.strip().lower() if isinstance(value, str) else value


class Plan(BaseModel):
    """A new path to the user's goal that avoids the failure: a small DAG of tool calls."""

    # Diagnosis and rationale come before the steps so a model writing the fields
    # in order reasons about the failure before choosing the calls.
    model_config = ConfigDict(frozen=True, extra="forbid")

    diagnosis: Diagnosis
    rationale: str = Field(
        description="Why the new steps avoid the failure, naming the tools they use."
    )
    steps: list[PlanStep] = Field(description="The tool calls, each with a unique id.")


class PlanError(ResilienceError):
    """A plan cannot be scheduled or executed as written (verify it first)."""
