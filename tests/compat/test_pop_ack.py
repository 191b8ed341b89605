"""pop() and Queen.ack(): empty pops, long polls, batches, partitions, ack statuses and late acks.

Conformance scenarios 5, 6, 7, 10, 13, 14 (pop side), 15, 19, 20, 21 and 22 of the client
wire-protocol reference (§6), plus autopilot sizing and commit_on_delivery (autoAck).
"""

import asyncio
import datetime
import time

from compat_helpers import client, collect, ids, pop_retry, push_all, run, unique


def test_an_empty_non_waiting_pop_answers_at_once(queen_url):
    """§6.5: batch(1).wait(False).pop() on an empty queue is [] well under a second."""

    async def body():
        name = unique("empty")
        async with client(queen_url) as q:
            await q.queue(name).create()
            for builder in (
                q.queue(name).batch(1).wait(False),
                q.queue(name).wait(False),
                q.queue(name).partition("nothing-here").batch(1).wait(False),
                q.queue(name).group(unique("g")).batch(1).wait(False),
            ):
                started = time.monotonic()
                assert await builder.pop() == []
                assert time.monotonic() - started < 1.0

    run(body())


def test_a_long_poll_wakes_up_when_a_message_is_pushed(queen_url):
    """§6.6: a waiting pop returns the message pushed 2 s later after about 2 s, not at its timeout."""

    async def body():
        name = unique("wake-up")
        async with client(queen_url) as q:
            started = time.monotonic()
            waiting = asyncio.create_task(q.queue(name).batch(1).wait(True).pop())
            await asyncio.sleep(2.0)
            assert not waiting.done(), "the pop must wait for a message"
            await q.queue(name).push([{"data": {"woke": True}, "transactionId": "wake"}])
            popped = await waiting
            elapsed = time.monotonic() - started
            assert [m["transactionId"] for m in popped] == ["wake"], popped
            assert 1.9 <= elapsed < 5.0, f"answered after {elapsed:.2f}s"
            assert (await q.ack(popped[0]))["success"] is True

    run(body())


def test_a_long_poll_on_an_empty_queue_ends_at_its_timeout(queen_url):
    """§6.7: wait(True).timeout_millis(1500).pop() is [] after about 1.5 s (the client gives up at 6.5 s)."""

    async def body():
        name = unique("poll-timeout")
        async with client(queen_url) as q:
            await q.queue(name).create()
            started = time.monotonic()
            popped = await q.queue(name).wait(True).timeout_millis(1500).pop()
            elapsed = time.monotonic() - started
            assert popped == []
            assert 1.4 <= elapsed < 3.0, f"answered after {elapsed:.2f}s"

    run(body())


def test_an_ack_completes_the_message(queen_url):
    """§6.10: ack(m) succeeds and the message is gone."""

    async def body():
        name = unique("ack")
        async with client(queen_url) as q:
            await q.queue(name).push([{"data": {"v": 1}}])
            popped = await pop_retry(q.queue(name).batch(1).wait(False))
            assert len(popped) == 1, popped
            acked = await q.ack(popped[0])
            assert acked["success"] is True, acked
            assert acked.get("noop") is not True, acked
            assert await q.queue(name).batch(1).wait(False).pop() == []

            # The same through the batch route, and with a group.
            group = unique("g")
            await q.queue(name).push([{"data": {"v": 2}}, {"data": {"v": 3}}])
            popped = await collect(q.queue(name).batch(10).wait(False), 2)
            assert [m["data"]["v"] for m in popped] == [2, 3], popped
            acked = await q.ack(popped)
            assert acked["success"] is True, acked
            assert await q.queue(name).batch(10).wait(False).pop() == []

            grouped = q.queue(name).group(group).subscription_mode("all").batch(10).wait(False)
            popped = await collect(grouped, 3)
            assert [m["data"]["v"] for m in popped] == [1, 2, 3], popped
            acked = await q.ack(popped, True, {"group": group})
            assert acked["success"] is True, acked
            assert await grouped.pop() == []

    run(body())


