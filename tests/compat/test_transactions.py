"""Transactions through the client: ack one stage and push the next atomically.

Conformance scenarios 32, 33 and 34 of the client wire-protocol reference (§6).
"""

import asyncio

import pytest

from compat_helpers import client, pop_retry, push_all, run, unique


def test_an_ack_and_a_push_commit_together(queen_url):
    """§6.32: push to A, pop it; transaction().queue(B).push(...).ack(m).commit() succeeds; A is
    empty afterwards and B pops the pushed data. Several acks and queues in one bundle likewise."""

    async def body():
        a, b, c = unique("tx-a"), unique("tx-b"), unique("tx-c")
        async with client(queen_url) as q:
            await push_all(q, a, [{"v": 1}, {"v": 11}])
            popped = await pop_retry(q.queue(a).batch(2).wait(False))
            assert len(popped) == 2, popped
            result = await q.transaction().queue(b).push([{"data": {"v": 2}}]).ack(popped[0]).commit()
            assert result["success"] is True, result
            moved = await pop_retry(q.queue(b).batch(1).wait(False))
            assert [m["data"] for m in moved] == [{"v": 2}], moved

            bundle = q.transaction().ack(popped[1]).ack(moved[0])
            bundle = bundle.queue(c).push([{"data": {"v": 3}}, {"data": {"v": 4}}])
            assert (await bundle.commit())["success"] is True
            assert await q.queue(a).batch(10).wait(False).pop() == []
            assert await q.queue(b).batch(10).wait(False).pop() == []
            assert [m["data"] for m in await pop_retry(q.queue(c).batch(10).wait(False))] == [{"v": 3}, {"v": 4}]

    run(body())


def test_one_bundle_acks_messages_popped_under_different_leases(queen_url):
    """Messages of two partitions and of another queue, each popped under its own lease, are
    acknowledged in one bundle (requiredLeases names every lease)."""

    async def body():
        qa, qb, qn = unique("leases-a"), unique("leases-b"), unique("leases-next")
        async with client(queen_url) as q:
            await q.queue(qa).partition("p1").push([{"data": {"v": 1}}])
            await q.queue(qa).partition("p2").push([{"data": {"v": 2}}])
            await q.queue(qb).push([{"data": {"v": 3}}])
            first = (await pop_retry(q.queue(qa).partition("p1").batch(1).wait(False)))[0]
            second = (await pop_retry(q.queue(qa).partition("p2").batch(1).wait(False)))[0]
            third = (await pop_retry(q.queue(qb).batch(1).wait(False)))[0]
            assert len({first["leaseId"], second["leaseId"], third["leaseId"]}) == 3

            result = await q.transaction().ack([first, second, third]).queue(qn).push([{"data": {"v": 4}}]).commit()
            assert result["success"] is True, result
            assert await q.queue(qa).batch(10).wait(False).pop() == []
            assert await q.queue(qb).batch(10).wait(False).pop() == []
            assert [m["data"] for m in await pop_retry(q.queue(qn).batch(10).wait(False))] == [{"v": 4}]

    run(body())


def test_an_ack_under_an_expired_lease_rolls_the_whole_bundle_back(queen_url):
    """§6.33: A (lease 1 s) and B (lease 60 s) popped; A's lease expires and another pop takes A;
    a bundle acking both raises with "rolled back"; B is still un-acked and acks alone."""

    async def body():
        qa, qb, qn = unique("fence-a"), unique("fence-b"), unique("fence-next")
        async with client(queen_url) as q:
            await q.queue(qa).config({"lease_time": 1}).create()
            await q.queue(qb).config({"lease_time": 60}).create()
            await push_all(q, qa, [{"v": "a"}])
            await push_all(q, qb, [{"v": "b"}])
            a = (await pop_retry(q.queue(qa).batch(1).wait(False)))[0]
            b = (await pop_retry(q.queue(qb).batch(1).wait(False)))[0]
            await asyncio.sleep(1.2)  # past A's lease
            retaken = await pop_retry(q.queue(qa).batch(1).wait(False))
            assert retaken and retaken[0]["leaseId"] != a["leaseId"], retaken

            with pytest.raises(Exception, match="rolled back"):
                await q.transaction().ack(a).ack(b).queue(qn).push([{"data": 1}]).commit()
            assert await q.queue(qn).batch(1).wait(False).pop() == [], "the push did not happen"
            assert (await q.ack(b))["success"] is True, "B's ack did not happen in the failed bundle"

    run(body())


def test_a_transactional_push_is_idempotent(queen_url):
    """§6.34: two commits pushing the same transactionId to one partition both return; only one
    message is poppable."""

    async def body():
        name = unique("tx-idem")
        async with client(queen_url) as q:
            for _ in range(2):
                result = await q.transaction().queue(name).push([{"data": {"v": 1}, "transactionId": "same"}]).commit()
                assert result["success"] is True, result
            messages = await pop_retry(q.queue(name).batch(10).wait(False))
            assert len(messages) == 1, messages

    run(body())
