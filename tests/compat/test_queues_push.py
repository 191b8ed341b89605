"""Queue management and push: configure, push answers, message fields, payloads, dedup, delete.

Conformance scenarios 1, 2, 3, 4, 8 and 37 of the client wire-protocol reference (§6).
"""

import time

import httpx
import pytest

from compat_helpers import client, collect, parse_iso, pop_retry, run, unique


def test_create_and_configure_a_queue(queen_url):
    """§6.1: create() answers configured: true, config(...).create() works, get_queue answers."""

    async def body():
        name = unique("configure")
        async with client(queen_url) as q:
            created = await q.queue(name).create()
            assert isinstance(created, dict), created
            assert created.get("configured") is True, created

            reconfigured = await q.queue(name).config({"lease_time": 5, "retry_limit": 1}).create()
            assert isinstance(reconfigured, dict), reconfigured
            assert reconfigured.get("configured") is True, reconfigured

            details = await q.admin.get_queue(name)
            assert details is not None

    run(body())


def test_an_option_the_broker_does_not_act_on_is_refused_by_name(queen_url):
    """config() passes any key through: one the broker does not act on is a 400 naming it (the
    client raises it), and the queue is neither created nor changed."""

    async def body():
        name = unique("strict-options")
        async with client(queen_url) as q:
            with pytest.raises(httpx.HTTPStatusError) as raised:
                await q.queue(name).config({"lease_time": 7, "max_partitions": 4}).create()
            assert raised.value.response.status_code == 400
            assert "options.maxPartitions is not a queue option" in str(raised.value), raised.value
            with pytest.raises(httpx.HTTPStatusError) as missing:
                await q.admin.get_queue(name)
            assert missing.value.response.status_code == 404, "the refused call created the queue"

            await q.queue(name).config({"lease_time": 7}).create()
            with pytest.raises(httpx.HTTPStatusError):
                await q.queue(name).config({"lease_time": 9, "colour": "blue"}).create()
            details = await q.admin.get_queue(name)
            assert details["options"]["leaseTime"] == 7, details
            assert "colour" not in details["options"], details

    run(body())


def test_push_answers_queued_with_message_and_transaction_ids(queen_url):
    """§6.2: one result per item, status queued, a message_id and the client's transaction id."""

    async def body():
        name = unique("push-shape")
        async with client(queen_url) as q:
            result = await q.queue(name).partition("p1").push([{"data": {"a": 1}, "transactionId": "shape-1"}])
            assert isinstance(result, list) and len(result) == 1, result
            item = result[0]
            assert item["status"] == "queued", item
            assert item.get("message_id"), item
            assert (item.get("transaction_id") or item.get("transactionId")) == "shape-1", item

            # Without a transaction id the client mints one; the answer names it.
            minted = await q.queue(name).push([{"data": {"b": 2}}, {"data": {"c": 3}}])
            assert [r["status"] for r in minted] == ["queued", "queued"], minted
            assert all(r.get("message_id") for r in minted), minted
            minted_ids = [r.get("transaction_id") or r.get("transactionId") for r in minted]
            assert all(minted_ids) and minted_ids[0] != minted_ids[1], minted
            assert minted[0]["message_id"] != minted[1]["message_id"], minted

    run(body())


def test_an_empty_push_answers_no_results(queen_url):
    """A push of no items (the JavaScript client's buffered producer flushes one when it closes)
    answers an empty list and creates nothing."""

    async def body():
        name = unique("push-empty")
        async with client(queen_url) as q:
            assert await q.queue(name).push([]) == []
            with pytest.raises(Exception):
                await q.admin.get_queue(name)

    run(body())


def test_round_trip_carries_the_message_fields(queen_url):
    """§6.3: data, transactionId, partitionId, leaseId, createdAt and partition of a popped message."""

    async def body():
        name = unique("round-trip")
        async with client(queen_url) as q:
            await q.queue(name).partition("p1").push([{"data": {"a": 1}, "transactionId": "t-1"}])
            popped = await q.queue(name).batch(1).wait(True).timeout_millis(5000).pop()
            assert len(popped) == 1, popped
            m = popped[0]
            assert m["data"] == {"a": 1}, m
            assert m["transactionId"] == "t-1", m
            assert isinstance(m.get("partitionId"), str) and m["partitionId"], m
            assert isinstance(m.get("leaseId"), str) and m["leaseId"], m
            parse_iso(m.get("createdAt"))
            assert m.get("partition") == "p1", m
            assert (await q.ack(m))["success"] is True

            # No partition named: the message lives in "Default".
            await q.queue(name).push([{"data": {"b": 2}, "transactionId": "t-2"}])
            popped = await q.queue(name).batch(1).wait(True).timeout_millis(5000).pop()
            assert len(popped) == 1, popped
            assert popped[0]["transactionId"] == "t-2", popped[0]
            assert popped[0].get("partition") == "Default", popped[0]
            assert (await q.ack(popped[0]))["success"] is True

    run(body())


