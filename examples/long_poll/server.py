"""Long-poll HTTP server: a GET waits in a purgatory until a message arrives.

    python examples/long_poll/server.py --host 127.0.0.1 --port 8080

POST /topics/{name}                    append the body (UTF-8) -> {"offset": n}
GET  /topics/{name}?after=N&timeout=S  messages with offsets > N (200), waiting up to
                                       S seconds for one to arrive; 204 if none did
GET  /stats                            the purgatory's counts as JSON
GET  /metrics                          Prometheus text (needs the metrics extra)

Each waiting GET is one operation watched under its topic's name; a POST notifies
that name. A client that hangs up cancels its handler (``handler_cancellation``),
and cancelling the task that awaits an operation takes it out of the purgatory.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import math
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from aiohttp import web

import aiopurgatory as ap

if TYPE_CHECKING or __package__:
    from . import topics
else:  # run as a script: the shared topics module beside it
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import topics


class LongPollService:
    """The topics, the purgatory holding the waiting GETs, and the HTTP handlers."""

    def __init__(self, limits: topics.Limits) -> None:
        self.limits = limits
        self.topics = topics.Topics(limits)
        self.registry, observer = topics.metrics_registry()
        self.purgatory = ap.Purgatory("long-poll", observer=observer)
        if observer is not None:
            observer.track(self.purgatory)

    def app(self) -> web.Application:
        # client_max_size: read() answers 413 beyond max_message_bytes.
        app = web.Application(client_max_size=self.limits.max_message_bytes)
        app.router.add_post("/topics/{name}", self.publish)
        app.router.add_get("/topics/{name}", self.poll)
        app.router.add_get("/stats", self.stats)
        if self.registry is not None:
            app.router.add_get("/metrics", self.metrics)
        # Shutdown runs before aiohttp waits for the open requests: closing the
        # purgatory here answers every waiting GET (503) instead of stalling it.
        app.on_shutdown.append(self._close)
        return app

    async def publish(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        if self.purgatory.closed:
            raise web.HTTPServiceUnavailable(text="the server is shutting down\n")
        # client_max_size (max_message_bytes) makes read() answer 413 beyond it.
        # aiohttp bounds nothing once the headers are in: a body that never arrives
        # would hold the connection, hence a slot of max_connections, for ever.
        try:
            async with asyncio.timeout(self.limits.body_timeout):
                body = await request.read()
        except TimeoutError:
            return await _request_timeout(request, self.limits.body_timeout)
        try:
            message = body.decode("utf-8")
        except UnicodeDecodeError:
            raise web.HTTPBadRequest(text="the message must be UTF-8 text\n") from None
        if not message:
            raise web.HTTPBadRequest(text="the message must not be empty\n")
        try:
            offset = self.topics.publish(name, message, len(body))
        except topics.TooManyTopics as exc:
            retry = {"Retry-After": "5"}
            raise web.HTTPServiceUnavailable(text=f"{exc}\n", headers=retry) from None
        # Coalesced: a burst of POSTs in one loop pass re-checks the waiters once.
        self.purgatory.notify(name)
        return web.json_response({"offset": offset})

    async def poll(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        after = _int_param(request, "after", default=-1)
        # Absurd timeouts: nan, inf and negatives get 400, huge ones the cap.
        timeout = _seconds_param(request, "timeout", default=self.limits.max_timeout)
        timeout = min(timeout, self.limits.max_timeout)
        topic = self.topics.get(name)
        end = topic.end if topic is not None else 0
        if not -1 <= after < end:
            raise web.HTTPBadRequest(
                text=f"after must be between -1 and {end - 1} (the last offset), got {after}\n"
            )

        def has_news() -> bool:
            current = self.topics.get(name)  # created by the first POST
            return current is not None and current.end > after + 1

        if topic is not None:
            self.topics.begin_wait(topic)  # a topic somebody waits on does not expire
        try:
            arrived = await self.purgatory.wait_for([name], has_news, timeout)
        except ap.PurgatoryClosed:
            raise web.HTTPServiceUnavailable(text="the server is shutting down\n") from None
        finally:
            if topic is not None:
                self.topics.end_wait(topic)
        current = self.topics.get(name)
        if not arrived or current is None:
            return web.Response(status=204)
        messages = current.read(after, self.limits.max_response_bytes)
        return web.json_response({"messages": messages})

    async def stats(self, request: web.Request) -> web.Response:
        return web.json_response(dataclasses.asdict(self.purgatory.stats))

    async def metrics(self, request: web.Request) -> web.Response:
        import prometheus_client

        assert self.registry is not None  # the route exists only then
        response = web.Response(body=prometheus_client.generate_latest(self.registry))
        response.headers["Content-Type"] = prometheus_client.CONTENT_TYPE_LATEST
        return response

    async def _close(self, app: web.Application) -> None:
        self.purgatory.close()


async def _request_timeout(request: web.Request, seconds: float) -> web.StreamResponse:
    """408 and the connection closed at once: not lingering to drain the rest of the
    body as aiohttp does after a response, which would wait on the same slow client."""
    response = web.Response(
        status=408, text=f"the request body did not arrive within {seconds:g} s\n"
    )
    response.force_close()  # Connection: close
    await response.prepare(request)
    await response.write_eof()
    request.protocol.force_close()  # close() sends what is buffered first
    return response


def _int_param(request: web.Request, name: str, *, default: int) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise web.HTTPBadRequest(text=f"{name} must be an integer, got {raw!r}\n") from None


def _seconds_param(request: web.Request, name: str, *, default: float) -> float:
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds >= 0):
        raise web.HTTPBadRequest(text=f"{name} must be a number of seconds >= 0, got {raw!r}\n")
    return seconds


_REFUSAL = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\n"
    b"Content-Length: 21\r\nConnection: close\r\n\r\ntoo many connections\n"
)


class _Refuse(asyncio.Protocol):
    """A connection over ``max_connections``: 503, then closed."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.WriteTransport)
        transport.write(_REFUSAL)
        transport.close()


