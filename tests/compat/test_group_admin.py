"""Consumer-group administration through the client: seek, group deletion, message status, lag.

Conformance scenarios 27, 28, 29, 30 and 31 of the client wire-protocol reference (§6).
"""

import asyncio

from compat_helpers import client, collect, ids, pop_retry, push_all, run, unique


async def _consume_all(q, name, group, count):
    """Pops and acks `count` messages for `group`, returning them."""
    messages = await collect(q.queue(name).group(group).subscription_mode("all").batch(count).wait(False), count)
    assert len(messages) == count, messages
    assert (await q.ack(messages, True, {"group": group}))["success"] is True
    return messages


def test_seek_by_timestamp_replays_the_same_messages_for_that_group_only(queen_url):
    """§6.27: group S consumes and acks 4 messages; a seek to a time before the pushes makes S
    read the same 4 again, in order; another group is not moved."""

    async def body():
        name, seeker, other = unique("seek-ts"), unique("S"), unique("O")
        async with client(queen_url) as q:
            await push_all(q, name, [{"id": i} for i in range(4)])
            first = await _consume_all(q, name, seeker, 4)
            await _consume_all(q, name, other, 4)

            result = await q.admin.seek_consumer_group(seeker, name, {"timestamp": "2001-01-01T00:00:00Z"})
            assert result["success"] is True, result
            again = await collect(q.queue(name).group(seeker).batch(10).wait(False), 4)
            assert ids(again) == ids(first) == [0, 1, 2, 3], again
            assert [m["transactionId"] for m in again] == [m["transactionId"] for m in first]
            assert await q.queue(name).group(other).batch(10).wait(False).pop() == [], "the other group stays"

    run(body())


def test_seek_to_end_skips_the_backlog(queen_url):
    """§6.28: group E with an unconsumed backlog of 5; seek toEnd: E's pop is empty; a later push
    is all E receives."""

    async def body():
        name, group = unique("seek-end"), unique("E")
        async with client(queen_url) as q:
            await push_all(q, name, [{"id": i} for i in range(5)])
            result = await q.admin.seek_consumer_group(group, name, {"toEnd": True})
            assert result["success"] is True, result
            assert await q.queue(name).group(group).batch(10).wait(False).pop() == []
            await push_all(q, name, [{"id": 5}])
            assert ids(await pop_retry(q.queue(name).group(group).batch(10).wait(False))) == [5]

    run(body())


def test_a_deleted_group_reconsumes_everything(queen_url):
    """§6.29: group D consumes and acks all; delete_consumer_group (metadata too); D's next pop with
    subscription "all" returns every message again. The per-queue deletion leaves D's other queues
    alone."""

    async def body():
        name, other_queue, group = unique("del-group"), unique("del-other"), unique("D")
        async with client(queen_url) as q:
            await push_all(q, name, [{"id": i} for i in range(3)])
            await push_all(q, other_queue, [{"id": i} for i in range(2)])
            await _consume_all(q, name, group, 3)
            await _consume_all(q, other_queue, group, 2)

            deleted = await q.delete_consumer_group(group)
            assert deleted.get("success", True) is True, deleted
            again = await collect(q.queue(name).group(group).subscription_mode("all").batch(10).wait(False), 3)
            assert ids(again) == [0, 1, 2], again
            assert (await q.ack(again, True, {"group": group}))["success"] is True
            await _consume_all(q, other_queue, group, 2)

            result = await q.admin.delete_consumer_group_for_queue(group, name)
            assert result["deletedPartitions"] == 1, result
            assert ids(await collect(q.queue(name).group(group).subscription_mode("all").batch(10).wait(False), 3)) == [0, 1, 2]
            assert await q.queue(other_queue).group(group).batch(10).wait(False).pop() == []

    run(body())


def test_a_message_reports_each_groups_progress(queen_url):
    """§6.30: a message popped with commit_on_delivery has no lease; get_message shows exactly one
    group entry, consumed, without a lease expiry. A leased, un-acked pop shows consumed False with
    a lease expiry."""

    async def body():
        name = unique("msg-status")
        async with client(queen_url) as q:
            await q.queue(name).push([{"data": {"v": 1}, "transactionId": "status-1"}])
            popped = await q.queue(name).batch(1).wait(True).timeout_millis(5000).commit_on_delivery().pop()
            assert len(popped) == 1 and not popped[0].get("leaseId"), popped
            m = popped[0]
            detail = await q.admin.get_message(m["partitionId"], m["transactionId"])
            assert len(detail["consumerGroups"]) == 1, detail
            assert detail["consumerGroups"][0]["consumed"] is True, detail
            assert detail["consumerGroups"][0]["leaseExpiresAt"] is None, detail

            group = unique("G")
            leased = await pop_retry(q.queue(name).group(group).subscription_mode("all").batch(1).wait(False))
            assert leased and leased[0]["leaseId"], leased
            detail = await q.admin.get_message(m["partitionId"], m["transactionId"])
            entry = next(g for g in detail["consumerGroups"] if g["name"] == group)
            assert entry["consumed"] is False and entry["leaseExpiresAt"], detail
            assert detail["status"] != "completed"

    run(body())


def test_lagging_groups_are_listed(queen_url):
    """§6.31: group L registered (one pop and ack) on a queue that then receives a backlog L does
    not consume; after 2 s get_lagging_consumers(1) names L; list_consumer_groups contains L;
    get_consumer_group(L) answers, and `lagging` is not read as a group name."""

    async def body():
        name, group = unique("lag"), unique("L")
        async with client(queen_url) as q:
            await push_all(q, name, [{"id": 0}])
            await _consume_all(q, name, group, 1)
            await push_all(q, name, [{"id": i} for i in range(1, 4)])
            await asyncio.sleep(2)  # the backlog must age past the 1 s threshold

            lagging = await q.admin.get_lagging_consumers(1)
            assert group in str(lagging), lagging
            listed = await q.admin.list_consumer_groups()
            assert group in str(listed), listed
            detail = await q.admin.get_consumer_group(group)
            assert detail["name"] == group, detail
            refreshed = await q.admin.refresh_consumer_stats()
            assert isinstance(refreshed, dict), refreshed

    run(body())
