"""Trace events through the client: the `trace(...)` the consume loop attaches to each message, and
the admin reads by message, by name and of the names in use.

Conformance scenario 38 of the client wire-protocol reference (§6), with every form of trace name.
"""

import asyncio

from compat_helpers import client, push_all, run, unique

CONSUME_DEADLINE = 30.0


def test_events_recorded_while_consuming_are_read_by_message_and_by_name(queen_url):
    """An each() consume traces its messages with one name, a list of names, no name and a custom
    event type; the message's events come back oldest first, a name's newest first (paged), and
    the names in use list them."""

    async def body():
        name, group, tenant, order = unique("traces"), unique("g"), unique("tenant"), unique("order")
        results, consumed = [], []

        async def handler(message):
            consumed.append(message)
            trace = message["trace"]
            if message["data"]["id"] == 0:
                results.append(await trace({"traceName": tenant, "data": {"step": "received"}}))
                results.append(await trace({"traceName": [tenant, order], "eventType": "step", "data": {"step": "charged"}}))
                results.append(await trace({"data": {"step": "unnamed"}}))
                results.append(await trace({"traceName": order, "eventType": "error", "data": {"step": "failed"}}))
            else:
                results.append(await trace({"traceName": [tenant], "data": {"step": "second"}}))

        async with client(queen_url) as q:
            await push_all(q, name, [{"id": 0}, {"id": 1}])
            builder = q.queue(name).group(group).subscription_mode("all").batch(1).wait(False).limit(2).each()
            await asyncio.wait_for(builder.consume(handler), CONSUME_DEADLINE)
            assert [r["success"] for r in results] == [True] * 5, results

            first = next(m for m in consumed if m["data"]["id"] == 0)
            by_message = await q.admin.get_traces_for_message(first["partitionId"], first["transactionId"])
            events = by_message["traces"]
            assert [e["data"]["step"] for e in events] == ["received", "charged", "unnamed", "failed"], by_message
            assert [e["eventType"] for e in events] == ["info", "step", "info", "error"]
            assert [e["traceNames"] for e in events] == [[tenant], [tenant, order], [], [order]]
            assert {e["consumerGroup"] for e in events} == {group}
            assert {e["transactionId"] for e in events} == {first["transactionId"]}
            assert {e["queue"] for e in events} == {name}
            assert by_message["total"] == 4

            by_tenant = await q.admin.get_traces_by_name(tenant)
            assert [e["data"]["step"] for e in by_tenant["traces"]] == ["second", "charged", "received"], by_tenant
            assert by_tenant["total"] == 3
            page = await q.admin.get_traces_by_name(tenant, limit=1, offset=1)
            assert [e["data"]["step"] for e in page["traces"]] == ["charged"], page
            assert (page["total"], page["limit"], page["offset"]) == (3, 1, 1)
            by_order = await q.admin.get_traces_by_name(order)
            assert [e["data"]["step"] for e in by_order["traces"]] == ["failed", "charged"], by_order

            names = await q.admin.get_trace_names(search=tenant)
            assert [(n["name"], n["events"]) for n in names["names"]] == [(tenant, 3)], names
            everything = await q.admin.get_trace_names(limit=1000)
            listed = [n["name"] for n in everything["names"]]
            assert tenant in listed and order in listed, everything
            assert listed == sorted(listed), "in name order"

    run(body())


def test_a_queue_mode_trace_and_a_refused_trace(queen_url):
    """A queue-mode consume records its events under `__QUEUE_MODE__`; an event the broker refuses
    (a name past 255 bytes) comes back as `success: False` with the broker's reason, and an event
    without data is refused by the client itself; neither stops the consume."""

    async def body():
        name, label = unique("traces-qm"), unique("label")
        results, consumed = [], []

        async def handler(message):
            consumed.append(message)
            results.append(await message["trace"]({"traceName": label, "eventType": "audit", "data": {"ok": True}}))
            results.append(await message["trace"]({"traceName": "x" * 256, "data": {"ok": False}}))
            results.append(await message["trace"]({"traceName": label}))

        async with client(queen_url) as q:
            await push_all(q, name, [{"id": 0}])
            await asyncio.wait_for(q.queue(name).batch(1).wait(False).limit(1).each().consume(handler), CONSUME_DEADLINE)
            assert results[0]["success"] is True, results
            assert results[1]["success"] is False and "256 bytes" in results[1]["error"], results
            assert results[2]["success"] is False and "data" in results[2]["error"], results

            events = (await q.admin.get_traces_by_name(label))["traces"]
            assert [(e["consumerGroup"], e["eventType"], e["data"]) for e in events] == [
                ("__QUEUE_MODE__", "audit", {"ok": True})
            ], events
            assert events[0]["partitionId"] == consumed[0]["partitionId"]

    run(body())
