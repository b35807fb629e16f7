"""langchain-tests' standard integration suite, run twice against a local
OpenAI-compatible server (`fake_openai`, loopback only): bare `ChatOpenAI`, and
`resilient_model(ChatOpenAI(...))`. The wrapper must pass exactly what the client
passes: real streamed chunks, usage counted once, ``with_structured_output``
honouring ``method=``, ``bind_tools`` returning a binding, LangSmith parameters."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from langchain_core.language_models import BaseChatModel
from langchain_openai import ChatOpenAI
from langchain_tests.integration_tests import ChatModelIntegrationTests

from langgraph_resilience import resilient_model
from langgraph_resilience._graph.model import ResilientChatModel
from tests.standard.fake_openai import FakeOpenAI

pytestmark = pytest.mark.filterwarnings(
    # the suite's own pydantic.v1 schema test (test_structured_output_pydantic_2_v1)
    "ignore::DeprecationWarning",
    "ignore:.*pydantic.v1.*:UserWarning",
    # the openai SDK's own parse of a structured reply (seen with the real API too)
    "ignore:Pydantic serializer warnings:UserWarning",
    "ignore:Received a Pydantic BaseModel V1 schema:UserWarning",
)


@pytest.fixture(scope="class", autouse=True)
def fake_openai(request: pytest.FixtureRequest) -> Iterator[FakeOpenAI]:
    """One server per suite, started before its first test and stopped after its last."""
    with FakeOpenAI() as server:
        request.cls.server = server
        yield server


class _Suite(ChatModelIntegrationTests):
    server: FakeOpenAI

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return {
            "model": "gpt-4o-mini",
            "base_url": self.server.base_url,
            "api_key": "test",
            "max_retries": 0,
            "stream_usage": True,
        }

    @property
    def has_tool_choice(self) -> bool:
        return True

    @property
    def supports_json_mode(self) -> bool:
        return True


class TestBareChatOpenAI(_Suite):
    @property
    def chat_model_class(self) -> type[BaseChatModel]:
        return ChatOpenAI


class ChatResilientOpenAI(ResilientChatModel):
    """`resilient_model(ChatOpenAI(**params))`, built from the suite's parameters."""

    def __init__(self, **params: Any) -> None:
        built = resilient_model(ChatOpenAI(**{**params, "max_retries": 0}))
        super().__init__(**{name: getattr(built, name) for name in ResilientChatModel.model_fields})


class TestResilientChatOpenAI(_Suite):
    @property
    def chat_model_class(self) -> type[BaseChatModel]:
        return ChatResilientOpenAI
