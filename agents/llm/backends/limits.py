"""Rate limits, retries and prices for remote model backends.

Provider SDKs retry on their own with backoffs we do not control (one of them sleeps for whatever
``Retry-After`` says); backends therefore set the SDK's ``max_retries=0`` and call :func:`call_with_retries`,
which adds a per-call timeout, exponential backoff with jitter, a capped ``Retry-After``, a concurrency cap
and request/token budgets per minute. Errors are redacted of secrets before anyone sees them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
import tomllib
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from .base import BackendError

T = TypeVar("T")

log = logging.getLogger("nego.agents.llm.backends")

RETRY_STATUS = frozenset({408, 409, 429}) | frozenset(range(500, 600))
"""HTTP statuses worth another try: timeouts, conflicts, rate limits, server errors."""


class MalformedResponse(Exception):
    """The server answered with a body that is not a usable reply (no choices, missing fields); retried."""


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How hard to try one request: attempts, backoff, the Retry-After cap and the per-call timeout."""

    max_attempts: int = 4
    """Tries in all (1 = no retry)."""
    base_delay_s: float = 0.5
    """Backoff before retry n is ``base * 2**(n-1)``, times a jitter factor in [0.5, 1.0]."""
    max_delay_s: float = 20.0
    max_retry_after_s: float = 60.0
    """A server asking to wait longer than this is not retried: the request fails at once."""
    timeout_s: float = 120.0
    """Wall-clock limit of one try."""

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")
        for name in ("base_delay_s", "max_delay_s", "max_retry_after_s", "timeout_s"):
            if getattr(self, name) < 0 or (name == "timeout_s" and self.timeout_s == 0):
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")

    def backoff(self, attempt: int, rng: random.Random) -> float:
        """Seconds to wait before try ``attempt + 1`` (``attempt`` counts tries made so far, from 1)."""
        return min(self.max_delay_s, self.base_delay_s * 2 ** (attempt - 1)) * rng.uniform(0.5, 1.0)


class TokenBucket:
    """A budget of ``per_minute`` units refilled continuously; ``take(n)`` waits until n units are there.

    A request larger than the whole bucket is let through once the bucket is full, so it cannot wait forever.
    """

    def __init__(self, per_minute: float, clock: Callable[[], float] = time.monotonic) -> None:
        if per_minute <= 0:
            raise ValueError(f"a rate limit must be positive, got {per_minute}/min")
        self.capacity = float(per_minute)
        self.rate = per_minute / 60.0
        self._level = self.capacity
        self._clock = clock
        self._stamp = clock()
        self._lock = asyncio.Lock()

    def _refill(self) -> None:
        now = self._clock()
        self._level = min(self.capacity, self._level + (now - self._stamp) * self.rate)
        self._stamp = now

    async def take(self, n: float = 1.0) -> None:
        async with self._lock:  # first come, first served: a large request is not starved by small ones
            need = min(n, self.capacity)
            self._refill()
            while self._level < need:
                await asyncio.sleep((need - self._level) / self.rate)
                self._refill()
            self._level -= n


@dataclass(frozen=True, slots=True)
class RateLimits:
    """Per-backend caps: requests in flight, requests per minute and tokens per minute (None: unlimited)."""

    concurrency: int = 64
    requests_per_min: float | None = None
    tokens_per_min: float | None = None

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")


class Limiter:
    """Applies :class:`RateLimits` to one backend's calls. Create it inside the event loop that uses it."""

    def __init__(self, limits: RateLimits) -> None:
        self.limits = limits
        self._slots = asyncio.Semaphore(limits.concurrency)
        self._requests = TokenBucket(limits.requests_per_min) if limits.requests_per_min else None
        self._tokens = TokenBucket(limits.tokens_per_min) if limits.tokens_per_min else None

    async def acquire(self, estimated_tokens: int) -> None:
        if self._requests is not None:
            await self._requests.take(1)
        if self._tokens is not None:
            await self._tokens.take(estimated_tokens)
        await self._slots.acquire()

    def release(self) -> None:
        self._slots.release()


@dataclass(frozen=True, slots=True)
class Price:
    """USD per one million input and output tokens."""

    input_per_m: float
    output_per_m: float

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float:
        return (prompt_tokens * self.input_per_m + completion_tokens * self.output_per_m) / 1e6