PAYLOADS = {
    "null": None,
    "empty-object": {},
    "string": "just a string",
    "list": [1, "two", {"three": 3}, None, [4.5]],
    "nested": {"unicode": "grüße 🐝", "n": -12, "f": 1.25, "t": True, "nil": None, "deep": {"a": [1, {"b": []}]}},
    "megabyte": {"blob": "x" * (1024 * 1024), "tail": 42},
}


def test_payloads_come_back_exactly_as_pushed(queen_url):
    """§6.4: null, {}, a string, a list and a 1 MB object pop back equal."""

    async def body():
        name = unique("payloads")
        async with client(queen_url) as q:
            for tid, payload in PAYLOADS.items():
                result = await q.queue(name).push([{"data": payload, "transactionId": tid}])
                assert [r["status"] for r in result] == ["queued"], (tid, result)

            builder = q.queue(name).batch(len(PAYLOADS)).wait(False)
            popped = await collect(builder, len(PAYLOADS))
            by_tid = {m["transactionId"]: m for m in popped}
            assert sorted(by_tid) == sorted(PAYLOADS), [m["transactionId"] for m in popped]
            assert len(popped) == len(PAYLOADS)
            for tid, payload in PAYLOADS.items():
                assert "data" in by_tid[tid], by_tid[tid]
                assert by_tid[tid]["data"] == payload, tid
            assert by_tid["null"]["data"] is None
            assert [m["transactionId"] for m in popped] == list(PAYLOADS), "FIFO within the partition"
            assert (await q.ack(popped))["success"] is True

    run(body())


def test_a_transaction_id_is_deduplicated_per_partition(queen_url):
    """§6.8: the same id twice in one partition is a duplicate with the original message_id;
    in another partition it is a new message; only two messages are ever poppable."""

    async def body():
        name = unique("dedup")
        async with client(queen_url) as q:
            first = await q.queue(name).partition("0").push([{"data": {"n": 1}, "transactionId": "dup"}])
            second = await q.queue(name).partition("0").push([{"data": {"n": 2}, "transactionId": "dup"}])
            other = await q.queue(name).partition("1").push([{"data": {"n": 3}, "transactionId": "dup"}])
            assert first[0]["status"] == "queued", first
            assert second[0]["status"] == "duplicate", second
            assert second[0].get("message_id") == first[0]["message_id"], (first, second)
            assert other[0]["status"] == "queued", other
            assert other[0]["message_id"] != first[0]["message_id"], (first, other)

            # Within one push, a repeated id is a duplicate too.
            both = await q.queue(name).partition("2").push(
                [{"data": {"n": 4}, "transactionId": "twice"}, {"data": {"n": 5}, "transactionId": "twice"}]
            )
            assert [r["status"] for r in both] == ["queued", "duplicate"], both
            assert both[1].get("message_id") == both[0]["message_id"], both

            builder = q.queue(name).batch(10).partitions(3).wait(False)
            popped = await collect(builder, 3)
            assert sorted((m["partition"], m["transactionId"], m["data"]["n"]) for m in popped) == [
                ("0", "dup", 1),
                ("1", "dup", 3),
                ("2", "twice", 4),
            ], popped
            assert (await q.ack(popped))["success"] is True
            assert await q.queue(name).batch(10).partitions(3).wait(False).pop() == []

    run(body())


def test_deleting_a_queue_removes_it_and_a_push_recreates_it(queen_url):
    """§6.37: after delete(), get_queue raises (404); a fresh push re-creates the queue, empty."""

    async def body():
        name = unique("delete")
        async with client(queen_url) as q:
            await q.queue(name).create()
            await q.queue(name).push([{"data": {"old": True}, "transactionId": "before-delete"}])
            assert await q.admin.get_queue(name) is not None

            await q.queue(name).delete()
            with pytest.raises(httpx.HTTPStatusError) as raised:
                await q.admin.get_queue(name)
            assert raised.value.response.status_code == 404

            # Everything went with the queue, dedup memory included.
            again = await q.queue(name).push([{"data": {"new": True}, "transactionId": "before-delete"}])
            assert again[0]["status"] == "queued", again
            assert await q.admin.get_queue(name) is not None
            popped = await pop_retry(q.queue(name).batch(10).wait(False))
            assert [m["data"] for m in popped] == [{"new": True}], popped
            assert (await q.ack(popped))["success"] is True

    run(body())


