"""A chat model that replays AgentDojo's reference calls, reacting to errors like a model.

Why this module exists: no real LLM is available (or wanted: its noise would drown
the framework differences). `ReplayChatModel` is a real langchain-core
``BaseChatModel`` with ``bind_tools``, so every contender drives it exactly as it
would drive a provider's model. Each reply is a pure function of the messages it
is given:

- The current task is the one whose prompt is the last ``HumanMessage`` (prompts
  are unique within a suite); only the messages after it count.
- It walks its own earlier ``AIMessage``s after that prompt, pairing each with the
  ``ToolMessage`` that answered it (the first one after it with the same
  ``tool_call_id``, else the first one after it: per-message ids repeat).
- Two behaviours (`plan`). ``blind``: a call answered with ``status="error"`` (or
  not answered) is re-issued **once** under a new tool-call id, then the model
  moves on to the next reference call, as a real model re-issues a failed call
  before giving up on it. ``checking``: the same for reads, but a failed write
  that has a `checks.Check` is followed by that read, and re-issued (once) only if
  what the read returns does not show the effect, as a careful LLM does.
- One tool call per ``AIMessage``. When every reference call has been issued, it
  answers with the task's ``GROUND_TRUTH_OUTPUT`` (or ``"Done."`` when AgentDojo
  defines none: those tasks grade the environment only), so the utility checks
  that read the model's output can pass. If a call failed on both tries, the
  model could not have learnt what that answer needs, so it says which calls
  failed instead of giving the reference answer.

Two id styles: ``"unique"`` (``call_<uuid4 hex>``, as OpenAI and Anthropic do) and
``"per_message"`` (``call_0`` in every message, as several providers and local
model servers do).
"""

from __future__ import annotations

import copy
import dataclasses
import threading
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import Runnable
from pydantic import ConfigDict, PrivateAttr

from .checks import Check
from .suites import TaskSpec

IdStyle = Literal["unique", "per_message"]
ID_STYLES: tuple[IdStyle, ...] = ("unique", "per_message")
Behaviour = Literal["blind", "checking"]
BEHAVIOURS: tuple[Behaviour, ...] = ("blind", "checking")
FALLBACK_OUTPUT = "Done."


class HarnessError(RuntimeError):
    """The replay model was asked something the harness never sets up."""


def text_of(message: BaseMessage) -> str:
    """A message's text, whether its content is a string or content blocks."""
    content = message.content
    if isinstance(content, str):
        return content
    return "".join(b if isinstance(b, str) else str(b.get("text", "")) for b in content)


def _answer(messages: Sequence[BaseMessage], index: int, call_id: str) -> ToolMessage | None:
    """The ToolMessage answering the call of ``messages[index]``, if any."""
    answers: list[ToolMessage] = []
    for message in messages[index + 1 :]:
        if isinstance(message, AIMessage | HumanMessage):
            break
        if isinstance(message, ToolMessage):
            answers.append(message)
    for message in answers:
        if message.tool_call_id == call_id:
            return message
    return answers[0] if answers else None


@dataclasses.dataclass(frozen=True, slots=True)
class Step:
    """What the model does next: issue reference call `position` (``phase="call"``),
    or the read that checks it (``phase="check"``); `position` past the last
    reference call means answer the user."""

    position: int
    phase: Literal["call", "check"]
    failed: tuple[int, ...]
    """Reference calls given up on (failed on both tries, or not confirmed)."""


