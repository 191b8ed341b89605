"""A queue's depth through the client (`admin.get_queue_depth`), for queue mode and a group,
before and after consuming and while a lease is held; and the stats refresh call."""

import pytest

from compat_helpers import client, pop_retry, push_all, run, unique


def _per_partition(depth):
    return {p["partition"]: (p["pending"], p["processing"], p["ready"]) for p in depth["partitions"]}


def test_depth_follows_a_groups_consumption_and_its_lease(queen_url):
    """3 messages on p1 and 2 on p2: queue mode and a new group both owe all 5. The group leases p1's
    3 (processing 3, ready 2), then acks them (pending 2 on p2 alone); queue mode still owes 5."""

    async def body():
        name, group = unique("depth"), unique("g")
        async with client(queen_url) as q:
            await push_all(q, name, [{"id": i} for i in range(3)], partition="p1")
            await push_all(q, name, [{"id": i} for i in range(3, 5)], partition="p2")

            queue_mode = await q.admin.get_queue_depth(name)
            assert queue_mode["queue"] == name
            assert (queue_mode["pending"], queue_mode["partitionsPending"]) == (5, 2), queue_mode
            assert (queue_mode["conflation"], queue_mode["effectivePending"]) == (False, 5)
            assert (queue_mode["processing"], queue_mode["ready"], queue_mode["partitionsReady"]) == (0, 5, 2)
            assert queue_mode["effectiveReady"] == 5
            assert _per_partition(queue_mode) == {"p1": (3, 0, 3), "p2": (2, 0, 2)}

            fresh = await q.admin.get_queue_depth(name, group)
            assert fresh["group"] == group
            assert _per_partition(fresh) == {"p1": (3, 0, 3), "p2": (2, 0, 2)}, "a new group owes everything"

            leased = await pop_retry(q.queue(name).partition("p1").group(group).batch(10).wait(False))
            assert len(leased) == 3, leased
            held = await q.admin.get_queue_depth(name, group)
            assert (held["pending"], held["processing"], held["ready"]) == (5, 3, 2), held
            assert _per_partition(held) == {"p1": (3, 3, 0), "p2": (2, 0, 2)}

            assert (await q.ack(leased, True, {"group": group}))["success"] is True
            after = await q.admin.get_queue_depth(name, group)
            assert (after["pending"], after["partitionsPending"], after["effectivePending"]) == (2, 1, 2), after
            assert _per_partition(after) == {"p1": (0, 0, 0), "p2": (2, 0, 2)}
            assert (await q.admin.get_queue_depth(name))["pending"] == 5, "queue mode is another group"

    run(body())


def test_depth_of_an_unknown_queue_raises_and_stats_refresh_answers(queen_url):
    """The depth of a queue that does not exist is a 404, which the client raises; the stats
    refresh answers an object saying nothing needed refreshing."""

    async def body():
        async with client(queen_url) as q:
            with pytest.raises(Exception, match="not found"):
                await q.admin.get_queue_depth(unique("missing"))
            refreshed = await q.admin.refresh_consumer_stats()
            assert refreshed["success"] is True and refreshed["refreshed"] is False, refreshed

    run(body())
