"""The families of the client's API this broker does not offer (§2.11, §2.12): ephemeral queues
and the streams runtime answer 404, which the client turns into a clear verdict rather than a
hang or a silent success."""

import pytest

from compat_helpers import client, run, unique

from queen import Stream
from queen.errors import EphemeralError, EphemeralQueueNotFoundError


def test_ephemeral_queues_are_reported_as_unsupported(queen_url):
    async def body():
        name = unique("ephemeral")
        async with client(queen_url) as q:
            calls = (
                lambda: q.ephemeral.push(name, [{"v": 1}]),
                lambda: q.ephemeral.pop(name),
                lambda: q.ephemeral.depth(name),
                lambda: q.ephemeral.queues(),
            )
            for call in calls:
                with pytest.raises(EphemeralError) as refused:
                    await call()
                assert not isinstance(refused.value, EphemeralQueueNotFoundError), refused.value
                assert refused.value.code == "ephemeral_unsupported", refused.value

    run(body())


def test_the_streams_runtime_is_refused(queen_url):
    async def body():
        name = unique("streams")
        async with client(queen_url) as q:
            stream = Stream.from_(q.queue(name)).foreach(lambda value: None)
            with pytest.raises(Exception) as refused:
                runner = await stream.run(unique("query"), url=queen_url)
                await runner.stop()
            assert "404" in str(refused.value) or "not offered" in str(refused.value), refused.value

    run(body())
