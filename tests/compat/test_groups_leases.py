"""Leases (expiry, renewal) and consumer groups (fan-out, per-group cursors, subscription start).

Conformance scenarios 11, 12 (direct renew), 23, 24, 25 and 26 of the client wire-protocol
reference (§6).
"""

import asyncio

from compat_helpers import client, collect, ids, iso_now, parse_iso, pop_retry, push_all, run, unique


def test_an_expired_lease_redelivers_the_message(queen_url):
    """§6.11: lease_time 1 s, no ack: the message comes back with the same transaction id under a new
    lease; an ack with the old lease fails, with the new one succeeds."""

    async def body():
        name = unique("lease-expiry")
        async with client(queen_url) as q:
            await q.queue(name).config({"lease_time": 1}).create()
            await q.queue(name).push([{"data": {"v": 1}, "transactionId": "expiring"}])
            first = await pop_retry(q.queue(name).batch(1).wait(False))
            assert [m["transactionId"] for m in first] == ["expiring"], first
            assert await q.queue(name).batch(1).wait(False).pop() == [], "leased"

            await asyncio.sleep(1.2)  # past the 1 s lease
            second = await pop_retry(q.queue(name).batch(1).wait(False))
            assert [m["transactionId"] for m in second] == ["expiring"], second
            assert second[0]["leaseId"] and second[0]["leaseId"] != first[0]["leaseId"], (first, second)
            if "deliveryAttempt" in first[0] and "deliveryAttempt" in second[0]:
                assert second[0]["deliveryAttempt"] > first[0]["deliveryAttempt"], (first, second)

            stale = await q.ack(first[0])
            assert stale["success"] is False, stale
            fresh = await q.ack(second[0])
            assert fresh["success"] is True, fresh
            assert await q.queue(name).batch(1).wait(False).pop() == []

    run(body())


def test_renew_extends_a_lease_and_refuses_an_unknown_one(queen_url):
    """§6.12 (direct): renew(m) succeeds with a new expiry; renew("no-such-lease") is success False;
    a lease released by its ack cannot be renewed."""

    async def body():
        name = unique("renew")
        async with client(queen_url) as q:
            await q.queue(name).push([{"data": {"v": 1}}])
            popped = await pop_retry(q.queue(name).batch(1).wait(False))
            assert len(popped) == 1, popped
            m = popped[0]

            renewed = await q.renew(m)
            assert renewed["success"] is True, renewed
            assert renewed["leaseId"] == m["leaseId"], renewed
            parse_iso(renewed["newExpiresAt"])

            by_id = await q.renew(m["leaseId"])
            assert by_id["success"] is True, by_id

            unknown = await q.renew("no-such-lease")
            assert unknown["success"] is False, unknown
            assert unknown.get("error"), unknown

            assert (await q.ack(m))["success"] is True
            released = await q.renew(m)
            assert released["success"] is False, released

    run(body())


def test_groups_fan_out_and_queue_mode_is_one_more_cursor(queen_url):
    """§6.23: 100 messages pushed before any group exists; groups A and B (subscription "all") each
    receive all 100; a queue-mode pop still sees them."""

    async def body():
        name = unique("fan-out")
        group_a, group_b = unique("A"), unique("B")
        async with client(queen_url) as q:
            await push_all(q, name, [{"id": i} for i in range(100)])
            received = {}
            for group in (group_a, group_b):
                calls = []

                async def handler(messages, calls=calls):
                    calls.append(messages)

                builder = q.queue(name).group(group).subscription_mode("all").batch(100).limit(1).wait(False)
                await asyncio.wait_for(builder.consume(handler), 30)
                received[group] = [i for messages in calls for i in ids(messages)]
            assert received[group_a] == list(range(100))
            assert received[group_b] == list(range(100))

            queue_mode = await collect(q.queue(name).batch(100).wait(False), 100)
            assert ids(queue_mode) == list(range(100))

            # The groups acked (the consume loop does): their cursors are at the end.
            for group in (group_a, group_b):
                assert await q.queue(name).group(group).subscription_mode("all").batch(10).wait(False).pop() == []

    run(body())


