"""Helpers shared by the compatibility tests.

Every test is a plain function that runs one async body with `run(...)`; no pytest plugin for
asyncio is needed. Each body opens its own client with `client(url)` (closed on the way out) and
names its queues and groups with `unique(...)`, so nothing left by another test or an earlier run
(dedup ids, cursors) can interfere.
"""

import asyncio
import time
import uuid
from contextlib import asynccontextmanager
from datetime import datetime, timezone

from queen import Queen

# Upper bound for one test body: a broker that never answers must fail the test, not hang the suite.
TEST_DEADLINE_SECONDS = 60.0


def run(coro, timeout=TEST_DEADLINE_SECONDS):
    """Runs one async test body to completion, failing it if it takes longer than `timeout`."""
    return asyncio.run(asyncio.wait_for(coro, timeout))


def unique(label):
    """A fresh queue or group name: `compat-<label>-<12 hex digits>`."""
    return f"compat-{label}-{uuid.uuid4().hex[:12]}"


@asynccontextmanager
async def client(url, **options):
    """A Queen client, with the default configuration but for `options` (keyword arguments of
    `Queen`, e.g. `framed_pop=True`), closed when the block ends."""
    q = Queen(url, **options)
    try:
        yield q
    finally:
        await q.close()


async def until(what, probe, within=60.0):
    """Waits (checking every 0.2 s) until the async `probe()` is true, failing after `within`
    seconds with `what` it waited for."""

    async def wait():
        while not await probe():
            await asyncio.sleep(0.2)

    try:
        await asyncio.wait_for(wait(), within)
    except asyncio.TimeoutError:
        raise AssertionError(f"gave up waiting until {what}") from None


async def pop_retry(builder, attempts=20, delay=0.15):
    """`builder.pop()` until it returns messages (push-to-visibility may lag a few ms); [] if never.

    The builder should be non-waiting (`.wait(False)`).
    """
    for attempt in range(attempts):
        messages = await builder.pop()
        if messages:
            return messages
        if attempt + 1 < attempts:
            await asyncio.sleep(delay)
    return []


async def collect(builder, count, within=5.0, delay=0.1):
    """Pops with `builder` until `count` messages arrived or `within` seconds passed; returns them all.

    May return more than `count` when the last pop overshoots; the caller checks the exact number.
    """
    messages = []
    deadline = time.monotonic() + within
    while len(messages) < count and time.monotonic() < deadline:
        got = await builder.pop()
        if got:
            messages.extend(got)
        else:
            await asyncio.sleep(delay)
    return messages


async def push_one_by_one(q, queue, payloads, partition=None):
    """Pushes each payload with its own request, in order, and checks every item was queued."""
    builder = q.queue(queue)
    if partition is not None:
        builder = builder.partition(partition)
    for payload in payloads:
        result = await builder.push([{"data": payload}])
        assert [r.get("status") for r in result] == ["queued"], result


async def push_all(q, queue, payloads, partition=None):
    """Pushes all payloads in one request, in order, and checks every item was queued."""
    builder = q.queue(queue)
    if partition is not None:
        builder = builder.partition(partition)
    result = await builder.push([{"data": payload} for payload in payloads])
    assert [r.get("status") for r in result] == ["queued"] * len(payloads), result
    return result


def ids(messages):
    """The `id` field of each message's data, in order (the tests push `{"id": i}` payloads)."""
    return [m["data"]["id"] for m in messages]


def iso_now():
    """The current time as an ISO-8601 UTC string with a `Z` suffix (microseconds)."""
    return datetime.now(timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


def parse_iso(text):
    """Parses an ISO-8601 timestamp as the broker writes it (a `Z` suffix allowed)."""
    assert isinstance(text, str) and text, f"not a timestamp: {text!r}"
    return datetime.fromisoformat(text.replace("Z", "+00:00"))
