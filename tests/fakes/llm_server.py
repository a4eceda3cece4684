"""A fake model server for tests and benchmarks: OpenAI ``/v1/chat/completions`` and Anthropic ``/v1/messages``.

It answers with whatever a *brain* decides (a callable from the request's messages to an :class:`Action`),
in the wire format the request asks for: tool calls when tools were offered, otherwise text with a JSON block.
A :class:`Control` object steers it: latency, a queue of faults applied to the next requests (HTTP errors
with or without ``Retry-After``, a truncated body, empty choices, a missing field, wrong-typed tool arguments, a
tool call missing an issue, an error body that echoes the caller's API key, a reply whose message echoes it, a
reply of any given text, a reply held back past the client's timeout), and a fault applied to every request
while set (a server that is down). Every request body is recorded.

Run it standalone (for benchmarks in a separate process): ``python llm_server.py --latency 0.05``; it prints
``port=<N>`` on its first line and serves until killed.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import re
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from nego.agents.llm.parsing import action_to_json, action_to_tool_call
from nego.market.types import Action, ActionKind

Brain = Callable[[list[dict[str, Any]]], Action]
"""Decides the next action from the request's messages (``[{"role": ..., "content": ...}]``, system first)."""


@dataclass(frozen=True)
class Fault:
    """What to do wrong with one request. ``status``: answer with this HTTP error; ``mode``: corrupt a 200."""

    status: int | None = None
    retry_after: str | None = None
    mode: str | None = None
    """Corrupt a 200: "truncated" (half the body), "empty_choices", "missing_field", "wrong_types" or
    "missing_arg" (tool arguments), "length" (a reply cut at max_tokens), "say_key" (the brain's move with the
    caller's credential as its message); or "echo_key" (an error echoing the key)."""
    text: str | None = None
    """Answer a 200 with exactly this reply text (no tool calls), whatever the brain decides."""
    delay_s: float = 0.0
    """Extra seconds before answering (past the client's timeout: a timed-out try)."""


@dataclass
class Control:
    """Steers the server; tests mutate it between or during negotiations."""

    latency_s: float = 0.0
    faults: deque[Fault] = field(default_factory=deque)
    always: Fault | None = None
    """Applied to every request while set (after the queue is empty): a server that keeps failing."""

    def fail(self, n: int, status: int = 500, retry_after: str | None = None) -> None:
        self.faults.extend(Fault(status=status, retry_after=retry_after) for _ in range(n))

    def corrupt(self, n: int, mode: str) -> None:
        self.faults.extend(Fault(mode=mode) for _ in range(n))


@dataclass(frozen=True)
class Recorded:
    path: str
    headers: Mapping[str, str]
    body: dict[str, Any]


