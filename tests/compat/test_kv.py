"""Key/value state through the client: `client.kv.*`, the transaction `kv` rider, and the status
documents a consume with `.supervision(...)` publishes (§2.8, §2.3, §4.9 of the client wire-protocol
reference).
"""

import asyncio
import base64
import json
import time
from datetime import datetime, timedelta, timezone

import pytest
from queen import KvError

from compat_helpers import client, parse_iso, pop_retry, push_all, run, unique


async def until(condition, within=5.0, delay=0.05):
    """Awaits `condition()` until it is truthy, failing after `within` seconds."""
    deadline = time.monotonic() + within
    while not await condition():
        assert time.monotonic() < deadline, f"not within {within}s"
        await asyncio.sleep(delay)


def test_get_put_and_delete_with_versions(queen_url):
    """put with forever / ttl_seconds / ttl / until; get; compare-and-set with expect; delete with
    and without expect; a verdict's truthiness is `applied` / `found`."""

    async def body():
        ns = unique("kv")
        async with client(queen_url) as q:
            kv = q.kv
            missing = await kv.get(ns, "k")
            assert not missing and missing["found"] is False, missing
            first = await kv.put(ns, "k", {"n": 1}, forever=True)
            assert first and first["applied"] is True and first["version"] == 1, first
            assert first["expiresAt"] is None
            got = await kv.get(ns, "k")
            assert got and (got["value"], got["version"]) == ({"n": 1}, 1), got
            parse_iso(got["updatedAt"])

            lease = await kv.put(ns, "lease", "x", ttl_seconds=30)
            expires = parse_iso(lease["expiresAt"]) - datetime.now(timezone.utc)
            assert timedelta(seconds=20) < expires <= timedelta(seconds=31), lease
            assert (await kv.put(ns, "t1", 1, ttl=timedelta(minutes=2)))["applied"] is True
            until_result = await kv.put(ns, "t2", 1, until=datetime.now(timezone.utc) + timedelta(hours=1))
            assert timedelta(minutes=59) < parse_iso(until_result["expiresAt"]) - datetime.now(timezone.utc)

            moved = await kv.put(ns, "k", {"n": 2}, forever=True, expect=1)
            assert moved["applied"] is True and moved["version"] == 2, moved
            stale = await kv.put(ns, "k", {"n": 3}, forever=True, expect=1)
            assert not stale and stale["reason"] == "version", stale
            assert (stale["value"], stale["version"]) == ({"n": 2}, 2), "the loser sees the winner"
            never = await kv.put(ns, "nothing", 1, forever=True, expect=5)
            assert never["reason"] == "absent" and not await kv.get(ns, "nothing"), "expect above 0 creates nothing"
            fresh = await kv.put(ns, "new", 1, forever=True, expect=0)
            assert fresh["applied"] is True, fresh

            refused = await kv.delete(ns, "k", expect=1)
            assert refused["reason"] == "version", refused
            deleted = await kv.delete(ns, "k", expect=2)
            assert deleted and deleted["applied"] is True, deleted
            again = await kv.delete(ns, "k")
            assert not again and again["reason"] == "absent", "deleting nothing is a verdict, HTTP 200"
            revived = await kv.put(ns, "k", "back", forever=True)
            assert revived["version"] == 3, "a key written again goes on from its last version"

            nulled = await kv.put(ns, "null", None, forever=True)
            assert nulled["applied"] is True
            found_null = await kv.get(ns, "null")
            assert found_null["found"] is True and found_null["value"] is None, "found with a null value"

    run(body())


