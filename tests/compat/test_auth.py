"""The official client with `bearer_token` against a broker with JWT auth on.

Run on its own against a broker started with `JWT_ENABLED=true`, `JWT_ALGORITHM=auto`, an HS256
secret and a JWKS (served by tests/compat/main.rs) holding one RSA key; the main suite's run
ignores this file. The tokens are minted here with PyJWT, as an identity provider would: HS256
with the shared secret, RS256 with the private key whose public half the JWKS serves.
"""

import os
import time

import httpx
import jwt
import pytest
from queen import Queen

from compat_helpers import pop_retry, run, unique

SECRET = os.environ.get("QUEEN_AUTH_HS256_SECRET", "")
RS256_KEY = os.environ.get("QUEEN_AUTH_RS256_KEY", "")
RS256_KID = os.environ.get("QUEEN_AUTH_RS256_KID", "")


@pytest.fixture(scope="module", autouse=True)
def auth_settings():
    missing = [name for name, value in [("QUEEN_AUTH_HS256_SECRET", SECRET), ("QUEEN_AUTH_RS256_KEY", RS256_KEY),
                                        ("QUEEN_AUTH_RS256_KID", RS256_KID)] if not value]
    assert not missing, f"set {', '.join(missing)} (tests/compat/main.rs does)"


def hs256(sub, role, lifetime=3600, secret=None):
    now = int(time.time())
    claims = {"sub": sub, "role": role, "iat": now, "exp": now + lifetime}
    return jwt.encode(claims, secret or SECRET, algorithm="HS256")


def rs256(sub, role, kid=None):
    now = int(time.time())
    with open(RS256_KEY, "rb") as key:
        private = key.read()
    claims = {"sub": sub, "roles": [role], "iat": now, "exp": now + 3600}
    return jwt.encode(claims, private, algorithm="RS256", headers={"kid": kid or RS256_KID})


class Client:
    """A Queen client for one token, closed when the block ends."""

    def __init__(self, url, token):
        self.queen = Queen(url, bearer_token=token) if token else Queen(url)

    async def __aenter__(self):
        return self.queen

    async def __aexit__(self, *exc):
        await self.queen.close()


async def status_of(call):
    """The HTTP status a client call failed with; fails the test if it did not fail."""
    with pytest.raises(httpx.HTTPStatusError) as raised:
        await call
    return raised.value.response.status_code


def round_trip(queen_url, token, producer):
    async def body():
        name = unique("auth")
        async with Client(queen_url, hs256("ops", "admin")) as admin:
            assert (await admin.queue(name).create()).get("configured") is True
        async with Client(queen_url, token) as q:
            pushed = await q.queue(name).push([{"transactionId": "a1", "data": {"n": 1}}])
            assert pushed[0]["status"] == "queued", pushed
            messages = await pop_retry(q.queue(name).batch(1).wait(False))
            assert [m["transactionId"] for m in messages] == ["a1"], messages
            assert messages[0]["producerSub"] == producer, messages
            assert (await q.ack(messages[0]))["success"] is True

    run(body())


def test_an_hs256_token_pushes_pops_and_acks(queen_url):
    round_trip(queen_url, hs256("svc-hs", "read-write"), "svc-hs")


def test_an_rs256_token_verified_through_the_jwks_pushes_pops_and_acks(queen_url):
    round_trip(queen_url, rs256("svc-rs", "read-write"), "svc-rs")


def test_without_a_token_or_with_a_bad_one_the_client_gets_401(queen_url):
    async def body():
        name = unique("auth-refused")
        for token in [None, hs256("svc", "admin", lifetime=-3600), hs256("svc", "admin", secret="forged-" * 6),
                      rs256("svc", "admin", kid="not-in-the-jwks"), "not-a-token"]:
            async with Client(queen_url, token) as q:
                assert await status_of(q.queue(name).push([{"data": 1}])) == 401, token
                assert await status_of(q.queue(name).create()) == 401, token

    run(body())


def test_each_role_gets_what_it_may_and_403_for_the_rest(queen_url):
    async def body():
        name = unique("auth-roles")
        async with Client(queen_url, hs256("reader", "read-only")) as reader:
            assert await status_of(reader.queue(name).push([{"data": 1}])) == 403
            assert await status_of(reader.queue(name).create()) == 403
        async with Client(queen_url, hs256("writer", "read-write")) as writer:
            assert await status_of(writer.queue(name).create()) == 403, "configure is admin's"
            pushed = await writer.queue(name).push([{"transactionId": "r1", "data": 1}])
            assert pushed[0]["status"] == "queued"
            assert await status_of(writer.queue(name).delete()) == 403
        async with Client(queen_url, hs256("ops", "admin")) as admin:
            assert (await admin.queue(name).create()).get("configured") is True
            assert await admin.queue(name).delete() is not None

    run(body())


def test_a_producer_sub_in_the_body_is_refused_and_the_tokens_subject_stamped(queen_url):
    async def body():
        name = unique("auth-spoof")
        token = hs256("svc-real", "read-write")
        headers = {"Authorization": f"Bearer {token}"}
        async with httpx.AsyncClient(base_url=queen_url, timeout=10.0, headers=headers) as http:
            item = {"queue": name, "transactionId": "s1", "payload": 1, "producerSub": "svc-spoofed"}
            answer = await http.post("/api/v1/push", json={"items": [item]})
            assert answer.status_code == 400, answer.text
            assert answer.json()["error"].startswith("items[0].producerSub is set by the broker"), answer.text
        async with Client(queen_url, token) as q:
            assert (await q.queue(name).push([{"transactionId": "s1", "data": 1}]))[0]["status"] == "queued"
            messages = await pop_retry(q.queue(name).batch(1).wait(False))
            assert [m["producerSub"] for m in messages] == ["svc-real"], messages

    run(body())