def plan(
    messages: Sequence[BaseMessage],
    start: int,
    spec: TaskSpec,
    behaviour: Behaviour = "blind",
    checks: Mapping[str, Check] | None = None,
) -> Step:
    """The next step, from the history after the prompt at ``messages[start]``.

    The model's own earlier tool calls are walked in order, each taken as the step
    this same function prescribed at that point (the model is deterministic), and
    paired with its answer:

    - ``blind``, and every read, and a write with no `Check`: a call answered with
      an error is re-issued once, then given up on.
    - ``checking``, a write with a `Check`: an error answer is followed by the read;
      if its verdict says the effect is there, the call is done; if not, the write
      is re-issued once (and an error answer to that is checked again); if the read
      itself fails, it is read once more, then the call is given up on.
    """
    position, phase, reissued, reads = 0, "call", False, 0
    failed: list[int] = []

    def advance(give_up: bool = False) -> None:
        nonlocal position, phase, reissued, reads
        if give_up:
            failed.append(position)
        position, phase, reissued, reads = position + 1, "call", False, 0

    for index in range(start + 1, len(messages)):
        message = messages[index]
        if not isinstance(message, AIMessage) or not message.tool_calls:
            continue
        if position >= len(spec.calls):
            break
        answer = _answer(messages, index, message.tool_calls[0]["id"] or "")
        ok = answer is not None and answer.status != "error"
        call = spec.calls[position]
        check = (checks or {}).get(call.function) if behaviour == "checking" else None
        if phase == "call":
            if ok:
                advance()
            elif check is not None:
                phase, reads = "check", 0
            elif not reissued:
                reissued = True
            else:
                advance(give_up=True)
            continue
        assert check is not None  # phase "check" is only entered with a check
        verdict = check.verdict(call.args, ok, text_of(answer) if answer is not None else "")
        reads += 1
        if verdict is True:
            advance()
        elif verdict is False and not reissued:
            phase, reissued = "call", True
        elif verdict is None and reads < 2:
            pass  # the read failed: read again
        else:
            advance(give_up=True)
    return Step(position, phase, tuple(failed))  # type: ignore[arg-type]


class ReplayChatModel(BaseChatModel):
    """Issues the current task's next reference call; see the module docstring."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    tasks: Mapping[str, TaskSpec]
    """The suite's tasks, by prompt."""
    id_style: IdStyle = "unique"
    behaviour: Behaviour = "blind"
    """``blind``: re-issue a failed call once; ``checking``: read before re-issuing a
    write (see `plan`)."""
    checks: Mapping[str, Check] = {}
    """The suite's checks, by write function (`checks.CHECKS`)."""
    clock: Any = None
    """A `FakeClock` to advance by `seconds_per_call` on each call (default: none)."""
    seconds_per_call: float = 0.0
    """Virtual time one call takes (``--llm-seconds``; 0: time moves only with backoff)."""

    _calls: int = PrivateAttr(default=0)
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    @property
    def calls(self) -> int:
        """Invocations so far (every ``_generate``)."""
        return self._calls

    @property
    def _llm_type(self) -> str:
        return "agentdojo-replay"

    def bind_tools(
        self, tools: Sequence[Any], *, tool_choice: Any = None, **kwargs: Any
    ) -> Runnable[LanguageModelInput, AIMessage]:
        names = [t["function"]["name"] if isinstance(t, dict) else t.name for t in tools]
        return self.bind(tool_names=names, **kwargs)

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        with self._lock:
            self._calls += 1
        if self.clock is not None and self.seconds_per_call > 0:
            self.clock.advance(self.seconds_per_call)
        return ChatResult(generations=[ChatGeneration(message=self.reply(messages, kwargs))])

    def current_task(self, messages: Sequence[BaseMessage]) -> tuple[int, TaskSpec]:
        """The index of the last HumanMessage that is a task's prompt, and that task."""
        for index in range(len(messages) - 1, -1, -1):
            if isinstance(messages[index], HumanMessage):
                spec = self.tasks.get(text_of(messages[index]))
                if spec is not None:
                    return index, spec
        raise HarnessError("the replay model needs a HumanMessage with a task's prompt")

    def reply(self, messages: Sequence[BaseMessage], kwargs: Mapping[str, Any]) -> AIMessage:
        start, spec = self.current_task(messages)
        step = plan(messages, start, spec, self.behaviour, self.checks)
        if step.position >= len(spec.calls):
            if step.failed:
                names = ", ".join(spec.calls[i].function for i in step.failed)
                return AIMessage(content=f"I could not complete the request: {names} failed.")
            return AIMessage(content=spec.output or FALLBACK_OUTPUT)
        call = spec.calls[step.position]
        name, args = call.function, copy.deepcopy(dict(call.args))
        if step.phase == "check":
            check = self.checks[call.function]
            name, args = check.read, check.args(call.args, spec.calls[: step.position])
        bound = kwargs.get("tool_names")
        if bound is not None and name not in bound:
            raise HarnessError(f"{name} is not among the bound tools")
        call_id = "call_0" if self.id_style == "per_message" else f"call_{uuid.uuid4().hex}"
        return AIMessage(
            content="",
            tool_calls=[
                {
                    "name": name,
                    "args": args,
                    "id": call_id,
                    "type": "tool_call",
                }
            ],
        )
