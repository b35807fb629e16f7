"""langchain-tests' standard unit suite for the two chat models this package ships:
`ScriptedChatModel` (the double users test with) and `resilient_model` (what an
agent's model becomes), so both behave as any integration package's model does."""

from __future__ import annotations

from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_tests.unit_tests import ChatModelUnitTests

from langgraph_resilience import resilient_model
from langgraph_resilience._graph.model import ResilientChatModel
from langgraph_resilience.testing import ScriptedChatModel, text


class TestScriptedChatModelStandard(ChatModelUnitTests):
    @property
    def chat_model_class(self) -> type[BaseChatModel]:
        return ScriptedChatModel

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return {"responses": [text("hello")] * 8, "model": "scripted-1"}


class ChatResilientScripted(ResilientChatModel):
    """`resilient_model(ScriptedChatModel(**params))`, constructible from the standard
    parameters as the suite constructs every model (they go to the primary)."""

    def __init__(self, **params: Any) -> None:
        params.pop("max_retries", None)  # ours replace the client's (resilient_model warns)
        built = resilient_model(ScriptedChatModel(**params))
        super().__init__(**{name: getattr(built, name) for name in ResilientChatModel.model_fields})


class TestResilientModelStandard(ChatModelUnitTests):
    @property
    def chat_model_class(self) -> type[BaseChatModel]:
        return ChatResilientScripted

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return {"responses": [text("hello")] * 8, "model": "scripted-1"}
