"""The client's consume loop: each() and batch handlers, auto-ack and nack, lease renewal,
multi-partition and competing consumers.

Conformance scenarios 9, 12 (consume side), 13 (consume side), 14, 16, 17 and 18 of the client
wire-protocol reference (§6).
"""

import asyncio
import time

from compat_helpers import client, ids, pop_retry, push_all, push_one_by_one, run, unique

# A consume that misbehaves (never reaching its limit) must fail the test, not hang it.
CONSUME_DEADLINE = 30.0


async def consume(builder, handler, deadline=CONSUME_DEADLINE):
    await asyncio.wait_for(builder.consume(handler), deadline)


def test_each_consumes_in_order_and_acks(queen_url):
    """§6.9: 100 messages pushed one by one; batch(1).each() consume sees ids 0..99 in order and acks
    them all; the queue is empty afterwards."""

    async def body():
        name = unique("each-fifo")
        seen = []

        async def handler(message):
            seen.append(message["data"]["id"])

        async with client(queen_url) as q:
            await push_one_by_one(q, name, [{"id": i} for i in range(100)])
            await consume(q.queue(name).batch(1).wait(False).limit(100).each(), handler)
            assert seen == list(range(100))
            assert await q.queue(name).batch(10).wait(False).pop() == []

    run(body())


def test_a_group_consume_acks_for_its_group(queen_url):
    """A named group's each() consume (one ack per message, carrying the group) moves only that
    group's cursor: the group has nothing left, queue mode still has everything."""

    async def body():
        name = unique("group-consume")
        group = unique("g")
        seen = []

        async def handler(message):
            seen.append(message["data"]["id"])

        async with client(queen_url) as q:
            await push_all(q, name, [{"id": i} for i in range(5)])
            builder = q.queue(name).group(group).subscription_mode("all").batch(1).wait(False).limit(5).each()
            await consume(builder, handler)
            assert seen == [0, 1, 2, 3, 4]
            assert await q.queue(name).group(group).subscription_mode("all").batch(10).wait(False).pop() == []
            queue_mode = await pop_retry(q.queue(name).batch(10).wait(False))
            assert ids(queue_mode) == [0, 1, 2, 3, 4], queue_mode

    run(body())


def test_a_batch_consume_gets_the_whole_backlog_in_one_call(queen_url):
    """§6.9: batch(1000).limit(1) hands all 100 messages to one handler call, in order; a batch(2)
    pop returns exactly 2."""

    async def body():
        name = unique("batch-consume")
        calls = []

        async def handler(messages):
            calls.append(ids(messages))

        async with client(queen_url) as q:
            await push_all(q, name, [{"id": i} for i in range(100)])
            await consume(q.queue(name).batch(1000).wait(False).limit(1), handler)
            assert calls == [list(range(100))], calls
            assert await q.queue(name).batch(10).wait(False).pop() == []

            capped = unique("batch-cap")
            await push_all(q, capped, [{"id": i} for i in range(10)])
            two = await pop_retry(q.queue(capped).batch(2).wait(False))
            assert ids(two) == [0, 1], two

    run(body())


def test_lease_renewal_keeps_a_slow_handler_s_message(queen_url):
    """§6.12: lease_time 2 s, renew_lease(True, 1000), a handler that takes 3 s: the message is
    handled once, nobody else can pop it meanwhile, and its ack lands."""

    async def body():
        name = unique("renew-consume")
        handled = []
        popped_meanwhile = []

        async with client(queen_url) as q, client(queen_url) as other:
            await q.queue(name).config({"lease_time": 2}).create()
            await q.queue(name).push([{"data": {"slow": True}, "transactionId": "slow"}])

            async def handler(message):
                handled.append(message["transactionId"])
                await asyncio.sleep(2.5)
                popped_meanwhile.extend(await other.queue(name).batch(1).wait(False).pop())
                await asyncio.sleep(0.5)

            await consume(q.queue(name).batch(1).each().renew_lease(True, 1000).limit(1), handler)
            assert handled == ["slow"]
            assert popped_meanwhile == [], "the renewed lease must keep the message from other consumers"
            assert await q.queue(name).batch(1).wait(False).pop() == [], "acked, not redelivered"

    run(body())


def test_a_multi_partition_consume_gets_one_lease(queen_url):
    """§6.13 (consume side): partitions(3) with limit(1) hands the handler all 6 messages of three
    partitions, under at most one lease id."""

    async def body():
        name = unique("multi-partition-consume")
        calls = []

        async def handler(messages):
            calls.append(messages)

        async with client(queen_url) as q:
            for p in ("p0", "p1", "p2"):
                await push_all(q, name, [{"p": p, "i": 0}, {"p": p, "i": 1}], partition=p)
            await consume(q.queue(name).batch(100).partitions(3).wait(False).limit(1), handler)
            assert len(calls) == 1, calls
            messages = calls[0]
            assert len(messages) == 6, messages
            assert len({m["partitionId"] for m in messages}) == 3, messages
            assert len({m["leaseId"] for m in messages}) <= 1, messages
            assert await q.queue(name).batch(100).partitions(3).wait(False).pop() == [], "acked"

    run(body())


