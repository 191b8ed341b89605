"""Conflation through the client (§4.6 and conformance scenario 40 of the wire-protocol reference).

A conflating group is served only the newest message of a partition; the client checks the
broker's echo on every answer, empty ones included, and raises when it is missing.
"""

from compat_helpers import client, ids, push_all, run, unique

from queen.errors import ConflationUnsupportedError


def test_a_conflating_pop_gets_the_newest_message_and_empty_pops_do_not_raise(queen_url):
    """§6.40: ten messages in one partition, a conflating group pops one (the newest); acked, the
    next conflating pop is [] without raising (the echo came on the empty answer)."""

    async def body():
        name, group = unique("conflation"), unique("latest")
        async with client(queen_url) as q:
            await push_all(q, name, [{"id": i} for i in range(10)], partition="p")
            pop = q.queue(name).group(group).conflation().subscription_mode("all").batch(10).wait(False)
            first = await pop.pop()
            assert ids(first) == [9], first
            ack = await q.ack(first, True, {"group": group})
            assert ack["success"] is True, ack
            assert await pop.pop() == []

            await push_all(q, name, [{"id": i} for i in range(10, 13)], partition="p")
            assert ids(await pop.pop()) == [12]
            # A group that does not conflate still reads every message.
            everything = q.queue(name).group(unique("all")).subscription_mode("all").batch(100).wait(False)
            assert ids(await everything.pop()) == list(range(13))

    run(body())


def test_a_conflating_consumer_handles_each_partitions_latest_value(queen_url):
    """consume() with conflation: a backlog of three partitions is handled as their three newest
    messages, one per partition."""

    async def body():
        name, group = unique("conflation-consume"), unique("latest")
        async with client(queen_url) as q:
            for partition in ("a", "b", "c"):
                await push_all(q, name, [{"id": f"{partition}{i}"} for i in range(5)], partition=partition)
            handled = []

            async def handler(message):
                handled.append(message["data"]["id"])

            consumer = (
                q.queue(name).group(group).conflation().subscription_mode("all")
                .batch(10).wait(False).idle_millis(1500).each()
            )
            await consumer.consume(handler)
            assert sorted(handled) == ["a4", "b4", "c4"], handled

    run(body())


def test_a_group_registered_without_conflation_is_served_everything(queen_url):
    """The stored choice wins: a group that first popped without conflation and later asks for it
    gets every message (the broker echoes the conflict; the client warns and carries on)."""

    async def body():
        name, group = unique("conflation-conflict"), unique("plain")
        async with client(queen_url) as q:
            await push_all(q, name, [{"id": i} for i in range(3)], partition="p")
            plain = await q.queue(name).group(group).subscription_mode("all").batch(1).wait(False).pop()
            assert ids(plain) == [0], plain
            await q.ack(plain, True, {"group": group})
            asked = await q.queue(name).group(group).conflation().batch(10).wait(False).pop()
            assert ids(asked) == [1, 2], asked

    run(body())


def test_conflation_without_a_group_or_with_commit_on_delivery_is_refused(queen_url):
    """§4.6: conflation needs a group and is refused with autoAck; pop() re-raises the 400."""

    async def body():
        name = unique("conflation-refused")
        async with client(queen_url) as q:
            await push_all(q, name, [{"id": 1}], partition="p")
            for builder in (
                q.queue(name).conflation().batch(1).wait(False),
                q.queue(name).group(unique("g")).conflation().commit_on_delivery().batch(1).wait(False),
            ):
                try:
                    result = await builder.pop()
                except ConflationUnsupportedError:
                    raise
                except Exception as refused:  # the client re-raises its HTTP error for a 400
                    status = getattr(getattr(refused, "response", None), "status_code", None)
                    assert status == 400, refused
                else:
                    raise AssertionError(f"a refused conflating pop returned {result!r}")
            # Nothing was delivered or registered: queue mode still gets the message.
            plain = await q.queue(name).batch(1).wait(False).pop()
            assert ids(plain) == [1], plain

    run(body())


def test_empty_conflating_pops_carry_the_echo_whether_they_wait_or_not(queen_url):
    """The client raises ConflationUnsupportedError on any answer without the echo: an empty
    queue, popped with and without waiting, returns [] and raises nothing."""

    async def body():
        name = unique("conflation-empty")
        async with client(queen_url) as q:
            empty = await q.queue(name).group(unique("g")).conflation().batch(1).wait(False).pop()
            assert empty == []
            waited = await q.queue(name).group(unique("g")).conflation().batch(1).wait(True).timeout_millis(300).pop()
            assert waited == []

    run(body())
