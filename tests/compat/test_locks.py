"""Locks and semaphores through the client: `client.locks.*`, `client.lock(...)`,
`client.semaphore(...)`, and `transaction().guard(lock)` (§2.9 of the client wire-protocol
reference).
"""

import asyncio
import time
from datetime import timedelta

import pytest
from queen import LockError, LockNotHeldError

from compat_helpers import client, pop_retry, push_all, run, unique


async def until(condition, within=10.0, delay=0.05):
    """Awaits `condition()` until it is truthy, failing after `within` seconds."""
    deadline = time.monotonic() + within
    while not await condition():
        assert time.monotonic() < deadline, f"not within {within}s"
        await asyncio.sleep(delay)


def test_the_four_operations_with_tokens(queen_url):
    """acquire / renew / release / get on client.locks: one holder, an idempotent acquire by the
    same owner, a token that changes at every renew and only rises, releases by token only."""

    async def body():
        name = unique("lock")
        async with client(queen_url) as q:
            locks = q.locks
            first = await locks.acquire(name, ttl_seconds=30, owner="alice")
            assert first and first["slot"] == 0 and first["owner"] == "alice", first
            token = first["token"]
            assert first["guard"] == {"op": "check", "ns": "queen-locks", "key": f"{name}#0", "expect": token, "required": True}
            again = await locks.acquire(name, ttl_seconds=30, owner="alice")
            assert again["already"] is True and again["token"] == token, "the permit the first attempt took"
            other = await locks.acquire(name, ttl=timedelta(seconds=30), owner="bob")
            assert not other and other["reason"] == "held" and other["holders"][0]["owner"] == "alice", other

            renewed = await locks.renew(name, token=token, ttl_seconds=30, slot=0, owner="alice")
            assert renewed and renewed["token"] > token and renewed["guard"]["expect"] == renewed["token"], renewed
            stale = await locks.renew(name, token=token, ttl_seconds=30)
            assert not stale and stale["reason"] == "lost", stale

            state = await locks.get(name)
            assert state and state["holders"][0]["token"] == renewed["token"], state
            assert {"slot", "owner", "token", "since", "expiresAt", "renewedAt"} <= set(state["holders"][0])

            assert not await locks.release(name, token=token), "an old token releases nothing"
            assert await locks.release(name, token=renewed["token"], slot=0)
            assert not await locks.get(name)
            taken = await locks.acquire(name, ttl_seconds=30, owner="bob")
            assert taken and taken["token"] > renewed["token"], "tokens rise across release and a new holder"

            both = await locks.batch([
                {"op": "get", "name": name},
                {"op": "release", "name": name, "token": taken["token"]},
            ])
            assert [bool(r) for r in both] == [True, True], both

            with pytest.raises(LockError) as refused:
                await locks.batch([{"op": "acquire", "name": name, "ttlSeconds": 0}])
            assert refused.value.code == "lock_invalid_field" and refused.value.reason == "operations[0].ttlSeconds"

    run(body())


def test_a_lock_handle_acquires_renews_releases_and_waits(queen_url):
    """client.lock(...): acquire, held/token/slot, renew (new token), release; a second handle
    waits for it with wait=; the context manager raises when the lock is taken; run()."""

    async def body():
        name = unique("handle")
        async with client(queen_url) as q:
            lock = q.lock(name, ttl_seconds=30)
            assert await lock.acquire() is True
            assert lock.held and lock.slot == 0 and lock.token > 0
            first = lock.token
            assert await lock.renew() is True and lock.token > first
            assert lock.guard()["expect"] == lock.token

            rival = q.lock(name, ttl_seconds=30)
            assert await rival.acquire() is False
            with pytest.raises(LockNotHeldError):
                async with rival:
                    pass
            waiting = asyncio.ensure_future(rival.acquire(wait=10))
            await asyncio.sleep(0.3)
            assert not waiting.done()
            assert await lock.release() is True and not lock.held
            assert await waiting is True and rival.token > first
            await rival.release()

            async with q.lock(name, ttl_seconds=30) as inside:
                assert inside.held and (await q.locks.get(name))["holders"][0]["owner"] == inside.owner
            assert not await q.locks.get(name), "released on the way out"

            async def step(held):
                return held.token

            ran = await q.lock(name, ttl_seconds=30).run(step)
            assert ran["acquired"] is True and ran["value"] > 0

    run(body())