def test_a_consume_without_autopilot_claims_one_partition(queen_url):
    """§6.14: 4 partitions x 5 messages; batch(100).limit(1).autopilot(False) consume gets exactly the
    5 messages of one partition."""

    async def body():
        name = unique("single-partition-consume")
        calls = []

        async def handler(messages):
            calls.append(messages)

        async with client(queen_url) as q:
            for p in range(4):
                await push_all(q, name, [{"id": i} for i in range(5)], partition=f"p{p}")
            await consume(q.queue(name).batch(100).wait(False).limit(1).autopilot(False), handler)
            assert len(calls) == 1, calls
            assert ids(calls[0]) == [0, 1, 2, 3, 4], calls
            assert len({m["partitionId"] for m in calls[0]}) == 1, calls

    run(body())


def test_competing_consumers_keep_the_partition_order(queen_url):
    """§6.16: concurrency(10) workers over one partition of 100 ordered messages: the handler sees
    0..99 strictly in order (a leased partition is never given to a second worker)."""

    async def body():
        name = unique("competing")
        seen = []

        async def handler(message):
            seen.append(message["data"]["id"])
            await asyncio.sleep(0.002)

        async with client(queen_url) as q:
            await push_all(q, name, [{"id": i} for i in range(100)])
            await consume(q.queue(name).concurrency(10).batch(1).wait(False).limit(10).each(), handler)
            assert seen == list(range(100))
            assert await q.queue(name).batch(10).wait(False).pop() == []

    run(body())


def test_a_nacked_batch_comes_back_until_it_succeeds(queen_url):
    """§6.17: retry_limit 3, 100 messages, a batch handler that fails twice: exactly three calls of
    100 messages each, and the queue is empty afterwards."""

    async def body():
        name = unique("nack-batch")
        calls = []

        async def handler(messages):
            calls.append(ids(messages))
            if len(calls) <= 2:
                raise RuntimeError(f"failing call {len(calls)}")

        async with client(queen_url) as q:
            await q.queue(name).config({"retry_limit": 3}).create()
            await push_all(q, name, [{"id": i} for i in range(100)])
            await consume(q.queue(name).batch(100).wait(False).limit(300), handler)
            assert calls == [list(range(100))] * 3, [len(c) for c in calls]
            assert await q.queue(name).batch(100).wait(False).pop() == []

    run(body())


def test_each_nack_redelivers_the_failed_message_and_the_rest_of_its_partition(queen_url):
    """each() with a handler that fails once on message 2: 1 is handled once, 2 twice, 3..5 once
    (the client skips them after the nack and the broker redelivers them)."""

    async def body():
        name = unique("each-nack")
        handled = []

        async def handler(message):
            n = message["data"]["n"]
            handled.append(n)
            if n == 2 and handled.count(2) == 1:
                raise RuntimeError("first attempt at 2 fails")

        async with client(queen_url) as q:
            await q.queue(name).config({"retry_limit": 3}).create()
            await push_all(q, name, [{"n": n} for n in range(1, 6)])
            await consume(q.queue(name).batch(5).wait(False).limit(6).each(), handler)
            assert handled == [1, 2, 2, 3, 4, 5], handled
            assert await q.queue(name).batch(10).wait(False).pop() == []

    run(body())


def test_a_message_that_keeps_failing_is_given_up_after_the_retry_limit(queen_url):
    """§6.18: lease_time 30, retry_limit 1, each() handler always failing on message 2: 1, 3, 4, 5
    handled exactly once, 2 exactly twice, then the queue is empty and the DLQ holds message 2 with
    its error."""

    async def body():
        name = unique("exhaustion")
        handled = []

        async def handler(message):
            n = message["data"]["n"]
            handled.append(n)
            if n == 2:
                raise RuntimeError("2 always fails")

        async with client(queen_url) as q:
            await q.queue(name).config({"lease_time": 30, "retry_limit": 1}).create()
            await push_all(q, name, [{"n": n} for n in range(1, 6)])
            started = time.monotonic()
            await consume(q.queue(name).batch(5).wait(False).limit(6).each(), handler)
            assert sorted(handled) == [1, 2, 2, 3, 4, 5], handled
            assert handled.count(2) == 2, handled
            assert time.monotonic() - started < 15, "redelivery after a nack must not wait for the lease"
            assert await q.queue(name).batch(10).wait(False).pop() == []
            dlq = await q.queue(name).dlq().limit(50).get()
            assert dlq["total"] == 1 and len(dlq["messages"]) == 1, dlq
            dead = dlq["messages"][0]
            assert dead["data"] == {"n": 2}, dead
            assert "2 always fails" in (dead.get("errorMessage") or ""), dead

    run(body())
