"""Damaged binary bodies (§3.1 and §3.2 of the wire-protocol reference): what the official client
builds with `binary_push=True` (and `push_compression=True`) is damaged on its way to the broker,
by a transport between the client and the network. Each damage is one a proxy, a bad buffer or a
half-sent request could cause: the body cut short, a count that lies, a frame length past its
group, a compressed group that is not zstd. The broker must answer 400 with a JSON error, the client
must raise it, and nothing may be written: the same items pushed again intact are all `queued`
(no dedup id was kept) and are the only messages a consumer gets.
"""

import struct

import httpx
import pytest
import zstandard

from compat_helpers import client, collect, run, unique

BINARY = "application/x-queen-push"
U16, U32 = struct.Struct("<H"), struct.Struct("<I")


def first_group(body):
    """Offsets in a QPB1 or QTB1 body: of its group count, and of the first group's message count
    and (frames bodies) compressed length."""
    at = 5  # magic and flags; the client never sets QPB1's flag 1, so no raw length follows
    if body[:4] == b"QTB1":
        (head_len,) = U32.unpack_from(body, at)
        at += 4 + head_len
    groups = at
    at += 4
    for _name in ("queue", "partition"):
        (length,) = U16.unpack_from(body, at)
        at += 2 + length
    return groups, at, at + 4


def add_one(body, offset):
    """The body with the u32 at `offset` one larger."""
    (value,) = U32.unpack_from(body, offset)
    return body[:offset] + U32.pack(value + 1) + body[offset + 4 :]


def with_group_bytes(body, change):
    """A frames body whose first group's compressed bytes are `change(them)`, the length before
    them set to match, so that only the group itself is wrong."""
    _, _, z_len_at = first_group(body)
    (z_len,) = U32.unpack_from(body, z_len_at)
    start = z_len_at + 4
    z = change(body[start : start + z_len])
    return body[:z_len_at] + U32.pack(len(z)) + z + body[start + z_len :]


def recompressed(change):
    """A change of a group's compressed bytes: decompressed, `change`d, compressed again with its
    content size, as the client compresses."""

    def apply(z):
        raw = zstandard.ZstdDecompressor().decompress(z)
        return zstandard.ZstdCompressor(level=1, write_content_size=True).compress(change(raw))

    return apply


def first_frame_too_long(raw):
    """The first stored frame's body length set past the end of the group."""
    return U32.pack(0xFFFFFFF0) + raw[4:]