def test_a_base_url_with_a_trailing_slash_works(queen_url):
    """§1.1: with one URL the client uses it verbatim, so `http://host:port/` sends `//api/v1/...`;
    push, pop and ack still work."""

    async def body():
        name = unique("trailing-slash")
        async with client(queen_url.rstrip("/") + "/") as q:
            result = await q.queue(name).push([{"data": {"v": 1}, "transactionId": "slash"}])
            assert [r["status"] for r in result] == ["queued"], result
            popped = await pop_retry(q.queue(name).batch(1).wait(False))
            assert [m["transactionId"] for m in popped] == ["slash"], popped
            assert (await q.ack(popped[0]))["success"] is True
            assert (await q.renew("no-such-lease"))["success"] is False

    run(body())


def test_get_queue_of_an_unknown_queue_raises_404(queen_url):
    """admin.get_queue on a name that was never created answers 404, which the client raises."""

    async def body():
        async with client(queen_url) as q:
            with pytest.raises(httpx.HTTPStatusError) as raised:
                await q.admin.get_queue(unique("never-created"))
            assert raised.value.response.status_code == 404

    run(body())


def test_a_delayed_message_is_served_only_after_its_delay(queen_url):
    """§6.36: config({"delayed_processing": 1}); an immediate pop gets nothing; a waiting pop gets
    the message once it is a second old, without another push."""

    async def body():
        name = unique("delayed")
        async with client(queen_url) as q:
            await q.queue(name).config({"delayed_processing": 1}).create()
            pushed_at = time.monotonic()
            await q.queue(name).push([{"data": {"late": True}}])
            assert await q.queue(name).batch(1).wait(False).pop() == []
            messages = await q.queue(name).batch(1).wait(True).timeout_millis(8000).pop()
            waited = time.monotonic() - pushed_at
            assert [m["data"] for m in messages] == [{"late": True}], messages
            assert 0.9 <= waited < 6, f"served {waited:.2f} s after the push"

    run(body())


def test_an_encrypted_queue_gives_its_messages_back_as_pushed(queen_url):
    """encryptionEnabled (the broker under test runs with an encryption key): configure echoes the
    option, and the messages of the encrypted queue pop, read and dead-letter as pushed."""

    async def body():
        name = unique("encrypted")
        async with client(queen_url) as q:
            created = await q.queue(name).config({"encryption_enabled": True, "retry_limit": 0}).create()
            assert created["options"]["encryptionEnabled"] is True, created
            await q.queue(name).push([{"data": {"card": "4111 1111"}, "transactionId": "enc-1"}, {"data": None}])
            messages = await pop_retry(q.queue(name).batch(10).wait(False))
            assert [m["data"] for m in messages] == [{"card": "4111 1111"}, None], messages
            detail = await q.admin.get_message(messages[0]["partitionId"], "enc-1")
            assert detail["data"] == {"card": "4111 1111"}, detail
            failed = await q.ack(messages[0], False, {"error": "declined"})
            assert failed["success"] is True, failed
            letters = await q.queue(name).dlq().limit(10).get()
            assert [m["data"] for m in letters["messages"]] == [{"card": "4111 1111"}], letters

    run(body())


def test_admin_lists_the_namespaces_and_tasks_queues_carry(queen_url):
    """§2.6: admin.get_namespaces() and admin.get_tasks() answer, each naming what a dotted queue
    name carries, with its queues counted."""

    async def body():
        namespace, task = unique("ns"), unique("task")
        async with client(queen_url) as q:
            await q.queue(f"{namespace}.{task}").push([{"data": {"n": 1}}, {"data": {"n": 2}}])
            await q.queue(f"{namespace}.other").create()

            namespaces = (await q.admin.get_namespaces())["namespaces"]
            ours = [n for n in namespaces if n["namespace"] == namespace]
            assert len(ours) == 1, namespaces
            assert ours[0]["queues"] == 2 and ours[0]["messages"]["pushed"] == 2, ours

            tasks = (await q.admin.get_tasks())["tasks"]
            assert [t["queues"] for t in tasks if t["task"] == task] == [1], tasks

    run(body())