def test_a_group_cursor_belongs_to_its_group(queen_url):
    """§6.24: group G pops and acks 2 messages; G has nothing left, group H still gets both."""

    async def body():
        name = unique("group-cursor")
        g, h = unique("G"), unique("H")
        async with client(queen_url) as q:
            await push_all(q, name, [{"id": 0}, {"id": 1}])
            got = await collect(q.queue(name).group(g).subscription_mode("all").batch(2).wait(False), 2)
            assert ids(got) == [0, 1], got
            acked = await q.ack(got, True, {"group": g})
            assert acked["success"] is True, acked
            assert await q.queue(name).group(g).subscription_mode("all").batch(10).wait(False).pop() == []

            other = await pop_retry(q.queue(name).group(h).subscription_mode("all").batch(10).wait(False))
            assert ids(other) == [0, 1], other

            # A lease is per group: while H holds the partition, another consumer of H gets nothing,
            # but queue mode (its own cursor) still gets both messages.
            assert await q.queue(name).group(h).subscription_mode("all").batch(10).wait(False).pop() == []
            queue_mode = await pop_retry(q.queue(name).batch(10).wait(False))
            assert ids(queue_mode) == [0, 1], queue_mode

            # H acks with its own group: now H is at the end too.
            assert (await q.ack(other, True, {"group": h}))["success"] is True
            assert await q.queue(name).group(h).subscription_mode("all").batch(10).wait(False).pop() == []

    run(body())


def test_a_new_group_in_new_mode_skips_the_backlog(queen_url):
    """§6.25: 5 messages pushed; group N's first pop with subscription_mode("new") is []; it then
    receives only the message pushed afterwards."""

    async def body():
        name = unique("mode-new")
        group = unique("N")
        async with client(queen_url) as q:
            await push_all(q, name, [{"id": i} for i in range(5)])
            builder = q.queue(name).group(group).subscription_mode("new").batch(10).wait(False)
            assert await builder.pop() == []
            await push_all(q, name, [{"id": 5}])
            got = await pop_retry(builder)
            assert ids(got) == [5], got
            assert (await q.ack(got, True, {"group": group}))["success"] is True
            assert await builder.pop() == []

    run(body())


def test_a_new_group_can_start_at_a_timestamp(queen_url):
    """§6.26: 3 messages, then time t, then 2 more: group F with subscription_from(t) receives only
    the last 2."""

    async def body():
        name = unique("from-timestamp")
        group = unique("F")
        async with client(queen_url) as q:
            await push_all(q, name, [{"id": i} for i in range(3)])
            await asyncio.sleep(0.25)
            start = iso_now()
            await asyncio.sleep(0.25)
            await push_all(q, name, [{"id": 3}, {"id": 4}])

            builder = q.queue(name).group(group).subscription_from(start).batch(10).wait(False)
            got = await pop_retry(builder)
            assert ids(got) == [3, 4], got
            assert (await q.ack(got, True, {"group": group}))["success"] is True
            assert await builder.pop() == []

            # Another group, from the beginning, still has all five.
            everything = await pop_retry(q.queue(name).group(unique("all")).subscription_mode("all").batch(10).wait(False))
            assert ids(everything) == [0, 1, 2, 3, 4], everything

    run(body())


def test_the_subscription_is_fixed_when_the_group_first_pops(queen_url):
    """subscriptionMode only matters the first time a group is seen: once registered in "new" mode,
    a later pop asking for "all" does not rewind it."""

    async def body():
        name = unique("subscription-fixed")
        group = unique("S")
        async with client(queen_url) as q:
            await push_all(q, name, [{"id": 0}, {"id": 1}])
            assert await q.queue(name).group(group).subscription_mode("new").batch(10).wait(False).pop() == []
            assert await q.queue(name).group(group).subscription_mode("all").batch(10).wait(False).pop() == []

    run(body())