DAMAGES = {
    "cut-in-half": lambda body: body[: len(body) // 2],
    "last-byte-missing": lambda body: body[:-1],
    "one-group-too-many": lambda body: add_one(body, first_group(body)[0]),
    "one-message-too-many": lambda body: add_one(body, first_group(body)[1]),
}
FRAMES_DAMAGES = {
    "group-not-zstd": lambda body: with_group_bytes(body, lambda z: bytes(len(z))),
    "group-zstd-cut": lambda body: with_group_bytes(body, lambda z: z[:-3]),
    "frame-length-past-group": lambda body: with_group_bytes(body, recompressed(first_frame_too_long)),
    "last-frame-cut": lambda body: with_group_bytes(body, recompressed(lambda raw: raw[:-1])),
}


class Damaging(httpx.AsyncHTTPTransport):
    """A real transport that damages the body of every binary request, and notes that it did."""

    def __init__(self, damage):
        super().__init__()
        self.damage = damage
        self.damaged = 0

    async def handle_async_request(self, request):
        if request.headers.get("content-type") == BINARY:
            body = self.damage(request.content)
            headers = [(k, v) for k, v in request.headers.raw if k.lower() != b"content-length"]
            request = httpx.Request(request.method, request.url, headers=headers, content=body)
            self.damaged += 1
        return await super().handle_async_request(request)


CASES = [
    pytest.param({"binary_push": True}, damage, id=f"plain-{name}")
    for name, damage in DAMAGES.items()
] + [
    pytest.param({"binary_push": True, "push_compression": True}, damage, id=f"compressed-{name}")
    for name, damage in {**DAMAGES, **FRAMES_DAMAGES}.items()
]


def refusal(raised):
    """Checks that the HTTP answer behind what the client raised is a 400 whose JSON says what was
    wrong."""
    answer = raised.value.response
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"], answer.text


ITEMS = [{"data": {"n": n, "text": "payload " * n}, "transactionId": f"d-{n}"} for n in range(1, 6)]


@pytest.mark.parametrize("form,damage", CASES)
def test_a_damaged_binary_push_is_refused_and_writes_nothing(queen_url, form, damage):
    async def body():
        name, group = unique("damaged"), unique("g")
        transport = Damaging(damage)
        async with client(queen_url, transport=transport, **form) as q:
            with pytest.raises(httpx.HTTPStatusError) as raised:
                await q.queue(name).partition("p").push(ITEMS)
            refusal(raised)
            assert transport.damaged == 1, "the client sent one binary push and did not retry a 400"

        async with client(queen_url, **form) as q:
            again = await q.queue(name).partition("p").push(ITEMS)
            assert [r["status"] for r in again] == ["queued"] * len(ITEMS), again
            got = await collect(q.queue(name).group(group).batch(100).wait(False), len(ITEMS))
            assert [m["transactionId"] for m in got] == [item["transactionId"] for item in ITEMS], got

    run(body())


TRANSACTION_DAMAGES = {
    "cut-in-half": DAMAGES["cut-in-half"],
    "head-length-past-body": lambda body: body[:5] + U32.pack(len(body)) + body[9:],
    "one-message-too-many": DAMAGES["one-message-too-many"],
    "frame-length-past-group": FRAMES_DAMAGES["frame-length-past-group"],
}


@pytest.mark.parametrize("damage", TRANSACTION_DAMAGES.values(), ids=TRANSACTION_DAMAGES.keys())
def test_a_damaged_binary_transaction_is_refused_and_neither_acks_nor_pushes(queen_url, damage):
    """A QTB1 bundle (an ack and a push) damaged on the way is refused whole. The bundle sent intact
    afterwards commits both: its ack is not a no-op (an ack already taken would have released the
    lease, and a bundle requiring a released lease rolls back) and its pushes are not
    duplicates."""

    async def body():
        source, target = unique("qtb-src"), unique("qtb-dst")
        form = {"binary_push": True, "push_compression": True}
        async with client(queen_url, **form) as q:
            await q.queue(source).push([{"data": {"v": 1}, "transactionId": "src-1"}])
            popped = await collect(q.queue(source).batch(1).wait(False), 1)
            assert len(popped) == 1, popped

        transport = Damaging(damage)
        async with client(queen_url, transport=transport, **form) as q:
            bundle = q.transaction().ack(popped[0]).queue(target).push(ITEMS[:2])
            with pytest.raises(httpx.HTTPStatusError) as raised:
                await bundle.commit()
            refusal(raised)
            assert transport.damaged == 1

        async with client(queen_url, **form) as q:
            result = await q.transaction().ack(popped[0]).queue(target).push(ITEMS[:2]).commit()
            assert result["success"] is True, result
            acked = [r for r in result["results"] if r.get("transactionId") == "src-1"]
            assert [(r["status"], r["noop"]) for r in acked] == [("completed", False)], result
            pushed = [r for r in result["results"] if "transaction_id" in r]
            assert [r["status"] for r in pushed] == ["queued", "queued"], result
            got = await collect(q.queue(target).batch(10).wait(False), 2)
            assert [m["transactionId"] for m in got] == ["d-1", "d-2"], got

    run(body())


def asking_for_a_2_gib_window(z):
    """The same zstd frame, still valid, asking its reader for a 2 GiB window instead of being one
    segment: one-shot decoders take it, and so does the client's streaming one while the content
    fits its 128 KiB output buffer, but not past that."""
    descriptor = z[4]
    assert descriptor & 0x20, "the client writes single-segment frames"
    assert descriptor >> 6 in (1, 2), "a content size field of 2 or 4 bytes, the same either way"
    return z[:4] + bytes([descriptor & ~0x20 & 0xFF, 0xA8]) + z[5:]


BIG_ITEMS = [{"data": {"n": n, "text": f"{n}" * 60_000}, "transactionId": f"big-{n}"} for n in range(1, 4)]


def test_a_group_asking_for_a_window_streaming_readers_refuse_is_taken_and_read_by_a_framed_pop(queen_url):
    """Such a group is no damage, and the broker takes it. Kept as sent, it would be shipped as sent
    in framed pops, and the client would refuse every pop answer that holds it (its partition stuck
    for that consumer). The broker compresses it again, and the framed pop hands every message out."""

    async def body():
        name, group = unique("window"), unique("g")
        form = {"binary_push": True, "push_compression": True}
        raw = b"x" * 200_000
        sent = asking_for_a_2_gib_window(zstandard.ZstdCompressor(level=1, write_content_size=True).compress(raw))
        assert zstandard.ZstdDecompressor().decompress(sent) == raw, "a valid frame"
        with pytest.raises(zstandard.ZstdError, match="memory"):
            zstandard.ZstdDecompressor().decompressobj().decompress(sent)
        transport = Damaging(lambda body: with_group_bytes(body, asking_for_a_2_gib_window))
        async with client(queen_url, transport=transport, **form) as q:
            pushed = await q.queue(name).partition("p").push(BIG_ITEMS)
            assert [r["status"] for r in pushed] == ["queued"] * len(BIG_ITEMS), pushed
            assert transport.damaged == 1

        async with client(queen_url, framed_pop=True) as q:
            got = await collect(q.queue(name).group(group).batch(100).wait(False), len(BIG_ITEMS))
            assert [m["transactionId"] for m in got] == [item["transactionId"] for item in BIG_ITEMS]
            assert [m["data"] for m in got] == [item["data"] for item in BIG_ITEMS]

    run(body())
