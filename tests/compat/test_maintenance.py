"""Maintenance mode under the official client: a producer pushing steadily and a consumer long
polling while push maintenance is switched on and off with raw HTTP; every message arrives exactly
once, with the id its push was answered with, and the client's push answers say `buffered` while
it is on. The client pushes JSON, binary (`binary_push=True`), or binary frames groups it compressed
itself (`push_compression=True`, consumed with `framed_pop=True`), whose client-minted ids the
broker keeps through its journal.

The switch is the broker's, shared by every test of the suite: it is switched off again however
the test ends.
"""

import asyncio

import httpx
import pytest

from compat_helpers import client, run, unique

MAINTENANCE = "/api/v1/system/maintenance"
# A push every 20 ms; about 1.5 s of it buffered.
PUSH_INTERVAL = 0.02
MAINTENANCE_SECONDS = 1.5


async def set_maintenance(http, enabled):
    answer = await http.post(MAINTENANCE, json={"enabled": enabled})
    assert answer.status_code == 200, answer.text
    assert answer.json()["maintenanceMode"] is enabled, answer.text


async def wait_until_drained(http, within=20.0):
    deadline = asyncio.get_running_loop().time() + within
    while (await http.get(MAINTENANCE)).json()["bufferedMessages"] > 0:
        assert asyncio.get_running_loop().time() < deadline, "the broker did not drain its journal"
        await asyncio.sleep(0.05)


FORMS = [
    pytest.param({}, id="json"),
    pytest.param({"binary_push": True}, id="binary"),
    pytest.param({"binary_push": True, "push_compression": True, "framed_pop": True}, id="compressed"),
]


@pytest.mark.parametrize("form", FORMS)
def test_every_message_arrives_once_across_push_maintenance(queen_url, form):
    async def body():
        name = unique("maintenance")
        statuses = {}
        answered_ids = {}
        received = []
        received_ids = {}
        producing = asyncio.Event()
        producing.set()

        async with client(queen_url, **form) as q, httpx.AsyncClient(base_url=queen_url, timeout=10.0) as http:

            async def producer():
                n = 0
                while producing.is_set():
                    transaction_id = f"{name}-{n}"
                    queue = q.queue(name).partition(f"p{n % 2}")
                    result = await queue.push([{"transactionId": transaction_id, "data": {"n": n}}])
                    statuses[transaction_id] = result[0]["status"]
                    answered_ids[transaction_id] = result[0]["message_id"]
                    n += 1
                    await asyncio.sleep(PUSH_INTERVAL)

            async def consumer():
                idle = 0
                while producing.is_set() or idle < 3:
                    messages = await q.queue(name).batch(20).wait(True).timeout_millis(300).pop()
                    if not messages:
                        idle += 0 if producing.is_set() else 1
                        continue
                    idle = 0
                    outcome = await q.ack(messages, True)
                    assert outcome.get("success") is not False, outcome
                    received.extend(m["transactionId"] for m in messages)
                    received_ids.update((m["transactionId"], m["id"]) for m in messages)

            tasks = [asyncio.create_task(producer()), asyncio.create_task(consumer())]
            try:
                while not received:
                    await asyncio.sleep(PUSH_INTERVAL)
                await set_maintenance(http, True)
                await asyncio.sleep(MAINTENANCE_SECONDS)
                await set_maintenance(http, False)
                await wait_until_drained(http)
                await asyncio.sleep(0.3)
            finally:
                await http.post(MAINTENANCE, json={"enabled": False})
                producing.clear()
            await asyncio.gather(*tasks)

        buffered = [t for t, status in statuses.items() if status == "buffered"]
        assert len(buffered) >= 10, f"only {len(buffered)} pushes were buffered"
        assert set(statuses.values()) <= {"queued", "buffered"}, statuses
        assert sorted(received) == sorted(statuses), (
            f"missing {sorted(set(statuses) - set(received))}, "
            f"repeated {sorted(t for t in set(received) if received.count(t) > 1)}"
        )
        assert received_ids == answered_ids, "a message arrived under another id than it was answered with"

    run(body())