def test_put_if_absent_once_and_check(queen_url):
    """put_if_absent applies once; once() is its boolean; check() judges a version or absence and
    writes nothing."""

    async def body():
        ns = unique("kv-once")
        async with client(queen_url) as q:
            kv = q.kv
            won = await kv.put_if_absent(ns, "marker", {"by": "first"}, ttl_seconds=60)
            lost = await kv.put_if_absent(ns, "marker", {"by": "second"}, ttl_seconds=60)
            assert won["applied"] is True and lost["applied"] is False, (won, lost)
            assert lost["reason"] == "exists" and lost["value"] == {"by": "first"}, lost
            assert await kv.once(ns, "gate", forever=True) is True
            assert await kv.once(ns, "gate", forever=True) is False

            held = await kv.check(ns, "marker", expect=won["version"])
            assert held and held["applied"] is True, held
            moved = await kv.check(ns, "marker", expect=won["version"] + 1)
            assert not moved and moved["reason"] == "version", moved
            assert (await kv.check(ns, "marker", expect=0))["reason"] == "exists"
            absent = await kv.check(ns, "never", expect=0)
            assert absent["applied"] is True, "expect=0 holds for a missing key"
            assert (await kv.check(ns, "never", expect=1))["reason"] == "absent"
            assert not await kv.get(ns, "never"), "a check writes nothing"

            # Concurrent claims of one key: exactly one wins.
            claims = await asyncio.gather(*(kv.once(ns, "race", ttl_seconds=60, value=i) for i in range(12)))
            assert claims.count(True) == 1, claims

    run(body())


def test_incr_with_bounds_and_a_window(queen_url):
    """incr counts from 0, refuses (not saturates) past max/min, keeps a live counter's expiry, and
    refuses a value that is not an integer."""

    async def body():
        ns = unique("kv-incr")
        async with client(queen_url) as q:
            kv = q.kv
            first = await kv.incr(ns, "quota", delta=3, max=5, ttl_seconds=3600)
            assert first and (first["value"], first["version"]) == (3, 1), first
            second = await kv.incr(ns, "quota", delta=2, max=5, ttl_seconds=5)
            assert second["value"] == 5 and second["expiresAt"] == first["expiresAt"], "TTL only on creation"
            refused = await kv.incr(ns, "quota", max=5, ttl_seconds=5)
            assert not refused and (refused["reason"], refused["value"]) == ("limit", 5), refused
            assert (await kv.incr(ns, "quota", delta=-6, min=0, forever=True))["reason"] == "limit"
            assert (await kv.incr(ns, "quota", delta=-5, min=0, forever=True))["value"] == 0
            assert (await kv.incr(ns, "plain", forever=True))["value"] == 1, "delta defaults to 1"

            await kv.put(ns, "name", "ada", forever=True)
            typed = await kv.incr(ns, "name", forever=True)
            assert typed["reason"] == "type" and typed["value"] == "ada", typed

            # Many concurrent increments under a ceiling: exactly `max` are admitted.
            results = await asyncio.gather(*(kv.incr(ns, "admit", max=10, ttl_seconds=60) for _ in range(25)))
            assert sum(1 for r in results if r["applied"]) == 10
            assert (await kv.get(ns, "admit"))["value"] == 10

    run(body())


def test_an_expired_key_is_gone_for_reads_and_writes(queen_url):
    """A key past its lifetime is never returned, and writes treat it as absent: put_if_absent
    applies again, incr starts over from 0."""

    async def body():
        ns = unique("kv-expiry")
        async with client(queen_url) as q:
            kv = q.kv
            await kv.batch([
                kv.op.put(ns, "brief", "soon gone", ttl_seconds=1),
                kv.op.incr(ns, "window", delta=7, ttl_seconds=1),
            ])

            async def expired():
                return not await kv.get(ns, "brief")

            await until(expired)
            many = await kv.get_many(ns, ["brief", "window"])
            assert many["rows"] == [] and many["missing"] == ["brief", "window"], many
            assert await kv.list_all(ns, "b") == []
            assert (await kv.put_if_absent(ns, "brief", "again", forever=True))["applied"] is True
            restarted = await kv.incr(ns, "window", delta=2, ttl_seconds=60)
            assert restarted["value"] == 2, restarted

    run(body())