def test_a_multi_partition_pop_shares_one_lease_and_caps_the_batch(queen_url):
    """§6.13: partitions(3) claims three partitions under one lease id; one renew call covers
    them; batch is a global cap across the claimed partitions."""

    async def body():
        async with client(queen_url) as q:
            name = unique("multi-partition")
            for p in ("p0", "p1", "p2"):
                await push_all(q, name, [{"p": p, "i": 0}, {"p": p, "i": 1}], partition=p)
            msgs = await pop_retry(q.queue(name).batch(100).partitions(3).wait(False))
            assert len(msgs) == 6, msgs
            assert len({m["partitionId"] for m in msgs}) == 3, msgs
            assert len({m["leaseId"] for m in msgs}) == 1, msgs
            for p in ("p0", "p1", "p2"):
                assert [m["data"]["i"] for m in msgs if m["partition"] == p] == [0, 1], "FIFO per partition"
            renewed = await q.renew(msgs)
            assert isinstance(renewed, list) and len(renewed) == 1, renewed
            assert renewed[0]["success"] is True, renewed
            acked = await q.ack(msgs)
            assert acked["success"] is True, acked
            assert await q.queue(name).batch(100).partitions(3).wait(False).pop() == []

            capped = unique("global-cap")
            for p in range(5):
                await push_all(q, capped, [{"i": i} for i in range(100)], partition=f"p{p}")
            msgs = await pop_retry(q.queue(capped).batch(10).partitions(5).wait(False))
            assert len(msgs) == 10, len(msgs)
            assert len({m["leaseId"] for m in msgs}) == 1, msgs

    run(body())


def test_without_partitions_and_autopilot_a_pop_claims_one_partition(queen_url):
    """§6.14 (pop side): with autopilot off and no partitions(), one pop serves one partition."""

    async def body():
        name = unique("single-partition")
        async with client(queen_url) as q:
            for p in range(4):
                await push_all(q, name, [{"id": i} for i in range(5)], partition=f"p{p}")
            msgs = await pop_retry(q.queue(name).batch(100).wait(False).autopilot(False))
            assert len(msgs) == 5, msgs
            assert len({m["partitionId"] for m in msgs}) == 1, msgs
            assert ids(msgs) == [0, 1, 2, 3, 4], msgs

    run(body())


def test_autopilot_sizes_a_pop_that_names_no_batch(queen_url):
    """With autopilot on (the client default) and no batch()/partitions(), the client sends only
    autopilot=true and the broker sizes the pop: a FIFO prefix of one partition."""

    async def body():
        name = unique("autopilot")
        async with client(queen_url) as q:
            await push_all(q, name, [{"id": i} for i in range(150)], partition="a")
            await push_all(q, name, [{"id": i} for i in range(150)], partition="b")
            result = await q.queue(name).wait(False).pop_result()
            msgs = result.messages
            assert msgs, "an autopilot pop of a full queue delivers"
            assert len({m["partitionId"] for m in msgs}) == 1, "the broker claims one partition by default"
            assert ids(msgs) == list(range(len(msgs))), "a FIFO prefix of the partition"
            assert len({m["leaseId"] for m in msgs}) == 1, msgs
            assert (await q.ack(msgs))["success"] is True

    run(body())


def test_the_partition_route_and_the_default_partition(queen_url):
    """§6.15: partition("p1") pops only p1; partition("Default") pops from any partition."""

    async def body():
        name = unique("partition-route")
        async with client(queen_url) as q:
            await push_all(q, name, [{"p": "p1", "i": 0}, {"p": "p1", "i": 1}], partition="p1")
            await push_all(q, name, [{"p": "p2", "i": 0}, {"p": "p2", "i": 1}], partition="p2")

            from_p1 = await pop_retry(q.queue(name).partition("p1").batch(10).wait(False))
            assert [(m["partition"], m["data"]) for m in from_p1] == [
                ("p1", {"p": "p1", "i": 0}),
                ("p1", {"p": "p1", "i": 1}),
            ], from_p1

            # p1 is leased now; "Default" is the queue-wide route, so it finds p2.
            from_any = await pop_retry(q.queue(name).partition("Default").batch(10).wait(False))
            assert [(m["partition"], m["data"]) for m in from_any] == [
                ("p2", {"p": "p2", "i": 0}),
                ("p2", {"p": "p2", "i": 1}),
            ], from_any
            assert (await q.ack(from_p1 + from_any))["success"] is True

    run(body())


