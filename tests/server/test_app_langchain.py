"""LangChain's own standard chat-model suite (``langchain-tests``,
``ChatModelIntegrationTests``), unchanged, against a real ``continuum serve`` (in-process,
127.0.0.1, the default model Qwen2.5-Coder-0.5B-Instruct, no mocks) through
``langchain_openai.ChatOpenAI``: once on /v1/chat/completions and once with
``use_responses_api=True`` on /v1/responses.

The two classes set only the model, its parameters and the capabilities the server has: tools
with every ``tool_choice``, ``response_format`` json_schema / json_object (structured output and
JSON mode), usage on streams; no image, audio or PDF content (the server refuses those parts
with a 400), no Anthropic-style blocks, no VCR cassettes. No standard test is changed or
skipped here. One failure is allowed, for a cause in the model that the reply itself shows:
``test_structured_output_optional_param``'s greedy JSON joke can loop ("A cat is like a
superhero, but it's not as strong as a superhero. It's like...") until the suite's 100 tokens.
Whether it does depends on the CPU's arithmetic, not on the server: on AVX2 machines the three
calls ended; on AVX-512 ones (another summation order in llama.cpp's kernels, so other greedy
tokens) they loop. The test runs unchanged; a ``finish_reason: length`` whose text repeats one
passage three times or more is reported as an expected failure naming the loop, and any other
failure fails. llama-server ``--jinja`` on the same file fails the same test on another of its
calls (docs/agents.md has both columns).

``CONTINUUM_LC_PEER_URL`` (e.g. ``http://127.0.0.1:8080``, a llama-server ``--jinja`` on the
same GGUF) runs the same two classes against that server instead, for comparison; the model
name is then the first one its ``/v1/models`` lists.

The suite's async tests carry no marker (LangChain runs it in pytest-asyncio's auto mode), so
the module marks every test ``asyncio`` on one loop for the module (ChatOpenAI caches one
``httpx.AsyncClient`` per base URL); the sync tests' warning about that mark is silenced.
Nothing may leave the machine: every connection or name lookup outside loopback is refused and
recorded while this module runs, and fails the test that made it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest
from langchain_core.language_models import BaseChatModel
from langchain_openai import ChatOpenAI
from langchain_tests.integration_tests import ChatModelIntegrationTests

from tests.server.frameworks import MODEL
from tests.server.test_app import _serve

PEER = os.environ.get("CONTINUUM_LC_PEER_URL")

pytestmark = [
    pytest.mark.slow,  # end to end: CI runs it, the default loop does not (pyproject.toml)
    pytest.mark.usefixtures("stays_offline"),  # tests/server/conftest.py
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.filterwarnings(
        "ignore:The test <Function .*is marked with '@pytest.mark.asyncio' but it is not an "
        "async function"
    ),
]


@dataclass(frozen=True)
class Target:
    base_url: str  # ends in /v1
    model: str


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory, blocked: list[str]) -> Iterator[Target]:
    if PEER:
        models = httpx.get(PEER.rstrip("/") + "/v1/models", timeout=30).json()["data"]
        yield Target(PEER.rstrip("/") + "/v1", models[0]["id"])
        return
    for srv in _serve(tmp_path_factory.mktemp("lcstandard"), model=MODEL, n_ctx=8192):
        yield Target(srv.url + "/v1", srv.state.model_id)


class ModelLoop(Exception):
    """A reply that ran to max_tokens repeating itself: the model's doing."""


class _Capabilities(ChatModelIntegrationTests):
    """What the server implements, the same on both APIs."""

    _target: Target

    @pytest.fixture(autouse=True)
    def _on(self, target: Target) -> None:
        # autouse: set before the suite's ``model`` fixture reads ``chat_model_params``
        self._target = target

    @property
    def chat_model_class(self) -> type[BaseChatModel]:
        return ChatOpenAI

    def _params(self, **kw: Any) -> dict[str, Any]:
        return {
            "base_url": self._target.base_url,
            "api_key": "none",
            "model": self._target.model,
            "temperature": 0,
            "max_tokens": 100,
            "stream_usage": True,
            **kw,
        }

    @property
    def has_tool_calling(self) -> bool:
        return True

    @property
    def has_tool_choice(self) -> bool:
        return True  # none, auto, required and a named function (grammar-enforced)

    @property
    def has_structured_output(self) -> bool:
        return True  # ChatOpenAI's default method: response_format json_schema

    @property
    def supports_json_mode(self) -> bool:
        return True  # response_format json_object

    @property
    def returns_usage_metadata(self) -> bool:
        return True  # usage on every response, and on streams with include_usage

    @property
    def supports_image_inputs(self) -> bool:
        return False  # image parts are refused with a 400

    @property
    def supports_image_urls(self) -> bool:
        return False

    @property
    def supports_image_tool_message(self) -> bool:
        return False

    @property
    def supports_pdf_inputs(self) -> bool:
        return False  # file parts are refused with a 400

    @property
    def supports_pdf_tool_message(self) -> bool:
        return False

    @property
    def supports_audio_inputs(self) -> bool:
        return False  # input_audio parts are refused with a 400

    @property
    def supports_video_inputs(self) -> bool:
        return False

    @property
    def supports_anthropic_inputs(self) -> bool:
        return False  # ChatOpenAI passes Anthropic ``tool_result`` blocks through as they are

    @property
    def enable_vcr_tests(self) -> bool:
        return False  # the suite's timing test replays recorded cassettes

    @pytest.mark.xfail(
        reason="the model's greedy JSON joke can loop to max_tokens, depending on the CPU's "
        "arithmetic (module docstring); only that loop, shown by the reply, is expected",
        raises=ModelLoop,
        strict=False,
    )
    def test_structured_output_optional_param(self, model: BaseChatModel) -> None:
        """The standard test, run as it is; its one failure with a cause in the model (see the
        module docstring) is the expected failure when the reply shows the loop (LangChain's
        own check allows an override only as an xfail with a reason; ``raises`` keeps every
        other failure a failure)."""
        try:
            super().test_structured_output_optional_param(model)
        except openai.LengthFinishReasonError as e:
            text = e.completion.choices[0].message.content or ""
            passage = repeated_passage(text)
            assert passage is not None, f"ran to the length limit without a loop: {text!r}"
            raise ModelLoop(f"the model loops until max_tokens on {passage!r}") from e


def repeated_passage(text: str, size: int = 24, times: int = 3) -> str | None:
    """A passage of ``size`` characters that ``text`` holds ``times`` times or more (a
    degenerate loop), or None."""
    for start in range(max(0, len(text) - size)):
        passage = text[start : start + size]
        if text.count(passage) >= times:
            return passage
    return None


class TestChatCompletions(_Capabilities):
    @property
    def chat_model_params(self) -> dict[str, Any]:
        return self._params()


class TestResponses(_Capabilities):
    @property
    def chat_model_params(self) -> dict[str, Any]:
        return self._params(use_responses_api=True)
