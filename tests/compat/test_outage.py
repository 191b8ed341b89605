"""A consumer of the official client outlives a database outage. Its consume loop stops on a pop's
error unless the error's text says "timeout" or "connection" (§4.3): the broker's words for a
database it cannot reach say "connection", so the loop keeps polling until the database is back.
tests/compat/main.rs runs this against a broker of its own and cuts the database off (new
connections refused, the broker's own terminated) once the consumer has acknowledged its first
message, for longer than the client's own retries last, then lets it back."""

import asyncio

from compat_helpers import client, push_all, run, until

# The names the harness watches.
QUEUE = "compat-outage"
GROUP = "outlives-the-outage"

DEADLINE_SECONDS = 90.0


def test_a_consumer_outlives_a_database_outage(queen_url):
    async def body():
        handled = []

        async def handler(message):
            handled.append(message["data"]["id"])

        async with client(queen_url) as q:
            builder = q.queue(QUEUE).group(GROUP).batch(1).wait(True).timeout_millis(2000).each()
            consuming = asyncio.ensure_future(builder.consume(handler))
            await push_all(q, QUEUE, [{"id": "before"}])

            async def handled_(item):
                return item in handled

            async def database(state):
                return (await q.admin.health()).get("database") == state

            await until("the first message is handled", lambda: handled_("before"))
            await until("the harness cuts the database off", lambda: database("unreachable"))
            await until("the harness lets the database back", lambda: database("connected"), within=75.0)
            assert not consuming.done(), f"the consume loop ended during the outage: {consuming.exception()!r}"

            async def pushed():
                try:
                    await push_all(q, QUEUE, [{"id": "after"}])
                    return True
                except Exception:
                    return False

            await until("a push is taken again", pushed)
            await until("the message pushed after the outage is handled", lambda: handled_("after"))
            assert handled == ["before", "after"], handled
            assert not consuming.done(), f"the consume loop ended: {consuming.exception()!r}"
            consuming.cancel()

    run(body(), timeout=DEADLINE_SECONDS)
