"""Timers through the client: `client.timers`, the `timer(q)` builder and the transaction rider.

Wire reference §2.10 and the `timers` rider of §2.3; the conformance follow-up of §6
(`timers.schedule(delay_ms=500)` → a message with `transactionId == txn` after ≥ 0.5 s).
"""

import asyncio
import time
import uuid
from datetime import timedelta

import pytest
from queen.errors import TimerError

from compat_helpers import client, pop_retry, push_all, run, unique

# Longest a test waits for a timer to be delivered.
DELIVERY_DEADLINE = 15.0


async def delivered(q, queue, within=DELIVERY_DEADLINE, partition=None):
    """Pops `queue` (without waiting) every 50 ms until messages arrive; [] after `within` seconds.

    The pops commit at delivery: a lease left on the partition would hold back a timer fired
    after the first pop until the lease ran out."""
    builder = q.queue(queue).batch(100).wait(False).commit_on_delivery()
    if partition is not None:
        builder = builder.partition(partition)
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        messages = await builder.pop()
        if messages:
            return messages
        await asyncio.sleep(0.05)
    return []


def test_a_scheduled_timer_pops_with_its_txn_after_its_delay_and_not_before(queen_url):
    async def body():
        name = unique("timer-delay")
        async with client(queen_url) as q:
            started = time.monotonic()
            result = await q.timers.schedule(name, "reminder", {"v": 1}, delay_ms=500)
            assert result and result["ok"] is True and result["status"] == "scheduled", result
            assert (result["queue"], result["timerKey"]) == (name, "reminder"), result
            assert result["txn"] and result["messageId"] and result["deliverAt"], result
            assert await q.queue(name).batch(10).wait(False).pop() == [], "not before its delay"

            messages = await delivered(q, name)
            elapsed = time.monotonic() - started
            assert len(messages) == 1, messages
            assert elapsed >= 0.5, f"delivered after {elapsed:.3f} s"
            message = messages[0]
            assert message["transactionId"] == result["txn"], message
            assert message["id"] == result["messageId"], message
            assert message["data"] == {"v": 1}, message
            assert (await q.timers.peek(name, "reminder")) == {"found": False}

    run(body())


def test_the_timer_builder_schedules_reschedules_and_cancels(queen_url):
    async def body():
        name = unique("timer-builder")
        async with client(queen_url) as q:
            txn = str(uuid.uuid4())
            builder = q.timer(name).key("order:1:expire").payload({"order": 1}).after(timedelta(minutes=30)).txn(txn)
            scheduled = await builder.schedule()
            assert scheduled["status"] == "scheduled" and scheduled["txn"] == txn, scheduled

            moved = await q.timer(name).key("order:1:expire").payload({"order": 1}).after_ms(0).txn(txn).partition("p2").reschedule()
            assert moved["status"] == "rescheduled", moved
            assert moved["messageId"] == scheduled["messageId"], "the same txn keeps its promised message id"
            messages = await delivered(q, name, partition="p2")
            assert [(m["transactionId"], m["partition"], m["data"]) for m in messages] == [(txn, "p2", {"order": 1})]

            await q.timer(name).key("later").payload("soon").after_ms(60_000).schedule()
            cancelled = await q.timer(name).key("later").cancel()
            assert cancelled and cancelled["status"] == "cancelled", cancelled
            again = await q.timer(name).key("later").cancel()
            assert not again and again["status"] == "absent", again

    run(body())


def test_a_batch_is_index_aligned_and_takes_cancels(queen_url):
    async def body():
        name = unique("timer-batch")
        async with client(queen_url) as q:
            op = q.timers.op
            first = await q.timers.batch(
                [
                    op.schedule(name, "a", {"n": 1}, delay_ms=60_000),
                    op.schedule(name, "b", {"n": 2}, delay_ms=60_000),
                    op.cancel(name, "never-scheduled"),
                ]
            )
            assert [r["status"] for r in first] == ["scheduled", "scheduled", "absent"], first
            assert [r["timerKey"] for r in first] == ["a", "b", "never-scheduled"], first

            second = await q.timers.batch(
                [op.cancel(name, "b"), op.schedule(name, "a", {"n": 3}, delay_ms=0, reschedule=True)]
            )
            assert [r["status"] for r in second] == ["cancelled", "rescheduled"], second
            messages = await delivered(q, name)
            assert [m["data"] for m in messages] == [{"n": 3}], messages
            assert await q.timers.batch([]) == [], "an empty batch is not sent"

    run(body())


def test_cancel_with_a_txn_cancels_only_that_timer_and_echoes_it(queen_url):
    async def body():
        name = unique("timer-cancel")
        async with client(queen_url) as q:
            scheduled = await q.timers.schedule(name, "k", 1, delay_ms=60_000)
            other = await q.timers.cancel(name, "k", txn="not-this-one")
            assert not other and other["status"] == "absent" and other["txn"] == "not-this-one", other
            assert (await q.timers.peek(name, "k"))["found"] is True, "left alone"

            cancelled = await q.timers.cancel(name, "k", txn=scheduled["txn"])
            assert cancelled["status"] == "cancelled" and cancelled["txn"] == scheduled["txn"], cancelled

            await q.timers.schedule(name, "k", 2, delay_ms=60_000)
            assert (await q.timers.cancel(name, "k"))["status"] == "cancelled"

            # A fired timer is absent: its txn tells the caller where to look.
            fired = await q.timers.schedule(name, "fires", 3, delay_ms=0)
            assert [m["transactionId"] for m in await delivered(q, name)] == [fired["txn"]]
            late = await q.timers.cancel(name, "fires", txn=fired["txn"])
            assert late["status"] == "absent" and late["txn"] == fired["txn"], late

    run(body())


