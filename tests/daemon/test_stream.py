"""The live stream's bounded queues: a slow client loses its oldest frames, is told, never blocks."""

from __future__ import annotations

import asyncio
import json
import threading
import time

from gpuwarden.daemon.stream import Broadcaster


def _frames(texts: list[str]) -> list[tuple[str, dict[str, object]]]:
    out = []
    for text in texts:
        lines = dict(line.split(": ", 1) for line in text.strip().splitlines() if not line.startswith(":"))
        if "event" in lines:
            out.append((lines["event"], json.loads(lines["data"])))
    return out


def test_slow_client_drops_oldest_frames_and_sees_the_count() -> None:
    async def scenario() -> list[tuple[str, dict[str, object]]]:
        hub = Broadcaster(queue_size=4)
        client = hub.subscribe(asyncio.get_running_loop(), kinds=("sample",))
        stream = client.frames()
        opening = await stream.__anext__()
        assert opening.startswith(":")

        def publisher() -> None:  # another thread, as the sampler is
            for i in range(10):
                hub.publish("sample", {"n": i})

        started = time.monotonic()
        thread = threading.Thread(target=publisher)
        thread.start()
        thread.join()
        assert time.monotonic() - started < 1.0, "publishing must never wait for a client"
        texts = [await stream.__anext__() for _ in range(4)]
        hub.unsubscribe(client)
        return _frames(texts)

    frames = asyncio.run(scenario())
    assert [data["n"] for _, data in frames] == [6, 7, 8, 9]
    assert all(data["dropped"] == 6 for _, data in frames)


def test_filters_by_kind_and_run() -> None:
    async def scenario() -> list[tuple[str, dict[str, object]]]:
        hub = Broadcaster()
        client = hub.subscribe(asyncio.get_running_loop(), kinds=("run", "event"), run_id="r1")
        stream = client.frames()
        await stream.__anext__()
        hub.publish("sample", {"n": 1})
        hub.publish("run", {"id": "r2"}, "r2")
        hub.publish("run", {"id": "r1"}, "r1")
        hub.publish("event", {"type": "progress"}, "r1")
        texts = [await stream.__anext__() for _ in range(2)]
        hub.close_all()
        rest = [t async for t in stream]
        assert rest == []
        return _frames(texts)

    frames = asyncio.run(scenario())
    assert [kind for kind, _ in frames] == ["run", "event"]
    assert frames[0][1]["id"] == "r1"
