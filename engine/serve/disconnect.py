"""A client that leaves while its non-streamed reply is generated.

``DisconnectWatch`` watches the connection while a handler awaits the engine; when the
client goes, ``wait_for`` raises ``ClientGone``, the handler's cleanup cancels the request
in the engine (its blocks are freed), and errors.py logs one line: a client leaving is
routine (a closed tab, a timeout on its side), not a server fault with a traceback.
(A streamed reply watches its connection itself: responses.EventStream.)
"""

from __future__ import annotations

import asyncio

from fastapi import Request


class ClientGone(Exception):
    def __init__(self, request_id: str) -> None:
        super().__init__(f"the client left before the reply to {request_id} was ready")
        self.request_id = request_id


class DisconnectWatch:
    def __init__(self, request: Request, request_id: str) -> None:
        self._request_id = request_id
        self._task = asyncio.ensure_future(_disconnected(request))

    async def wait_for(self, awaitable):
        task = asyncio.ensure_future(awaitable)
        done, _ = await asyncio.wait({task, self._task}, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            return task.result()
        task.cancel()
        raise ClientGone(self._request_id)

    def close(self) -> None:
        self._task.cancel()


async def _disconnected(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
