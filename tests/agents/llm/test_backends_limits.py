"""Retry policy, token buckets, prices and secret handling, without any network."""

from __future__ import annotations

import asyncio
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st
from nego.agents.llm.backends import limits
from nego.agents.llm.backends.base import BackendError
from nego.agents.llm.backends.limits import (
    Failure,
    Limiter,
    PriceTable,
    RateLimits,
    RetryPolicy,
    Secret,
    TokenBucket,
    call_with_retries,
    parse_retry_after,
    redact,
)


@given(st.integers(1, 30), st.integers(0, 2**32))
def test_backoff_grows_then_caps_with_jitter(attempt, seed):
    policy = RetryPolicy(base_delay_s=0.5, max_delay_s=20.0)
    delay = policy.backoff(attempt, random.Random(seed))
    nominal = min(20.0, 0.5 * 2 ** (attempt - 1))
    assert nominal / 2 <= delay <= nominal


class FakeClock:
    """Time that moves only when the code under test sleeps."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


async def test_token_bucket_spends_then_waits_for_refill(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(limits.asyncio, "sleep", clock.sleep)
    bucket = TokenBucket(per_minute=60, clock=clock)  # one unit per second, 60 in the bucket
    await bucket.take(60)
    assert clock.sleeps == []
    await bucket.take(3)
    assert clock.now == pytest.approx(3.0)
    await bucket.take(500)  # larger than the bucket: waits for a full bucket, then goes through
    assert clock.now == pytest.approx(63.0)


async def test_limiter_caps_concurrency():
    limiter = Limiter(RateLimits(concurrency=2))
    in_flight, peak = 0, 0

    async def call():
        nonlocal in_flight, peak
        await limiter.acquire(10)
        try:
            in_flight += 1
            peak = max(peak, in_flight)
            await asyncio.sleep(0)
            in_flight -= 1
        finally:
            limiter.release()

    await asyncio.gather(*(call() for _ in range(10)))
    assert peak == 2


async def test_call_with_retries_redacts_and_leaves_foreign_errors_alone():
    async def leaky():
        raise ConnectionError("server said: bad key sk-SECRET-123")

    def classify(e):
        return Failure(False, str(e)) if isinstance(e, ConnectionError) else None

    with pytest.raises(BackendError) as err:
        await call_with_retries(leaky, policy=RetryPolicy(), classify=classify, what="x", secrets=["sk-SECRET-123"])
    assert "sk-SECRET" not in str(err.value) and "bad key ***" in str(err.value)

    async def bug():
        raise KeyError("a bug in our code")

    with pytest.raises(KeyError):
        await call_with_retries(bug, policy=RetryPolicy(), classify=classify, what="x")


def test_prices_secrets_and_headers(tmp_path):
    path = tmp_path / "prices.toml"
    path.write_text('["gpt-x"]\ninput = 1.5\noutput = 6\n')
    table = PriceTable.load(path)
    assert table.cost("gpt-x", 1_000_000, 500_000) == pytest.approx(4.5)
    assert table.cost("unknown", 10, 10) == 0.0
    path.write_text('["gpt-x"]\ninput = "cheap"\n')
    with pytest.raises(ValueError, match="model 'gpt-x': give 'input' and 'output'"):
        PriceTable.load(path)
    s = Secret("sk-abc-123")
    assert "sk-abc" not in repr(s) and "sk-abc" not in f"{s}" and s.reveal() == "sk-abc-123"
    assert redact("a sk-abc-123 b", [None, "sk-abc-123"]) == "a *** b"
    assert parse_retry_after("2.5") == 2.5 and parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") is None
    with pytest.raises(ValueError):
        RetryPolicy(max_attempts=0)


def test_per_loop_resources_are_rebuilt_on_a_new_event_loop():
    from nego.agents.llm.backends.limits import PerLoop

    built = []
    per_loop = PerLoop(lambda: built.append(object()) or built[-1])

    async def use_twice():
        return per_loop.get(), per_loop.get()

    first = asyncio.run(use_twice())
    second = asyncio.run(use_twice())
    assert first[0] is first[1] and second[0] is second[1] and first[0] is not second[0] and len(built) == 2