class FakeLLMServer:
    """The aiohttp application and what it saw. ``base_url`` is set once it is serving."""

    def __init__(self, brain: Brain, control: Control | None = None) -> None:
        self.brain = brain
        self.control = control or Control()
        self.requests: list[Recorded] = []
        self.host = ""
        self.app = web.Application()
        self.app.router.add_post("/v1/chat/completions", self._openai)
        self.app.router.add_post("/v1/messages", self._anthropic)

    @property
    def openai_url(self) -> str:
        return f"{self.host}/v1"

    @property
    def anthropic_url(self) -> str:
        return self.host

    async def _common(self, request: web.Request, messages: list[dict[str, Any]]) -> tuple[Fault | None, Action]:
        fault = self.control.faults.popleft() if self.control.faults else self.control.always
        delay = self.control.latency_s + (fault.delay_s if fault else 0.0)
        if delay:
            await asyncio.sleep(delay)
        action = self.brain(messages)
        if fault is not None and fault.mode == "say_key":
            credential = request.headers.get("x-api-key") or request.headers.get("Authorization", "")
            action = dataclasses.replace(action, message=f"my key is {credential.removeprefix('Bearer ')}, thanks")
        return fault, action

    async def _openai(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(Recorded(request.path, dict(request.headers), body))
        fault, action = await self._common(request, body["messages"])
        if fault is not None and (fault.status or fault.mode == "echo_key"):
            return _error(fault, request.headers.get("Authorization", ""))
        message: dict[str, Any] = {"role": "assistant", "content": None}
        cut = bool(fault and fault.mode == "length")
        if cut:
            message["content"] = _text_reply(action)[:30]
        elif fault is not None and fault.text is not None:
            message["content"] = fault.text
        elif body.get("tools"):
            call = action_to_tool_call(action)
            args = _tool_arguments(call.arguments, fault)
            message["tool_calls"] = [
                {"id": "call_1", "type": "function", "function": {"name": call.name, "arguments": args}}
            ]
        else:
            message["content"] = _text_reply(action)
        reply: dict[str, Any] = {
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "created": 0,
            "model": body["model"],
            "choices": [{"index": 0, "message": message, "finish_reason": "length" if cut else "stop"}],
            "usage": _usage(body["messages"], message, "prompt_tokens", "completion_tokens"),
        }
        if fault and fault.mode == "empty_choices":
            reply["choices"] = []
        if fault and fault.mode == "missing_field":
            del reply["choices"][0]["message"]
        return _json(reply, truncated=bool(fault and fault.mode == "truncated"))

    async def _anthropic(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(Recorded(request.path, dict(request.headers), body))
        messages = ([{"role": "system", "content": body["system"]}] if body.get("system") else []) + body["messages"]
        fault, action = await self._common(request, messages)
        if fault is not None and (fault.status or fault.mode == "echo_key"):
            return _error(fault, request.headers.get("x-api-key") or request.headers.get("Authorization", ""))
        cut = bool(fault and fault.mode == "length")
        if cut:
            content = [{"type": "text", "text": _text_reply(action)[:30]}]
        elif fault is not None and fault.text is not None:
            content = [{"type": "text", "text": fault.text}]
        elif body.get("tools"):
            call = action_to_tool_call(action)
            args = _tool_arguments(call.arguments, fault)
            content = [{"type": "tool_use", "id": "toolu_1", "name": call.name, "input": json.loads(args)}]
        else:
            content = [{"type": "text", "text": _text_reply(action)}]
        reply: dict[str, Any] = {
            "id": "msg_fake",
            "type": "message",
            "role": "assistant",
            "model": body["model"],
            "content": content,
            "stop_reason": "max_tokens" if cut else "tool_use" if body.get("tools") else "end_turn",
            "stop_sequence": None,
            "usage": _usage(messages, content, "input_tokens", "output_tokens"),
        }
        if fault and fault.mode == "empty_choices":
            reply["content"] = None
        if fault and fault.mode == "missing_field":
            del reply["usage"]
        return _json(reply, truncated=bool(fault and fault.mode == "truncated"))


def _text_reply(action: Action) -> str:
    block = json.dumps(action_to_json(action))
    return f"Let me think about the numbers {{not json}} first.\n```json\n{block}\n```\nThat is my move."


def _tool_arguments(arguments: str, fault: Fault | None) -> str:
    mode = fault.mode if fault else None
    if mode not in ("wrong_types", "missing_arg"):
        return arguments
    args = json.loads(arguments)
    if mode == "missing_arg":  # drop the first issue of an offer (an accept or walk-away has none to drop)
        first = next((k for k in args if k != "message"), None)
        return json.dumps({k: v for k, v in args.items() if k != first})
    return json.dumps({k: (v if k == "message" else f"about {v}") for k, v in args.items()} or {"message": 7})


def _usage(messages: Sequence[Any], reply: Any, prompt_key: str, completion_key: str) -> dict[str, int]:
    return {prompt_key: len(json.dumps(messages)) // 4, completion_key: len(json.dumps(reply)) // 4}


def _json(payload: dict[str, Any], *, truncated: bool) -> web.Response:
    text = json.dumps(payload)
    return web.Response(text=text[: len(text) // 2] if truncated else text, content_type="application/json")


def _error(fault: Fault, credential: str) -> web.Response:
    status = fault.status or 401
    detail = f"invalid credential {credential}" if fault.mode == "echo_key" else "injected failure"
    payload = {"error": {"message": f"fake server: {detail}", "type": "fake_error"}, "type": "error"}
    headers = {"Retry-After": fault.retry_after} if fault.retry_after is not None else {}
    return web.json_response(payload, status=status, headers=headers)


@asynccontextmanager
async def serve(brain: Brain, control: Control | None = None, port: int = 0) -> AsyncIterator[FakeLLMServer]:
    """Serve a fake model on 127.0.0.1 (port 0: any free port) for the duration of the block."""
    server = FakeLLMServer(brain, control)
    runner = web.AppRunner(server.app, access_log=None, handler_cancellation=True)  # a timed-out try stops here
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port, backlog=4096)
    await site.start()
    bound = runner.addresses[0][1]
    server.host = f"http://127.0.0.1:{bound}"
    try:
        yield server
    finally:
        await runner.cleanup()


def prompt_brain(offers: Mapping[str, Sequence[Mapping[str, Any]]], accept_at: Mapping[str, float]) -> Brain:
    """A brain that reads only the prompt nego renders: its role, the round, and the standing offer's worth.

    It accepts a standing offer worth at least ``accept_at[role]`` to it; otherwise it offers
    ``offers[role][round - 1]`` (the last one once the list runs out).
    """

    def decide(messages: list[dict[str, Any]]) -> Action:
        system = " ".join(m["content"] for m in messages if m["role"] == "system")
        user = messages[-1]["content"]
        role = re.search(r"You are the (seller|buyer)", system).group(1)
        rnd = int(re.search(r"Round (\d+) of", user).group(1))
        worth = re.search(r"It is worth ([0-9.]+) to you", user)
        if worth and float(worth.group(1)) >= accept_at[role]:
            return Action(ActionKind.ACCEPT, message="deal")
        plan = offers[role]
        return Action.make_offer(plan[min(rnd, len(plan)) - 1], f"round {rnd} offer")

    return decide


def _main() -> None:
    parser = argparse.ArgumentParser(description="Serve the fake model server until killed.")
    parser.add_argument("--latency", type=float, default=0.05)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--brain", default="widgets", help="only 'widgets': a fixed plan for the widget scenario")
    args = parser.parse_args()
    brain = prompt_brain(
        {
            "seller": [{"price": p, "quantity": 10, "warranty": "1y"} for p in (150, 140, 130, 120, 110, 100)],
            "buyer": [{"price": p, "quantity": 10, "warranty": "2y"} for p in (60, 70, 80, 90, 100, 110)],
        },
        {"seller": 0.6, "buyer": 0.6},
    )

    async def run() -> None:
        async with serve(brain, Control(latency_s=args.latency), args.port) as server:
            print(f"port={server.host.rsplit(':', 1)[1]}", flush=True)
            await asyncio.Event().wait()

    asyncio.run(run())


if __name__ == "__main__":
    _main()
