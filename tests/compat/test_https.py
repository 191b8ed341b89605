"""The official client over HTTPS: a broker given a certificate (tests/compat/main.rs makes one with
its own CA and points SSL_CERT_FILE at that CA, which httpx trusts) serves every form of push and
pop, and a consumer that gives up its long poll leaves nothing parked or leased, as over plain
HTTP. (A client that sends close_notify before closing, which httpx does not, is tested in
`api https::a_long_poll_over_https_whose_client_left_claims_nothing_and_gives_its_place_back`.)

Run on its own against such a broker; the main suite's run ignores this file.
"""

import asyncio
import os

import httpx
import pytest

from compat_helpers import client, collect, run, unique

FORMS = [
    pytest.param({}, id="json"),
    pytest.param({"binary_push": True}, id="binary"),
    pytest.param({"binary_push": True, "push_compression": True, "framed_pop": True}, id="compressed"),
]


@pytest.fixture(scope="module", autouse=True)
def https_broker(queen_url):
    assert queen_url.startswith("https://"), f"QUEEN_URL is {queen_url}: this file runs against an HTTPS broker"
    assert os.environ.get("SSL_CERT_FILE"), "set SSL_CERT_FILE to the CA of the broker's certificate"


async def parked_long_polls(http):
    """The broker's count of parked long polls."""
    text = (await http.get("/metrics", params={"format": "prometheus"})).text
    samples = [line.split()[-1] for line in text.splitlines() if line.startswith("queen_long_poll_waiters ")]
    assert samples, "no queen_long_poll_waiters sample in /metrics"
    return float(samples[0])


async def until_parked_long_polls(http, wanted, within=10.0):
    deadline = asyncio.get_running_loop().time() + within
    while (parked := await parked_long_polls(http)) != wanted:
        assert asyncio.get_running_loop().time() < deadline, f"{parked} long polls parked, not {wanted}"
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("form", FORMS)
def test_pushes_pops_and_acks_over_https_in_every_form(queen_url, form):
    async def body():
        name = unique("https")
        async with client(queen_url, **form) as q:
            pushed = await q.queue(name).partition("p").push([{"data": {"n": n}} for n in range(5)])
            assert [r["status"] for r in pushed] == ["queued"] * 5, pushed
            messages = await collect(q.queue(name).batch(10).wait(False), 5)
            assert [m["data"] for m in messages] == [{"n": n} for n in range(5)]
            assert [m["id"] for m in messages] == [r["message_id"] for r in pushed]
            acked = await q.ack(messages, True)
            assert acked.get("success") is not False, acked
            assert await q.queue(name).batch(10).wait(False).pop() == []

    run(body())


def test_a_consumer_that_gives_up_its_long_poll_over_https_leaves_nothing_leased(queen_url):
    async def body():
        name = unique("https-left")
        async with client(queen_url) as leaving, client(queen_url) as staying, \
                httpx.AsyncClient(base_url=queen_url, timeout=10.0) as http:
            assert await parked_long_polls(http) == 0, "another test's long poll is parked"
            poll = asyncio.create_task(leaving.queue(name).batch(1).wait(True).timeout_millis(30000).pop())
            await until_parked_long_polls(http, 1)
            # Cancelled mid-request, the client drops its connection (httpx sends no TLS
            # close_notify first); the broker gives the poll's place back.
            poll.cancel()
            with pytest.raises(asyncio.CancelledError):
                await poll
            await until_parked_long_polls(http, 0)

            await staying.queue(name).push([{"transactionId": "after-the-left-poll", "data": 1}])
            messages = await staying.queue(name).batch(1).wait(True).timeout_millis(5000).pop()
            assert [m["transactionId"] for m in messages] == ["after-the-left-poll"]
            assert messages[0]["deliveryAttempt"] == 1, "never delivered to the consumer that left"

    run(body())