def test_get_many_get_prefix_and_list_all(queen_url):
    """get_many answers rows and missing; get_prefix pages by key with after/limit/keys_only and
    nextAfter; list_all follows the pages to the end."""

    async def body():
        ns = unique("kv-read")
        async with client(queen_url) as q:
            kv = q.kv
            await kv.batch([kv.op.put(ns, f"user:{i:03}", {"i": i}, forever=True) for i in range(30)])
            await kv.batch([kv.op.put(ns, "user;", 0, forever=True), kv.op.put(ns, "use", 0, forever=True)])

            many = await kv.get_many(ns, ["user:001", "nope", "user:002"])
            assert [r["key"] for r in many["rows"]] == ["user:001", "user:002"], many
            assert many["missing"] == ["nope"] and many["truncated"] is False
            assert many["rows"][1]["value"] == {"i": 2}

            page = await kv.get_prefix(ns, "user:", limit=12)
            assert len(page["rows"]) == 12 and page["truncated"] is True, page
            assert page["nextAfter"] == "user:011"
            following = await kv.get_prefix(ns, "user:", after=page["nextAfter"], limit=12, keys_only=True)
            assert following["rows"][0]["key"] == "user:012" and "value" not in following["rows"][0], following

            everything = await kv.list_all(ns, "user:", limit=7)
            assert [r["key"] for r in everything] == [f"user:{i:03}" for i in range(30)]
            assert len(await kv.list_all(ns, "user:", limit=7, max_rows=10)) == 10

    run(body())


def test_a_batch_is_one_transaction_and_required_aborts_it(queen_url):
    """kv.batch applies in order with index-aligned results; a required op that loses makes nothing
    of the batch apply, and the call raises KvError with the code kv_precondition."""

    async def body():
        ns = unique("kv-batch")
        async with client(queen_url) as q:
            kv = q.kv
            results = await kv.batch([
                kv.op.put(ns, "a", 1, forever=True),
                kv.op.incr(ns, "b", delta=5, forever=True),
                kv.op.get(ns, "c"),
                kv.op.check(ns, "d", expect=0),
            ])
            assert [bool(r) for r in results] == [True, True, False, True], results
            assert results[1]["value"] == 5

            with pytest.raises(KvError) as aborted:
                await kv.batch([
                    kv.op.put(ns, "side", 1, forever=True),
                    kv.op.put_if_absent(ns, "a", 2, forever=True, required=True),
                ])
            assert aborted.value.code == "kv_precondition", aborted.value
            assert not await kv.get(ns, "side"), "nothing of an aborted batch applied"
            with pytest.raises(KvError) as refused:
                await kv.put(ns, "a", 3, forever=True, expect=9, required=True)
            assert refused.value.code == "kv_precondition", refused.value
            assert (await kv.get(ns, "a"))["value"] == 1

    run(body())


def test_the_broker_refuses_bad_operations_with_a_code(queen_url):
    """Refusals the client does not make itself arrive as KvError with the broker's code, reason
    (the field) and detail, and write nothing."""

    async def body():
        ns = unique("kv-refused")
        async with client(queen_url) as q:
            kv = q.kv
            cases = [
                ([kv.op.put(ns, "ok", 1, forever=True), kv.op.get(ns, "k" * 2000)], "kv_invalid_field"),
                ([kv.op.put(ns, "ok", 1, forever=True), kv.op.put(ns, "big", "v" * 70_000, forever=True)], "kv_value_too_large"),
                ([kv.op.put("queen-locks", "x#0", 1, forever=True)], "kv_namespace_reserved"),
                ([kv.op.get(ns, "ok"), kv.op.put(ns, "ok", 1, forever=True)], "kv_duplicate_key"),
                ([{"op": "put", "ns": ns, "key": "ok", "value": 1}], "kv_expiry_not_specified"),
                ([{"op": "getPrefix", "ns": ns, "prefix": ""}], "kv_prefix_required"),
                ([{"op": "swap", "ns": ns, "key": "ok"}], "kv_unknown_op"),
            ]
            for operations, code in cases:
                with pytest.raises(KvError) as refused:
                    await kv.batch(operations)
                assert refused.value.code == code, (operations, refused.value)
                assert refused.value.reason and refused.value.reason.startswith("operations["), refused.value
                assert refused.value.detail, refused.value
            assert not await kv.get(ns, "ok"), "nothing was written"

    run(body())