def test_peek_answers_the_stored_timer_or_found_false(queen_url):
    async def body():
        name = unique("timer-peek")
        async with client(queen_url) as q:
            scheduled = await q.timers.schedule(name, "tenant/7/expire", {"x": [1, 2]}, delay_ms=60_000, partition="p")
            peeked = await q.timers.peek(name, "tenant/7/expire")
            assert peeked and peeked["found"] is True, peeked
            assert peeked["timerKey"] == "tenant/7/expire" and peeked["partition"] == "p", peeked
            assert peeked["txn"] == scheduled["txn"] and peeked["messageId"] == scheduled["messageId"], peeked
            assert peeked["encrypted"] is False and peeked["state"] == "pending", peeked

            missing = await q.timers.peek(name, "nothing/here")
            assert not missing and missing == {"found": False}, missing

    run(body())


def test_list_pages_through_a_queues_timers_in_key_order(queen_url):
    async def body():
        name = unique("timer-list")
        async with client(queen_url) as q:
            keys = ["e", "a", "d", "b", "c"]
            await q.timers.batch([q.timers.op.schedule(name, k, k, delay_ms=60_000) for k in keys])
            page = await q.timers.list(name, limit=2)
            assert [r["timerKey"] for r in page["rows"]] == ["a", "b"], page
            assert page["truncated"] is True and page["nextAfter"] == "b", page
            rest = await q.timers.list(name, after="b")
            assert [r["timerKey"] for r in rest["rows"]] == ["c", "d", "e"] and rest["truncated"] is False, rest
            assert [r["timerKey"] for r in await q.timers.list_all(name, limit=2)] == sorted(keys)
            assert (await q.timers.list(unique("timer-none")))["rows"] == []

    run(body())


def test_payloads_are_the_json_of_the_value_and_bad_ones_are_refused(queen_url):
    async def body():
        name = unique("timer-payloads")
        async with client(queen_url) as q:
            await q.timers.schedule(name, "text", "hello", delay_ms=0, txn="text-txn")
            await q.timers.schedule(name, "raw", b'{"pre": "encoded"}', delay_ms=0, txn="raw-txn")
            messages = []
            deadline = time.monotonic() + DELIVERY_DEADLINE
            while len(messages) < 2 and time.monotonic() < deadline:
                messages += await delivered(q, name, within=1.0)
            data = {m["transactionId"]: m["data"] for m in messages}
            assert data == {"text-txn": "hello", "raw-txn": {"pre": "encoded"}}, data

            with pytest.raises(TimerError) as refused:
                await q.timers.schedule(name, "bad", b"not json", delay_ms=0)
            assert refused.value.response.status_code == 400
            assert "payload" in str(refused.value)
            assert (await q.timers.peek(name, "bad")) == {"found": False}

    run(body())


def test_a_transaction_schedules_and_cancels_timers_with_its_ack(queen_url):
    async def body():
        source, target = unique("timer-tx-src"), unique("timer-tx-dst")
        async with client(queen_url) as q:
            await push_all(q, source, [{"step": 1}])
            popped = await pop_retry(q.queue(source).batch(1).wait(False))
            assert len(popped) == 1, popped
            await q.timers.schedule(target, "stale", "old", delay_ms=60_000)

            tx = q.transaction().ack(popped[0])
            tx = tx.timer(target).key("follow-up").payload({"step": 2}).after_ms(0).txn("follow-up-txn").schedule()
            tx = tx.timer(target).key("stale").cancel()
            result = await tx.commit()
            assert result["success"] is True, result
            statuses = [r.get("status") for r in result["results"]]
            assert statuses[-2:] == ["scheduled", "cancelled"], result["results"]

            assert await q.queue(source).batch(10).wait(False).pop() == [], "the ack committed"
            messages = await delivered(q, target)
            assert [(m["transactionId"], m["data"]) for m in messages] == [("follow-up-txn", {"step": 2})]
            assert (await q.timers.peek(target, "stale")) == {"found": False}

    run(body())


def test_a_rolled_back_transaction_schedules_no_timer(queen_url):
    async def body():
        source, target = unique("timer-rb-src"), unique("timer-rb-dst")
        async with client(queen_url) as q:
            await push_all(q, source, [{"step": 1}])
            popped = await pop_retry(q.queue(source).batch(1).wait(False))
            # An ack under a lease nobody holds: the broker refuses the bundle whole.
            forged = dict(popped[0], leaseId=str(uuid.uuid4()))
            tx = q.transaction().ack(forged).timer(target).key("k").payload("never").after_ms(0).schedule()
            with pytest.raises(Exception) as failed:
                await tx.commit()
            assert "rolled back" in str(failed.value)
            assert (await q.timers.peek(target, "k")) == {"found": False}
            assert await q.queue(target).batch(10).wait(False).pop() == []

    run(body())