def test_commit_on_delivery_moves_the_cursor_without_a_lease(queen_url):
    """pop() with commit_on_delivery() (autoAck=true): no lease id, and the next pop goes on to the
    following message at once, without any ack."""

    async def body():
        name = unique("auto-ack")
        group = unique("g")
        async with client(queen_url) as q:
            await push_all(q, name, [{"id": 0}, {"id": 1}])
            first = await q.queue(name).batch(1).wait(True).timeout_millis(3000).commit_on_delivery().pop()
            assert ids(first) == [0], first
            assert not first[0].get("leaseId"), first
            second = await q.queue(name).batch(1).wait(False).commit_on_delivery().pop()
            assert ids(second) == [1], second
            assert not second[0].get("leaseId"), second
            assert await q.queue(name).batch(10).wait(False).pop() == []

            # A named group commits its own cursor only.
            grouped = q.queue(name).group(group).subscription_mode("all").batch(10).wait(False)
            got = await pop_retry(grouped.commit_on_delivery())
            assert ids(got) == [0, 1], got
            assert await q.queue(name).group(group).subscription_mode("all").batch(10).wait(False).pop() == []

    run(body())


def _statuses(msgs, statuses):
    """The messages with a per-message `_status` each, as Queen.ack(list) reads them."""
    return [{**m, "_status": s} for m, s in zip(msgs, statuses)]


def test_a_failed_ack_clamps_the_cursor_before_it(queen_url):
    """§6.19: acking five messages with #2 failed (the rest completed) redelivers #2..#5."""

    async def body():
        name = unique("nack-clamp")
        async with client(queen_url) as q:
            await push_all(q, name, [{"id": i} for i in range(1, 6)])
            msgs = await collect(q.queue(name).batch(5).wait(False), 5)
            assert ids(msgs) == [1, 2, 3, 4, 5], msgs
            await q.ack(_statuses(msgs, ["completed", "failed", "completed", "completed", "completed"]))
            again = await pop_retry(q.queue(name).batch(10).wait(False))
            assert ids(again) == [2, 3, 4, 5], again
            assert (await q.ack(again))["success"] is True
            assert await q.queue(name).batch(10).wait(False).pop() == []

    run(body())


def test_a_retry_ack_redelivers_without_charging_the_retry_budget(queen_url):
    """§6.20: `retry` on #2 of 3 brings #2 and #3 back. With retry_limit 0 a charged failure would
    dead-letter #2 at once, so getting it back twice shows `retry` is free."""

    async def body():
        name = unique("retry-status")
        async with client(queen_url) as q:
            await q.queue(name).config({"retry_limit": 0}).create()
            await push_all(q, name, [{"id": i} for i in range(1, 4)])
            msgs = await collect(q.queue(name).batch(3).wait(False), 3)
            assert ids(msgs) == [1, 2, 3], msgs
            await q.ack(_statuses(msgs, ["completed", "retry", "completed"]))
            again = await pop_retry(q.queue(name).batch(10).wait(False))
            assert ids(again) == [2, 3], again

            await q.ack(_statuses(again, ["retry", "completed"]))
            third = await pop_retry(q.queue(name).batch(10).wait(False))
            assert ids(third) == [2, 3], third
            assert (await q.ack(third))["success"] is True
            assert await q.queue(name).batch(10).wait(False).pop() == []
            assert (await q.queue(name).dlq().get())["total"] == 0, "retry never dead-letters"

    run(body())


def test_a_failed_ack_past_the_retry_limit_moves_on(queen_url):
    """retry_limit 0: one `failed` ack takes the message out of the queue for good (dead-lettered);
    the messages after it are redelivered."""

    async def body():
        name = unique("retry-exhausted")
        async with client(queen_url) as q:
            await q.queue(name).config({"retry_limit": 0}).create()
            await push_all(q, name, [{"id": i} for i in range(1, 4)])
            msgs = await collect(q.queue(name).batch(3).wait(False), 3)
            assert ids(msgs) == [1, 2, 3], msgs
            await q.ack(_statuses(msgs, ["completed", "failed", "completed"]))
            again = await pop_retry(q.queue(name).batch(10).wait(False))
            assert ids(again) == [3], again
            assert (await q.ack(again))["success"] is True
            assert await q.queue(name).batch(10).wait(False).pop() == []
            dlq = await q.queue(name).dlq().get()
            assert [m["data"] for m in dlq["messages"]] == [{"id": 2}], dlq
            # The builder passes what it is given: a limit past the broker's page and times
            # without a zone (as Python writes them) still find the dead letter.
            now = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)
            since, until = (now - datetime.timedelta(hours=1)).isoformat(), (now + datetime.timedelta(hours=1)).isoformat()
            found = await q.queue(name).dlq().limit(5000).from_(since).to(until).get()
            assert found["total"] == 1 and found["messages"][0]["data"] == {"id": 2}, found

    run(body())


