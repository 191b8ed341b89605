"""Reads by offset (§2.7): `queue(q).fetch(...)` and `queue(q).changed_since(...)`.

Offsets are the ones pops hand out: a partition's first record is offset 1. A default fetch starts
at 0, is told OFFSET_OUT_OF_RANGE with logStartOffset 1, and the client starts again there.
"""

from datetime import timedelta

from compat_helpers import client, parse_iso, pop_retry, run, unique


async def push_each(q, queue, partition, payloads):
    """Pushes each payload in a request of its own (a segment each); the push results."""
    results = []
    for payload in payloads:
        result = await q.queue(queue).partition(partition).push([{"data": payload}])
        assert [r["status"] for r in result] == ["queued"], result
        results.extend(result)
    return results


def offsets(read):
    return [r["offset"] for r in read["records"]]


def test_fetch_reads_every_record_of_several_partitions(queen_url):
    async def body():
        name = unique("fetch")
        async with client(queen_url) as q:
            batch = await q.queue(name).partition("one").push([{"data": {"i": i}} for i in range(5)])
            single = await push_each(q, name, "two", [{"j": j} for j in range(3)])

            read = await q.queue(name).fetch(["one", "two", "never"])
            assert list(read) == ["one", "two", "never"], read

            one = read["one"]
            assert [r["payload"] for r in one["records"]] == [{"i": i} for i in range(5)], one
            assert offsets(one) == [1, 2, 3, 4, 5], one
            assert [r["transactionId"] for r in one["records"]] == [r["transaction_id"] for r in batch]
            assert (one["logStartOffset"], one["highWatermark"], one["nextOffset"]) == (1, 6, 6), one
            for record in one["records"]:
                assert record["ts"].endswith("Z") and parse_iso(record["ts"]), record

            two = read["two"]
            assert [r["payload"] for r in two["records"]] == [{"j": j} for j in range(3)], two
            assert [r["transactionId"] for r in two["records"]] == [r["transaction_id"] for r in single]
            assert two["nextOffset"] == two["highWatermark"] == 4, two

            assert read["never"]["records"] == [], read["never"]

            # The offsets are the ones a pop gives, and the fetch took nothing from consumers.
            popped = await pop_retry(q.queue(name).partition("one").group(unique("g")).batch(10).wait(False))
            assert [m["offset"] for m in popped] == offsets(one), popped
            queue_mode = await pop_retry(q.queue(name).partition("one").batch(10).wait(False))
            assert len(queue_mode) == 5, queue_mode

    run(body())


def test_fetch_from_offsets_and_past_the_end(queen_url):
    async def body():
        name = unique("fetch-offsets")
        async with client(queen_url) as q:
            await q.queue(name).partition("p").push([{"data": {"i": i}} for i in range(6)])

            later = await q.queue(name).fetch("p", offsets={"p": 4})
            assert offsets(later["p"]) == [4, 5, 6], later

            # From an earlier read's nextOffset: only what is new.
            await q.queue(name).partition("p").push([{"data": {"i": 6}}])
            new = await q.queue(name).fetch("p", offsets={"p": later["p"]["nextOffset"]})
            assert [r["payload"] for r in new["p"]["records"]] == [{"i": 6}], new

            at_end = await q.queue(name).fetch("p", offsets={"p": 8})
            assert at_end["p"]["records"] == [] and at_end["p"]["nextOffset"] == 8, at_end

            past = await q.queue(name).fetch("p", offsets={"p": 50})
            assert past["p"]["records"] == [], past
            assert past["p"]["nextOffset"] > past["p"]["highWatermark"] == 8, past

            missing = await q.queue(unique("no-such-queue")).fetch(["p"])
            assert missing["p"]["records"] == [], missing

    run(body())


def test_a_small_max_bytes_reads_every_record_once_in_order(queen_url):
    async def body():
        name = unique("fetch-bytes")
        async with client(queen_url) as q:
            text = "x" * 100
            await q.queue(name).partition("big").push([{"data": {"i": i, "text": text}} for i in range(20)])
            await push_each(q, name, "small", [{"i": i, "text": text} for i in range(20)])

            # About two records per call: many calls, each record once.
            read = await q.queue(name).fetch(["big", "small"], max_bytes=250)
            for partition in ("big", "small"):
                got = read[partition]
                assert [r["payload"]["i"] for r in got["records"]] == list(range(20)), got
                assert offsets(got) == list(range(1, 21)), got

            # A budget smaller than any record still reads them all, one per call.
            tiny = await q.queue(name).fetch("small", max_bytes=10)
            assert offsets(tiny["small"]) == list(range(1, 21)), tiny

    run(body())


def test_an_encrypted_queue_is_read_in_plain_text(queen_url):
    async def body():
        name = unique("fetch-sealed")
        async with client(queen_url) as q:
            await q.queue(name).config({"encryption_enabled": True}).create()
            await q.queue(name).partition("p").push([{"data": {"card": "4111"}}])
            read = await q.queue(name).fetch("p")
            assert [r["payload"] for r in read["p"]["records"]] == [{"card": "4111"}], read

    run(body())


def test_changed_since_lists_partitions_written_since_a_time(queen_url):
    async def body():
        name = unique("changed")
        async with client(queen_url) as q:
            for partition in ("c", "a", "b"):
                await q.queue(name).partition(partition).push([{"data": 1}, {"data": 2}])

            everything = await q.queue(name).changed_since()
            listed = everything["partitions"]
            assert [p["name"] for p in listed] == ["c", "a", "b"], everything
            ids = [int(p["id"]) for p in listed]
            assert ids == sorted(ids), listed
            for p in listed:
                assert (p["lastOffset"], p["logStart"]) == (2, 1), p
                assert parse_iso(p["lastWriteAt"]), p
            safe_time = everything["safeTime"]
            assert isinstance(safe_time, str) and safe_time.endswith("Z"), everything

            # A time after every write so far selects none of them; a later write selects its
            # partition, and so does asking again from the safe time.
            after_writes = max(parse_iso(p["lastWriteAt"]) for p in listed) + timedelta(microseconds=1)
            assert (await q.queue(name).changed_since(after_writes))["partitions"] == []
            await q.queue(name).partition("a").push([{"data": 3}])
            since_then = await q.queue(name).changed_since(after_writes)
            assert [(p["name"], p["lastOffset"]) for p in since_then["partitions"]] == [("a", 3)], since_then
            from_safe_time = await q.queue(name).changed_since(safe_time)
            assert "a" in [p["name"] for p in from_safe_time["partitions"]], from_safe_time
            assert from_safe_time["safeTime"] >= safe_time, from_safe_time

            unknown = await q.queue(unique("no-such-queue")).changed_since()
            assert unknown["partitions"] == [] and unknown["safeTime"], unknown

    run(body())


def test_changed_since_pages_over_more_partitions_than_a_page(queen_url):
    async def body():
        name = unique("changed-pages")
        count = 1200
        async with client(queen_url) as q:
            tx = q.transaction()
            for i in range(count):
                tx.queue(name).partition(f"p{i:04d}").push([{"data": {"i": i}}])
            committed = await tx.commit()
            assert committed.get("success") is True, committed

            changed = await q.queue(name).changed_since()
            names = [p["name"] for p in changed["partitions"]]
            assert len(names) == count and set(names) == {f"p{i:04d}" for i in range(count)}, len(names)
            ids = [int(p["id"]) for p in changed["partitions"]]
            assert ids == sorted(set(ids)), "creation order, each partition once"
            assert all(p["lastOffset"] == 1 for p in changed["partitions"])
            assert changed["safeTime"], changed

    run(body(), timeout=120)
