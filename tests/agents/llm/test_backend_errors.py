"""Model backends say what went wrong: a refused connection is not a timeout, and a base URL with credentials
in it fails before any call, without repeating the credentials."""

from __future__ import annotations

import socket

import openai
import pytest
from nego.agents.llm.backends._common import classify_sdk_error
from nego.agents.llm.backends.anthropic_backend import AnthropicBackend
from nego.agents.llm.backends.base import BackendError, ChatMessage, ChatRequest
from nego.agents.llm.backends.limits import RetryPolicy
from nego.agents.llm.backends.openai_backend import OpenAIBackend
from nego.agents.llm.backends.openai_lean import LeanOpenAIBackend, classify_wire_error
from nego.agents.llm.backends.urls import check_base_url
from nego.agents.model_specs import LLMSettings, ModelSpecError, resolve_model_spec
from nego.market.types import Action

from ...fakes.llm_server import serve

PASSWORD = "pa55-CANARY-word"
FAST = RetryPolicy(max_attempts=2, base_delay_s=0.001, max_delay_s=0.01, timeout_s=5.0)
REQUEST = ChatRequest((ChatMessage("user", "Round 1 of 6."),), max_tokens=16)
BACKENDS = {"openai": OpenAIBackend, "openai-lean": LeanOpenAIBackend, "anthropic": AnthropicBackend}


def closed_port() -> int:
    """A loopback port that nothing listens on (bound, read, released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("kind", sorted(BACKENDS))
async def test_a_refused_connection_is_reported_as_refused_not_as_a_timeout(kind):
    port = closed_port()
    suffix = "/v1" if kind.startswith("openai") else ""
    backend = BACKENDS[kind]("m", base_url=f"http://127.0.0.1:{port}{suffix}", api_key="sk-test-key", policy=FAST)
    with pytest.raises(BackendError) as err:
        await backend.complete(REQUEST)
    await backend.aclose()
    message = str(err.value)
    assert f"connection refused to 127.0.0.1:{port}" in message and "gave up after 2 tries" in message
    assert "timed out" not in message


@pytest.mark.parametrize("kind", sorted(BACKENDS))
async def test_credentials_in_a_base_url_fail_at_construction_without_a_call(kind):
    async with serve(lambda messages: Action.accept()) as srv:
        url = srv.host.replace("http://", f"http://user:{PASSWORD}@") + ("/v1" if kind.startswith("openai") else "")
        with pytest.raises(ValueError, match="carries a user name or password") as err:
            BACKENDS[kind]("m", base_url=url, api_key="sk-test-key", policy=FAST)
        assert PASSWORD not in str(err.value) and "user:" not in str(err.value)
        assert srv.requests == []


@pytest.mark.parametrize(
    ("spec", "settings", "env"),
    [
        ("openai:gpt", LLMSettings(base_url=f"https://me:{PASSWORD}@llm.example/v1"), {}),
        ("anthropic:claude", LLMSettings(), {"ANTHROPIC_BASE_URL": f"https://me:{PASSWORD}@llm.example"}),
        (f"vllm:served/model@http://me:{PASSWORD}@10.0.0.2:8000", LLMSettings(), {}),
        ("4.5b", LLMSettings(vllm_url=f"http://me:{PASSWORD}@10.0.0.2:8000"), {}),
    ],
)
def test_a_spec_whose_server_url_has_credentials_is_refused_when_resolved(monkeypatch, spec, settings, env):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-key")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ModelSpecError, match="carries a user name or password") as err:
        resolve_model_spec(spec, settings)
    assert PASSWORD not in str(err.value) and "me:" not in str(err.value)


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("ftp://host/v1", "must look like http://host:port/v1"),
        ("http:///v1", "must look like http://host:port/v1"),
        ("http://host:99999/v1", "port that is not a number"),
        ("http://host:80x/v1", "port that is not a number"),
        (f"https://me:{PASSWORD}@host/v1", "carries a user name or password"),
        (f"me:{PASSWORD}@host", "must look like http://host:port/v1, got \"a URL with '@' in it\""),
    ],
)
def test_base_urls_are_checked_up_front(url, words):
    with pytest.raises(ValueError, match=words) as err:
        check_base_url(url)
    assert PASSWORD not in str(err.value)
    assert check_base_url(" http://127.0.0.1:8000/v1 ") == "http://127.0.0.1:8000/v1" and check_base_url(None) is None


def test_an_unreadable_body_is_retried_with_an_honest_reason():
    deep = RecursionError("maximum recursion depth exceeded")
    for failure in (classify_sdk_error(deep, openai, openai.OpenAIError), classify_wire_error(deep, "http://h/v1")):
        assert failure.retryable and failure.message == "unreadable reply: its JSON is nested too deeply to decode"
    assert classify_wire_error(KeyError("a bug in our code"), "http://h/v1") is None