def test_a_renewing_handle_keeps_a_short_lease_and_an_expired_one_is_free(queen_url):
    """The handle renews every third of its lifetime, so a 2 s lock is still held after 3 s; a
    permit nobody renews expires, is free for the next holder, and its old holder cannot renew."""

    async def body():
        name, idle = unique("keepalive"), unique("idle")
        async with client(queen_url) as q:
            kept = q.lock(name, ttl_seconds=2)
            assert await kept.acquire()
            first = kept.token
            await asyncio.sleep(3)  # the point of the test is time passing: three renew periods
            assert kept.held and kept.token > first, "renewed in the background"
            assert (await q.locks.get(name))["holders"][0]["token"] == kept.token
            await kept.release()

            taken = await q.locks.acquire(idle, ttl_seconds=1, owner="sleeper")

            async def free():
                return not await q.locks.get(idle)

            await until(free)
            assert not await q.locks.renew(idle, token=taken["token"], ttl_seconds=5)
            nxt = await q.locks.acquire(idle, ttl_seconds=30, owner="next")
            assert nxt and nxt["token"] > taken["token"]

    run(body())


def test_a_semaphore_admits_its_limit(queen_url):
    """client.semaphore(name, 3): three handles hold slots 0..2, the fourth waits for a release."""

    async def body():
        name = unique("sem")
        async with client(queen_url) as q:
            handles = [q.semaphore(name, 3, ttl_seconds=30) for _ in range(4)]
            results = [await h.acquire() for h in handles]
            assert results == [True, True, True, False]
            assert sorted(h.slot for h in handles[:3]) == [0, 1, 2]
            state = await q.locks.get(name)
            assert len(state["holders"]) == 3
            freed = handles[1].slot
            await handles[1].release()
            assert await handles[3].acquire() is True and handles[3].slot == freed
            for h in (handles[0], handles[2], handles[3]):
                await h.release()

    run(body())


def test_a_guard_commits_a_step_only_under_the_live_permit(queen_url):
    """transaction().guard(lock): commits while the permit is the handle's; once the permit is gone
    the bundle is rolled back whole (kv_precondition), its ack and push unapplied, and the handle
    reports the lock lost; a stale guard sent as a kv check names the new holder."""

    async def body():
        source, target, name = unique("guard-in"), unique("guard-out"), unique("guarded")
        async with client(queen_url) as q:
            lock = q.lock(name, ttl_seconds=30)
            assert await lock.acquire()
            ok = await q.transaction().guard(lock).queue(target).push([{"data": {"step": 1}}]).commit()
            assert ok["success"] is True and ok["results"][1]["applied"] is True, ok

            # The permit is taken from under the handle (released by its token elsewhere).
            reasons = []
            lock.on_lost(reasons.append)
            stale_guard = lock.guard()
            assert await q.locks.release(name, token=lock.token)
            await push_all(q, source, [{"n": 1}])
            message = (await pop_retry(q.queue(source).batch(1).wait(False)))[0]
            lost = await q.transaction().guard(lock).ack(message).queue(target).push([{"data": {"step": 2}}]).commit()
            assert lost["success"] is False and lost["reason"] == "kv_precondition", lost
            assert lost["failedIndex"] == 2 and lost["kvReason"] == "absent", lost
            assert reasons == ["guard"] and not lock.held and lock.lost.is_set()
            with pytest.raises(LockNotHeldError):
                await q.transaction().guard(lock).queue(target).push([{"data": {"step": 3}}]).commit()

            rival = q.lock(name, ttl_seconds=30)
            assert await rival.acquire()
            stale = await (
                q.transaction()
                .kv.check(stale_guard["ns"], stale_guard["key"], expect=stale_guard["expect"], required=True)
                .queue(target).push([{"data": {"step": 4}}])
                .commit()
            )
            assert stale["reason"] == "kv_precondition" and stale["kvReason"] == "version", stale
            assert stale["value"]["owner"] == rival.owner and stale["version"] == rival.token, stale
            await rival.release()

            steps = [m["data"]["step"] for m in await pop_retry(q.queue(target).batch(10).wait(False))]
            assert steps == [1], "only the step under a live permit was pushed"
            acked = await q.ack(message)
            assert acked["success"] is True and acked.get("noop") is False, "the rolled-back ack had not committed"

    run(body())


def test_a_guard_that_lost_to_the_same_owner_is_not_a_lost_lock(queen_url):
    """When the permit's token moved but the row still names the handle's owner, the answer says
    kvReason version and value.owner, so the client does not call the lock lost (it re-sends with
    its token, which here stays stale, and returns the verdict)."""

    async def body():
        target, name = unique("own-renew"), unique("own")
        async with client(queen_url) as q:
            lock = q.lock(name, ttl_seconds=30, auto_renew=False)
            assert await lock.acquire()
            moved = await q.locks.renew(name, token=lock.token, ttl_seconds=30, owner=lock.owner)
            assert moved
            result = await q.transaction().guard(lock).queue(target).push([{"data": 1}]).commit()
            assert result["reason"] == "kv_precondition" and result["kvReason"] == "version", result
            assert result["value"]["owner"] == lock.owner
            assert lock.held and not lock.lost.is_set(), "its own renewal, not a loss"
            assert await q.queue(target).batch(10).wait(False).pop() == []
            await q.locks.release(name, token=moved["token"])

    run(body())
