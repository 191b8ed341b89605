"""The fleet's creation limits through the official client, against a broker of its own that allows
three queues and one named group per queue (tests/compat/main.rs). A request past a limit must
reach the caller at once: the client retries a 429 in place, ten times over minutes, and a
long-poll pop for ever."""

import asyncio

import httpx
import pytest

from compat_helpers import client, pop_retry, push_all, run, unique

# Well under the minutes a 429 retried in place would take.
RAISED_WITHIN_SECONDS = 20


async def refused(call):
    """The HTTP error `call` raises, which it must raise within RAISED_WITHIN_SECONDS."""
    with pytest.raises(httpx.HTTPStatusError) as raised:
        await asyncio.wait_for(call, RAISED_WITHIN_SECONDS)
    return raised.value.response


def test_a_pop_or_push_past_a_creation_limit_is_reported_at_once(queen_url, capsys):
    async def body():
        name = unique("limits")
        async with client(queen_url) as q:
            await push_all(q, name, [{"id": 1}])
            first = await pop_retry(q.queue(name).group("first").batch(1).wait(False))
            assert len(first) == 1, first

            # A second named group on the queue, by a long poll, which the client would retry for
            # ever on a 429. The client's pop reports an error as no messages, and prints it.
            second = q.queue(name).group("second").batch(1).wait(True).timeout_millis(2000).pop()
            assert await asyncio.wait_for(second, RAISED_WITHIN_SECONDS) == []
            printed = capsys.readouterr().out
            assert "Pop failed" in printed and "limits.max_groups_per_queue" in printed, printed

            # Two more queues fill the three places; a fourth is refused and nothing of it is stored.
            for n in range(2):
                await push_all(q, unique(f"limits-{n}"), [{"id": n}])
            fourth = unique("limits-fourth")
            answer = await refused(q.queue(fourth).push([{"data": {"id": 4}}]))
            assert answer.status_code == 409, answer.text
            assert answer.json()["limit"] == "limits.max_queues", answer.text
            with pytest.raises(httpx.HTTPStatusError) as missing:
                await q.admin.get_queue(fourth)
            assert missing.value.response.status_code == 404

    run(body())
