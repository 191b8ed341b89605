"""Framed pops (§3.3 of the wire-protocol reference): a client built with `framed_pop=True` asks
every pop for the QPF1 answer and unpacks it itself; what it hands out must be what was pushed,
and its acks, consume loop and conflation echo must work as with JSON answers.

The client's unpacked messages carry no `queue` key (the JSON answer's do) and a `createdAt`
with milliseconds: that is how these tests see the answer really was framed.
"""

import uuid

from compat_helpers import client, ids, parse_iso, push_all, run, unique


def framed(q_url):
    return client(q_url, framed_pop=True)


def assert_framed(messages):
    assert messages, "no messages"
    for message in messages:
        assert "queue" not in message, f"a JSON answer, not a framed one: {message}"
        assert len(message["createdAt"]) == len("2026-01-01T00:00:00.000Z"), message


def test_what_a_framed_pop_hands_out_is_what_was_pushed_and_its_acks_commit(queen_url):
    """Three partitions, trace ids on some messages: one multi-partition framed pop returns every
    message with its data, transaction id, partition and trace id; acked, nothing is left."""

    async def body():
        name, group = unique("framed"), unique("g")
        pushed = {}
        async with framed(queen_url) as q:
            for partition in ("p0", "p1", "p2"):
                items = []
                for i in range(4):
                    item = {"data": {"p": partition, "i": i, "text": "grüße"}, "transactionId": f"{partition}-{i}"}
                    if i % 2 == 0:
                        item["traceId"] = str(uuid.uuid4())
                    items.append(item)
                result = await q.queue(name).partition(partition).push(items)
                assert [r.get("status") for r in result] == ["queued"] * 4, result
                for item in items:
                    pushed[item["transactionId"]] = (item["data"], partition, item.get("traceId"))

            pop = q.queue(name).group(group).subscription_mode("all").partitions(3).batch(100).wait(False)
            messages = await pop.pop()
            assert_framed(messages)
            got = {m["transactionId"]: (m["data"], m["partition"], m["traceId"]) for m in messages}
            assert got == pushed
            assert len(messages) == 12
            assert len({m["leaseId"] for m in messages}) == 1, "one lease for the claimed partitions"
            for partition in ("p0", "p1", "p2"):
                mine = [m for m in messages if m["partition"] == partition]
                assert [m["data"]["i"] for m in mine] == [0, 1, 2, 3], "in order within a partition"
                assert [m["offset"] for m in mine] == [1, 2, 3, 4]

            ack = await q.ack(messages, True, {"group": group})
            assert ack["success"] is True, ack
            assert await pop.pop() == []

    run(body())


def test_framed_and_json_answers_agree(queen_url):
    """The same messages popped by two groups, one client framed and one not: the same ids,
    transaction ids, partitions and partition ids, offsets, delivery attempts and times (to the
    millisecond the framed answer carries)."""

    async def body():
        name = unique("framed-json")
        async with framed(queen_url) as f, client(queen_url) as j:
            await push_all(j, name, [{"id": i} for i in range(5)], partition="p")
            await push_all(j, name, [{"id": i} for i in range(5, 8)], partition="p")
            framed_messages = await f.queue(name).group(unique("f")).subscription_mode("all").batch(10).wait(False).pop()
            json_messages = await j.queue(name).group(unique("j")).subscription_mode("all").batch(10).wait(False).pop()
            assert_framed(framed_messages)
            assert ids(framed_messages) == ids(json_messages) == list(range(8))
            for a, b in zip(framed_messages, json_messages):
                for key in ("id", "transactionId", "partition", "partitionId", "offset", "deliveryAttempt", "traceId"):
                    assert a[key] == b[key], (key, a, b)
                at, bt = parse_iso(a["createdAt"]), parse_iso(b["createdAt"])
                assert at == bt.replace(microsecond=bt.microsecond // 1000 * 1000), (a, b)

    run(body())


def test_a_framed_consume_loop_handles_and_acks_every_message(queen_url):
    """consume() with each(): every message handled once, in order per partition, acked (nothing
    left afterwards)."""

    async def body():
        name, group = unique("framed-consume"), unique("g")
        handled = []

        async def handler(message):
            handled.append(message)

        async with framed(queen_url) as q:
            for partition in ("a", "b"):
                await push_all(q, name, [{"id": f"{partition}{i}"} for i in range(6)], partition=partition)
            consumer = (
                q.queue(name).group(group).subscription_mode("all").batch(4).wait(False).limit(12).each()
            )
            await consumer.consume(handler)
            assert_framed(handled)
            for partition in ("a", "b"):
                assert [m["data"]["id"] for m in handled if m["partition"] == partition] == [
                    f"{partition}{i}" for i in range(6)
                ]
            assert len(handled) == 12
            rest = await q.queue(name).group(group).batch(100).wait(False).pop()
            assert rest == [], rest

    run(body())


def test_a_framed_conflating_pop_gets_the_newest_and_the_echo(queen_url):
    """Conflation through the framed answer: the echo comes in its JSON part (the client would
    raise ConflationUnsupportedError without it), the empty answer after the ack is [] too."""

    async def body():
        name, group = unique("framed-conflation"), unique("latest")
        async with framed(queen_url) as q:
            await push_all(q, name, [{"id": i} for i in range(10)], partition="p")
            pop = q.queue(name).group(group).conflation().subscription_mode("all").batch(10).wait(False)
            newest = await pop.pop()
            assert_framed(newest)
            assert ids(newest) == [9], newest
            ack = await q.ack(newest, True, {"group": group})
            assert ack["success"] is True, ack
            assert await pop.pop() == []

    run(body())


def test_a_framed_commit_on_delivery_pop_has_no_lease(queen_url):
    """commit_on_delivery (autoAck): the framed messages carry an empty lease id and are consumed
    as they are handed out."""

    async def body():
        name = unique("framed-auto-ack")
        async with framed(queen_url) as q:
            await push_all(q, name, [{"id": i} for i in range(3)], partition="p")
            messages = await q.queue(name).commit_on_delivery().batch(10).wait(False).pop()
            assert_framed(messages)
            assert ids(messages) == [0, 1, 2]
            assert {m["leaseId"] for m in messages} == {""}
            assert await q.queue(name).batch(10).wait(False).pop() == []

    run(body())


def test_a_framed_pop_of_most_of_a_segment_hands_out_only_its_span(queen_url):
    """Ten messages pushed at once are one stored segment. A pop of six gets the segment as
    stored, all ten frames (codec 1), and the client must keep only the six of its span; the
    next pop, after the ack, gets the other four."""

    async def body():
        name, group = unique("framed-span"), unique("g")
        async with framed(queen_url) as q:
            await push_all(q, name, [{"id": i} for i in range(10)], partition="p")
            pop = q.queue(name).group(group).subscription_mode("all").wait(False)
            first = await pop.batch(6).pop()
            assert_framed(first)
            assert ids(first) == [0, 1, 2, 3, 4, 5]
            ack = await q.ack(first, True, {"group": group})
            assert ack["success"] is True, ack
            rest = await pop.batch(10).pop()
            assert_framed(rest)
            assert ids(rest) == [6, 7, 8, 9]
            assert [m["offset"] for m in rest] == [7, 8, 9, 10]

    run(body())