def test_dead_letters_of_one_group_are_listed_retried_and_deleted_through_the_admin_api(queen_url):
    """dlq(group) lists one group's dead letters; admin.retry_message puts a message back (every
    group reads it again, under a new transaction id) and admin.delete_message removes them."""

    async def body():
        name = unique("dlq-admin")
        async with client(queen_url) as q:
            await q.queue(name).config({"retry_limit": 0}).create()
            await push_all(q, name, [{"id": 1}])
            failing, fine = unique("failing"), unique("fine")
            for group, status in ((failing, "failed"), (fine, "completed")):
                builder = q.queue(name).group(group).subscription_mode("all").batch(1).wait(False)
                msgs = await collect(builder, 1)
                assert ids(msgs) == [1], msgs
                assert (await q.ack(msgs[0], status, {"group": group}))["success"] is True
            letters = await q.queue(name).dlq(failing).get()
            assert letters["total"] == 1 and letters["messages"][0]["data"] == {"id": 1}, letters
            assert (await q.queue(name).dlq(fine).get())["total"] == 0
            letter = letters["messages"][0]

            await q.admin.retry_message(letter["partitionId"], letter["transactionId"])
            assert (await q.queue(name).dlq(failing).get())["total"] == 0, "moved back"
            for group in (failing, fine):
                again = await collect(q.queue(name).group(group).batch(1).wait(False), 1)
                assert ids(again) == [1] and again[0]["transactionId"] != letter["transactionId"], again
                assert (await q.ack(again[0], "failed" if group == failing else True, {"group": group}))["success"]

            letter = (await q.queue(name).dlq(failing).get())["messages"][0]
            await q.admin.delete_message(letter["partitionId"], letter["transactionId"])
            assert (await q.queue(name).dlq(failing).get())["total"] == 0, "deleted"

    run(body())


def test_late_acks_below_the_cursor(queen_url):
    """§6.21: after #2 is acked, a `failed` for #1 is refused ("committed"), a `completed` for #1 is a
    successful no-op, and #3 (still leased) acks normally."""

    async def body():
        name = unique("late-acks")
        async with client(queen_url) as q:
            await push_all(q, name, [{"id": i} for i in range(1, 4)])
            msgs = await collect(q.queue(name).batch(3).wait(False), 3)
            assert ids(msgs) == [1, 2, 3], msgs

            second = await q.ack(msgs[1])
            assert second["success"] is True, second
            assert second.get("noop") is not True, second

            late_failure = await q.ack(msgs[0], False, {"error": "x"})
            assert late_failure["success"] is False, late_failure
            assert "committed" in str(late_failure.get("error", "")).lower(), late_failure

            late_completion = await q.ack(msgs[0])
            assert late_completion["success"] is True, late_completion
            assert late_completion.get("noop") is True, late_completion

            third = await q.ack(msgs[2])
            assert third["success"] is True, third
            assert third.get("noop") is not True, third
            assert await q.queue(name).batch(10).wait(False).pop() == []

    run(body())


def test_an_ack_for_an_unknown_transaction_id_is_refused(queen_url):
    """§6.22: an ack naming a transaction id the partition does not hold fails ("unresolv...") and
    does not burn the lease: the real ack afterwards succeeds."""

    async def body():
        name = unique("ghost-ack")
        async with client(queen_url) as q:
            await push_all(q, name, [{"id": i} for i in range(1, 4)])
            msgs = await collect(q.queue(name).batch(3).wait(False), 3)
            assert ids(msgs) == [1, 2, 3], msgs
            ghost = {"transactionId": "ghost", "partitionId": msgs[0]["partitionId"], "leaseId": msgs[0]["leaseId"]}

            for status in (True, False):
                refused = await q.ack(ghost, status)
                assert refused["success"] is False, (status, refused)
                assert "unresolv" in str(refused.get("error", "")).lower(), (status, refused)

            refused = await q.ack([ghost])
            assert refused["success"] is False, refused
            assert "unresolv" in str(refused.get("error", "")).lower(), refused

            acked = await q.ack(msgs)
            assert acked["success"] is True, acked
            assert await q.queue(name).batch(10).wait(False).pop() == []

    run(body())
