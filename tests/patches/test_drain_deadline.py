"""drain-deadline's HTTP layer: what a request sees around the instant of SIGTERM.

The ASGI wrapper runs over a plain ASGI app that behaves like vLLM's completion endpoint (headers,
then a first body chunk when the first token exists, then the end). The full path, with real vLLM,
is tests/e2e/test_entrypoint_drain.py (requests sent in a loop through SIGTERM)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from vllm_intel.patches import drain_deadline as dd

POST = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": []}
GET = {"type": "http", "method": "GET", "path": "/health", "headers": []}


@pytest.fixture(autouse=True)
def fresh_state():
    dd.DRAINING.clear()
    dd.ADMITTED.__init__()
    yield
    dd.DRAINING.clear()
    dd.ADMITTED.__init__()


class Endpoint:
    """An ASGI app streaming one chunk when `first` is set and ending when `end` is set."""

    def __init__(self):
        self.first, self.end = asyncio.Event(), asyncio.Event()
        self.called = 0

    async def __call__(self, scope, receive, send):
        self.called += 1
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await self.first.wait()
        await send({"type": "http.response.body", "body": b"data: x\n\n", "more_body": True})
        await self.end.wait()
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def call(app, scope):
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    await app(scope, receive, send)
    return sent


def test_while_draining_work_gets_503_and_reads_pass():
    async def main():
        ep = Endpoint()
        app = dd.RefuseWhileDraining(ep)
        dd.DRAINING.set()
        refused = await call(app, POST)
        ep.first.set()
        ep.end.set()
        read = await call(app, GET)
        return ep.called, refused, read

    called, refused, read = asyncio.run(main())
    start = refused[0]
    assert start["status"] == 503 and (b"connection", b"close") in start["headers"]
    assert called == 1 and read[0]["status"] == 200  # only the GET reached the app


def test_shutdown_waits_until_an_accepted_request_has_its_first_byte():
    waited: dict = {}

    def shutdown_thread():  # what vLLM's executor thread does in AsyncLLM.shutdown
        t0 = time.monotonic()
        waited["left"] = dd.ADMITTED.wait_empty(10)
        waited["took"] = time.monotonic() - t0

    async def main():
        ep = Endpoint()
        app = dd.RefuseWhileDraining(ep)
        request = asyncio.create_task(call(app, POST))
        await asyncio.sleep(0.05)  # accepted, on its way to the engine
        assert len(dd.ADMITTED) == 1
        dd.DRAINING.set()  # SIGTERM now
        t = threading.Thread(target=shutdown_thread)
        t.start()
        await asyncio.sleep(0.5)
        assert "left" not in waited, "the drain started before the accepted request got going"
        ep.first.set()  # its first token
        await asyncio.to_thread(t.join, 5)
        ep.end.set()
        return await request

    sent = asyncio.run(main())
    assert waited["left"] == 0 and 0.4 < waited["took"] < 3, waited
    assert sent[0]["status"] == 200 and sent[1]["body"] == b"data: x\n\n"


def test_the_wait_is_bounded_and_ended_requests_do_not_count():
    async def main():
        ep = Endpoint()
        app = dd.RefuseWhileDraining(ep)
        stuck = asyncio.create_task(call(app, POST))
        await asyncio.sleep(0.05)
        t0 = time.monotonic()
        left = await asyncio.to_thread(dd.ADMITTED.wait_empty, 0.3)
        took = time.monotonic() - t0
        stuck.cancel()  # the client went away: the request ends without a body
        await asyncio.gather(stuck, return_exceptions=True)
        return left, took, len(dd.ADMITTED)

    left, took, after = asyncio.run(main())
    assert left == 1 and 0.25 < took < 2
    assert after == 0
