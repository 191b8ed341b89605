"""Binary push bodies (§3.1 and §3.2 of the wire-protocol reference): a client built with
`binary_push=True` sends its pushes as QPB1 (plain items), and with `push_compression=True` too as
QPB1 frames groups it compressed itself, and its transactions that push as QTB1. What arrives must
be what was pushed, duplicates must be answered `duplicate`, and a transaction's acks, pushes and
riders must commit together.

A recording transport shows that the bodies really went out binary (the client falls back to JSON
for items it cannot carry).
"""

import httpx
import pytest

from compat_helpers import client, collect, pop_retry, run, unique

BINARY = "application/x-queen-push"

FORMS = [
    pytest.param({"binary_push": True}, id="plain"),
    pytest.param({"binary_push": True, "push_compression": True}, id="compressed"),
]


class Recording(httpx.AsyncHTTPTransport):
    """A real transport that notes the path and content type of every request it sends."""

    def __init__(self):
        super().__init__()
        self.sent = []

    async def handle_async_request(self, request):
        self.sent.append((request.url.path, request.headers.get("content-type")))
        return await super().handle_async_request(request)

    def binary(self, path):
        return [kind for sent, kind in self.sent if sent == path and kind == BINARY]


@pytest.mark.parametrize("form", FORMS)
def test_binary_pushes_arrive_as_pushed_and_repeats_are_duplicates(queen_url, form):
    """Items of two partitions, with and without transaction ids, pushed binary: one result per
    item, in order; popped with their data and transaction ids; pushed again, the items that carry
    a transaction id are duplicates answered with the original message ids."""

    async def body():
        name = unique("binary")
        recording = Recording()
        async with client(queen_url, transport=recording, **form) as q:
            items = [
                {"data": {"n": 1, "text": "é"}, "transactionId": "b-1"},
                {"data": [1, 2, None]},
                {"data": "three", "transactionId": "b-3"},
            ]
            first = await q.queue(name).partition("p1").push(items)
            assert [r["status"] for r in first] == ["queued"] * 3, first
            minted = first[1]["transaction_id"]
            assert minted and minted not in ("b-1", "b-3"), first
            other = await q.queue(name).partition("p2").push([{"data": 4, "transactionId": "b-4"}])
            assert [r["status"] for r in other] == ["queued"], other
            assert len(recording.binary("/api/v1/push")) == 2, recording.sent

            got = await pop_retry(q.queue(name).partition("p1").batch(10).wait(False))
            assert [m["data"] for m in got] == [{"n": 1, "text": "é"}, [1, 2, None], "three"], got
            assert [m["transactionId"] for m in got] == ["b-1", minted, "b-3"], got
            assert [m["id"] for m in got] == [r["message_id"] for r in first], got
            got = await pop_retry(q.queue(name).partition("p2").batch(10).wait(False))
            assert [(m["data"], m["transactionId"]) for m in got] == [(4, "b-4")], got

            again = await q.queue(name).partition("p1").push([items[0], items[2]])
            assert [r["status"] for r in again] == ["duplicate", "duplicate"], again
            assert [r["message_id"] for r in again] == [first[0]["message_id"], first[2]["message_id"]]

    run(body())


@pytest.mark.parametrize("form", FORMS)
def test_a_consumer_receives_every_binary_pushed_message(queen_url, form):
    """A batch pushed in one binary request is consumed whole, in order, and acknowledged."""

    async def body():
        name, group = unique("binary-consume"), unique("g")
        async with client(queen_url, **form) as q:
            result = await q.queue(name).push([{"data": {"id": i}} for i in range(50)])
            assert [r["status"] for r in result] == ["queued"] * 50, result
            got = await collect(q.queue(name).group(group).batch(100).wait(False), 50)
            assert [m["data"]["id"] for m in got] == list(range(50)), got
            await q.ack(got, True, {"group": group})
            assert await q.queue(name).group(group).batch(10).wait(False).pop() == []

    run(body())


def test_a_compressed_transaction_acks_pushes_and_writes_its_kv_rider_together(queen_url):
    """With push_compression, a bundle that pushes goes out as QTB1: its pushes as frames groups,
    its acks and kv rider in the JSON head. It commits whole, and the client gets its results back
    in the order it added the operations. A second bundle pushing the same transaction id is
    answered `duplicate`."""

    async def body():
        source, target, ns = unique("qtb-a"), unique("qtb-b"), unique("qtb-kv")
        recording = Recording()
        async with client(queen_url, transport=recording, binary_push=True, push_compression=True) as q:
            await q.queue(source).push([{"data": {"v": 1}}, {"data": {"v": 2}}])
            popped = await pop_retry(q.queue(source).batch(2).wait(False))
            assert len(popped) == 2, popped

            bundle = q.transaction().kv.put(ns, "step", {"done": 1}, forever=True)
            bundle = bundle.queue(target).push([{"data": {"v": 10}, "transactionId": "t-10"}])
            bundle = bundle.ack(popped[0]).queue(target).partition("other").push([{"data": {"v": 11}}])
            result = await bundle.commit()
            assert result["success"] is True, result
            assert recording.binary("/api/v1/transaction"), recording.sent
            results = result["results"]
            # The caller's order: the push, the ack, the second push; then the kv rider.
            assert results[0]["status"] == "queued" and results[0]["transaction_id"] == "t-10", results
            assert results[1]["transactionId"] == popped[0]["transactionId"] and results[1]["success"], results
            assert results[2]["status"] == "queued", results
            assert [r.get("index") for r in results[:3]] == [0, 1, 2], results
            assert len(results) == 4, results

            moved = await pop_retry(q.queue(target).partition("Default").batch(10).wait(False))
            assert [(m["data"], m["transactionId"]) for m in moved] == [({"v": 10}, "t-10")], moved
            assert moved[0]["id"] == results[0]["message_id"], (moved, results)
            other = await pop_retry(q.queue(target).partition("other").batch(10).wait(False))
            assert [m["data"] for m in other] == [{"v": 11}], other
            state = await q.kv.get(ns, "step")
            assert state["found"] and state["value"] == {"done": 1}, state

            repeat = q.transaction().ack(popped[1]).queue(target).push([{"data": {"v": 12}, "transactionId": "t-10"}])
            repeat = await repeat.commit()
            assert repeat["success"] is True, repeat
            assert repeat["results"][1]["status"] == "duplicate", repeat
            assert repeat["results"][1]["message_id"] == results[0]["message_id"], repeat
            assert await q.queue(source).batch(10).wait(False).pop() == [], "both acks committed"

    run(body())


def test_a_compressed_transaction_under_a_lost_lease_writes_nothing(queen_url):
    """A QTB1 bundle whose ack is refused is refused whole: its frames groups are not written."""

    async def body():
        source, target = unique("qtb-lost"), unique("qtb-never")
        async with client(queen_url, binary_push=True, push_compression=True) as q:
            await q.queue(source).push([{"data": 1}])
            popped = await pop_retry(q.queue(source).batch(1).wait(False))
            assert len(popped) == 1, popped
            stale = dict(popped[0], leaseId="00000000-0000-7000-8000-000000000000")
            with pytest.raises(Exception) as refused:
                await q.transaction().ack(stale).queue(target).push([{"data": 2}]).commit()
            assert "rolled back" in str(refused.value), refused.value
            assert await q.queue(target).batch(10).wait(False).pop() == []

    run(body())