async def serve(host: str, port: int, limits: topics.Limits) -> None:
    service = LongPollService(limits)
    # handler_cancellation: a client hanging up cancels its handler, hence its wait.
    # keepalive_timeout also runs from the connection's start and closes a connection
    # whose request is incomplete (slowloris);
    # max_line_size and max_field_size (8 KiB defaults) bound the header lines;
    # publish bounds the time to read a body (body_timeout), and lingering_time the
    # time spent draining a body a handler left unread before the connection closes.
    runner = web.AppRunner(
        service.app(),
        handler_cancellation=True,
        access_log=None,
        shutdown_timeout=5.0,
        keepalive_timeout=limits.idle_timeout,
        lingering_time=limits.body_timeout,
    )
    await runner.setup()
    server = runner.server
    assert server is not None

    def connection() -> asyncio.Protocol:
        if len(server.connections) >= limits.max_connections:
            return _Refuse()
        return server()

    loop = asyncio.get_running_loop()
    try:
        # Many clients connect at once under load: a deeper accept queue than 128.
        listener = await loop.create_server(connection, host, port, backlog=1024)
        bound_port = listener.sockets[0].getsockname()[1]
        print(f"long-poll server listening on http://{host}:{bound_port}", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        await stop.wait()
        listener.close()
    finally:
        await runner.cleanup()
    print(f"stopped: {service.purgatory.stats}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description="Long-poll HTTP server on aiopurgatory.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080, help="0 picks a free port")
    topics.add_options(parser)
    args = parser.parse_args()
    limits = topics.limits_from(parser, args)
    if not 0 <= args.port <= 65535:
        parser.error(f"--port must be between 0 and 65535, got {args.port}")
    asyncio.run(serve(args.host, args.port, limits))


if __name__ == "__main__":
    main()
