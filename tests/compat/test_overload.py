"""A consumer of the official client outlives a broker that is full. tests/compat/main.rs runs this
against a broker that parks one long poll at a time: of a consume loop's two workers, one parks
and the other is refused (503 `overloaded`) for as long as the first holds the place. The loop
stops on a pop's error unless its text says "timeout" or "connection" (§4.3); the broker's words
for a bound it reached say "connection", so the refused worker keeps polling, and the messages
pushed meanwhile are all handled."""

import asyncio

from compat_helpers import client, push_all, run, unique, until

DEADLINE_SECONDS = 90.0


async def refusals(q):
    """Long polls the broker refused for want of a place, so far."""
    families = (await q.admin.metrics())["metrics"]
    family = next((f for f in families if f["name"] == "queen_overload_refusals_total"), None)
    samples = family["samples"] if family else []
    return sum(s["value"] for s in samples if s["labels"].get("bound") == "long_polls")


def test_a_consumer_outlives_a_full_broker(queen_url):
    async def body():
        name = unique("overload")
        handled = []

        async def handler(message):
            handled.append(message["data"]["id"])

        async with client(queen_url) as q:
            await q.queue(name).create()
            builder = q.queue(name).concurrency(2).batch(1).wait(True).timeout_millis(2000).each()
            consuming = asyncio.ensure_future(builder.consume(handler))

            # Past the client's own three attempts at a request: the loop itself has seen the 503.
            async def refused_often():
                assert not consuming.done(), f"the consume loop ended while the broker was full: {consuming.exception()!r}"
                return await refusals(q) >= 6

            await until("the second worker is refused past the client's retries", refused_often)
            await push_all(q, name, [{"id": i} for i in range(10)])

            async def all_handled():
                return sorted(handled) == list(range(10))

            await until("every message is handled", all_handled)
            assert not consuming.done(), f"the consume loop ended: {consuming.exception()!r}"
            consuming.cancel()

    run(body(), timeout=DEADLINE_SECONDS)