def test_a_transaction_kv_rider_commits_with_its_push_and_ack_or_not_at_all(queen_url):
    """tx.kv.* and tx.once ride with acks and pushes in one transaction: results follow the pushed
    items and acks; a lost required precondition returns (not raises) kv_precondition and leaves
    the ack and the push unapplied."""

    async def body():
        source, target, ns = unique("kv-tx-in"), unique("kv-tx-out"), unique("kv-tx")
        async with client(queen_url) as q:
            await push_all(q, source, [{"order": 1}])
            message = (await pop_retry(q.queue(source).batch(1).wait(False)))[0]
            await q.kv.put(ns, "done:order-1", "earlier", forever=True)

            lost = await (
                q.transaction()
                .ack(message)
                .queue(target).push([{"data": {"billed": 1}}])
                .kv.incr(ns, "orders", forever=True)
                .once(ns, "done:order-1", forever=True)
                .commit()
            )
            assert not lost and lost["success"] is False and lost["reason"] == "kv_precondition", lost
            assert lost["failedIndex"] == 3 and lost["kvReason"] == "exists", lost
            assert lost["value"] == "earlier" and lost["version"] == 1, lost
            assert await q.queue(target).batch(10).wait(False).pop() == [], "the push did not happen"
            assert not await q.kv.get(ns, "orders"), "the rider's other write did not happen"

            await q.kv.delete(ns, "done:order-1")
            committed = await (
                q.transaction()
                .ack(message)
                .queue(target).push([{"data": {"billed": 1}}])
                .kv.incr(ns, "orders", forever=True)
                .once(ns, "done:order-1", forever=True)
                .kv.get_many(ns, ["done:order-1-other"])
                .kv.put(ns, "last", {"order": 1}, ttl_seconds=60)
                .kv.check(ns, "never", expect=0, required=True)
                .commit()
            )
            assert committed and committed["success"] is True, committed
            results = committed["results"]
            assert len(results) == 7, results
            assert results[2]["value"] == 1 and results[3]["applied"] is True, results
            assert results[4]["missing"] == ["done:order-1-other"]
            assert [m["data"] for m in await pop_retry(q.queue(target).batch(10).wait(False))] == [{"billed": 1}]
            assert await q.queue(source).batch(10).wait(False).pop() == [], "the ack committed"
            assert (await q.kv.get(ns, "done:order-1"))["found"] is True

            alone = await q.transaction().kv.put(ns, "solo", True, forever=True).kv.delete(ns, "last").commit()
            assert alone["success"] is True and alone["results"][1]["applied"] is True, alone

    run(body())


def test_a_consume_with_supervision_publishes_its_status(queen_url):
    """§4.9: a consume with .supervision({group}) puts its head and chunk documents in namespace
    queen-supervisor (both applied), the last one saying it stopped."""

    async def body():
        queue, app = unique("supervised"), unique("app")
        handled = []

        async def handler(message):
            handled.append(message["data"])

        async with client(queen_url) as q:
            await push_all(q, queue, [{"i": i} for i in range(3)])
            builder = q.queue(queue).batch(1).wait(False).limit(3).each().supervision({"group": app})
            await asyncio.wait_for(builder.consume(handler), 30)
            assert len(handled) == 3

            rows = await q.kv.list_all("queen-supervisor", f"{app}/")
            kinds = sorted("head" if row["key"].endswith("/head") else "chunk" for row in rows)
            assert kinds == ["chunk", "head"], rows
            head = next(row for row in rows if row["key"].endswith("/head"))
            chunk = next(row for row in rows if "/chunk/" in row["key"])
            assert head["value"]["format"] == "queen.supervisor.remote-status/v1"
            assert head["value"]["write"] == chunk["value"]["write"], "one publication"
            assert parse_iso(head["expiresAt"]) > datetime.now(timezone.utc), "a 60 s lifetime"
            status = json.loads(base64.b64decode(chunk["value"]["data"]))
            assert status["state"] == "stopped", status
            assert status["pool_status"][0]["completed"] == 3, status
            assert head["version"] >= 2 and chunk["version"] >= 2, "published at start and at stop"

    run(body())