@dataclass(frozen=True, slots=True)
class PriceTable:
    """Prices by model name. Models not in the table cost 0 (nego ships no prices: they change too often).

    Load one from a TOML or JSON file mapping model names to ``{input = ..., output = ...}`` in USD per 1M
    tokens, e.g. ``["gpt-5-mini"] input = 0.25 output = 2.0``.
    """

    prices: Mapping[str, Price] = field(default_factory=dict)

    def cost(self, model: str, prompt_tokens: int, completion_tokens: int) -> float:
        price = self.prices.get(model)
        return price.cost(prompt_tokens, completion_tokens) if price else 0.0

    @staticmethod
    def load(path: str | Path) -> PriceTable:
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
            data = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
        except (OSError, ValueError) as e:
            raise ValueError(f"price table {path}: cannot read it ({e})") from None
        prices = {}
        for model, entry in data.items():
            try:
                prices[model] = Price(float(entry["input"]), float(entry["output"]))
            except (TypeError, KeyError, ValueError):
                raise ValueError(
                    f"price table {path}, model {model!r}: give 'input' and 'output' in USD per 1M tokens"
                ) from None
        return PriceTable(prices)


@dataclass(frozen=True, slots=True)
class Failure:
    """How a backend judged one failed try: whether to retry, how long the server asked to wait, what happened."""

    retryable: bool
    message: str
    retry_after_s: float | None = None


def redact(text: str, secrets: Iterable[str | None]) -> str:
    """``text`` with every secret (API keys) replaced by ``***``."""
    for secret in secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, "***")
    return text


async def call_with_retries(
    call: Callable[[], Awaitable[T]],
    *,
    policy: RetryPolicy,
    classify: Callable[[BaseException], Failure | None],
    what: str,
    secrets: Iterable[str | None] = (),
    rng: random.Random | None = None,
) -> T:
    """Run ``call`` with a timeout per try and retries as ``classify`` and ``policy`` allow.

    ``classify`` judges an exception (``None``: not a backend failure, re-raise it unchanged). After the last
    try, or on a failure that must not be retried, raises :class:`BackendError` naming ``what`` and the cause,
    with ``secrets`` redacted.
    """
    secrets = tuple(secrets)
    failure = Failure(False, "no attempt made")
    for attempt in range(1, policy.max_attempts + 1):
        try:
            async with asyncio.timeout(policy.timeout_s):  # unlike wait_for on 3.11, no extra task per call
                return await call()
        except TimeoutError:
            failure = Failure(True, f"no reply within {policy.timeout_s:g} s")
        except Exception as e:
            judged = classify(e)
            if judged is None:
                raise
            failure = judged
        message = redact(failure.message, secrets)
        if not failure.retryable:
            raise BackendError(f"{what}: {message}") from None
        if failure.retry_after_s is not None and failure.retry_after_s > policy.max_retry_after_s:
            raise BackendError(
                f"{what}: {message}; the server asked to wait {failure.retry_after_s:g} s, more than the "
                f"{policy.max_retry_after_s:g} s cap"
            ) from None
        if attempt == policy.max_attempts:
            break
        if failure.retry_after_s is None:
            rng = rng or random.Random()  # seeding one from the OS costs more than a call's own work: only on a retry
        delay = failure.retry_after_s if failure.retry_after_s is not None else policy.backoff(attempt, rng)
        log.warning(
            "%s: try %d of %d failed (%s); retrying in %.2f s", what, attempt, policy.max_attempts, message, delay
        )
        await asyncio.sleep(delay)
    raise BackendError(
        f"{what}: gave up after {policy.max_attempts} tries; last error: {redact(failure.message, secrets)}"
    )


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header given in seconds (HTTP dates are ignored: None)."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if seconds >= 0 else None


def estimate_tokens(texts: Iterable[str], max_tokens: int) -> int:
    """A budget estimate for the tokens/minute bucket before the call: ~4 characters a token, plus the reply."""
    return sum(len(t) for t in texts) // 4 + max_tokens


class PerLoop:
    """Builds a resource (an SDK client and its :class:`Limiter`) once per event loop.

    SDK clients and asyncio primitives belong to the loop they were first used on; a backend shared by runs on
    different loops (tests, successive ``asyncio.run`` calls) gets a fresh one on each loop.
    """

    def __init__(self, build: Callable[[], object]) -> None:
        self._build = build
        self._loop: asyncio.AbstractEventLoop | None = None
        self._value: object = None

    def get(self) -> object:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._value, self._loop = self._build(), loop
        return self._value

    def current(self) -> object | None:
        """The resource built for the running loop, if any (for closing it)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return None
        return self._value if loop is self._loop else None

    def forget(self) -> None:
        self._value, self._loop = None, None


class Secret:
    """An API key that never shows itself in a repr, a log line or ``vars()``; ``reveal()`` gives it to the SDK."""

    __slots__ = ("_value",)

    def __init__(self, value: str | None) -> None:
        self._value = value or None

    def reveal(self) -> str | None:
        return self._value

    def __repr__(self) -> str:
        return "Secret(***)" if self._value else "Secret(None)"

    __str__ = __repr__
