"""Long-poll HTTP server: a GET waits in a purgatory until a message arrives.

    python examples/long_poll/server.py --host 127.0.0.1 --port 8080
    python examples/long_poll/server.py --workers 4 --redis redis://127.0.0.1:6379/0

POST /topics/{name}                    append the body (UTF-8) -> {"offset": n}
GET  /topics/{name}?after=N&timeout=S  messages with offsets > N (200), waiting up to
                                       S seconds for one to arrive; 204 if none did
GET  /stats                            the purgatory's counts as JSON, and the
                                       worker's process id ("worker")
GET  /metrics                          Prometheus text (needs the metrics extra)

Each waiting GET is one operation watched under its topic's name; a POST notifies
that name. A client that hangs up cancels its handler (``handler_cancellation``),
and cancelling the task that awaits an operation takes it out of the purgatory.

With ``--redis URL`` (or ``REDIS_URL``) the topics live in Redis (see redis_topics.py)
and one RedisFanout per process wakes the polls of every worker and machine; then
``--workers N`` runs N processes accepting on one port. A POST Redis does not answer
in time gets 503. The URL may name any node of a Redis Cluster (primary or replica).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import importlib
import math
import os
import signal
import socket
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

import aiopurgatory as ap

if TYPE_CHECKING or __package__:
    from . import topics
else:  # run as a script: the shared topics module beside it
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import topics

if TYPE_CHECKING:
    from .redis_topics import RedisTopics


class LongPollService:
    """The topics, the purgatory holding the waiting GETs, and the HTTP handlers."""

    def __init__(self, limits: topics.Limits, redis: RedisTopics | None = None) -> None:
        self.limits = limits
        self.topics = topics.Topics(limits)
        self.redis = redis
        """The topics in Redis (``--redis``), or None: in :attr:`topics`."""
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
        if self.redis is not None:
            app.on_startup.append(self._start_redis)
            app.on_cleanup.append(self._close_redis)
        return app

    async def _start_redis(self, app: web.Application) -> None:
        assert self.redis is not None
        self.redis.start(self.purgatory)

    async def _close_redis(self, app: web.Application) -> None:
        assert self.redis is not None
        await self.redis.aclose()

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
        if self.redis is not None:
            try:
                offset = await self.redis.publish(name, message, len(body))
            except (topics.TooManyTopics, topics.StoreUnavailable) as exc:
                retry = {"Retry-After": "5" if isinstance(exc, topics.TooManyTopics) else "1"}
                raise web.HTTPServiceUnavailable(text=f"{exc}\n", headers=retry) from None
            return web.json_response({"offset": offset})
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
        if self.redis is not None:
            return await self._poll_redis(self.redis, name, after, timeout)
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

    async def _poll_redis(
        self, redis: RedisTopics, name: str, after: int, timeout: float
    ) -> web.Response:
        BadOffset = _redis_topics().BadOffset

        if self.purgatory.closed:
            raise web.HTTPServiceUnavailable(text="the server is shutting down\n")
        try:
            messages = await redis.poll(self.purgatory, name, after, timeout)
        except BadOffset as exc:
            raise web.HTTPBadRequest(text=f"{exc}\n") from None
        except topics.StoreUnavailable as exc:
            headers = {"Retry-After": "1"}
            raise web.HTTPServiceUnavailable(text=f"{exc}\n", headers=headers) from None
        except ap.PurgatoryClosed:
            raise web.HTTPServiceUnavailable(text="the server is shutting down\n") from None
        if messages is None:
            return web.Response(status=204)
        return web.json_response({"messages": messages})

    async def stats(self, request: web.Request) -> web.Response:
        # Never waits on Redis: what this worker counts and knows.
        result = {"worker": os.getpid(), **dataclasses.asdict(self.purgatory.stats)}
        if self.redis is not None:
            result.update(self.redis.stats())
        return web.json_response(result)

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


def _redis_topics() -> Any:
    """The Redis store's module (needs redis-py), imported only with ``--redis``."""
    if __package__:
        from . import redis_topics

        return redis_topics
    return importlib.import_module("redis_topics")  # run as a script: the one beside it


async def serve(
    host: str,
    port: int,
    limits: topics.Limits,
    *,
    redis: str | None = None,
    redis_pool: int = 4,
    redis_timeout: float = 2.0,
    sock: socket.socket | None = None,
) -> None:
    """Serve on ``host:port``, or on ``sock`` (a worker: the parent bound it)."""
    store = None
    if redis:
        store = _redis_topics().RedisTopics(
            redis, limits, pool_size=redis_pool, timeout=redis_timeout
        )
    service = LongPollService(limits, store)
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
        if sock is None:
            listener = await loop.create_server(connection, host, port, backlog=1024)
            bound_port = listener.sockets[0].getsockname()[1]
            print(f"long-poll server listening on http://{host}:{bound_port}", flush=True)
        else:
            listener = await loop.create_server(connection, sock=sock, backlog=1024)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        await stop.wait()
        listener.close()
    finally:
        await runner.cleanup()
    print(f"stopped: {service.purgatory.stats}", flush=True)


def run_workers(workers: int, host: str, port: int, **options: Any) -> int:
    """Bind once, fork ``workers`` processes serving the one socket (the kernel gives
    each connection to one of them), forward SIGINT/SIGTERM, reap them; returns the
    exit status (0 if every worker ended cleanly)."""
    sock = socket.create_server((host, port), backlog=1024)
    print(f"long-poll server listening on http://{host}:{sock.getsockname()[1]}", flush=True)
    children: set[int] = set()
    for _ in range(workers):
        pid = os.fork()
        if pid == 0:  # the worker: its own event loop, Redis connections and fanout
            status = 0
            try:
                asyncio.run(serve(host, port, sock=sock, **options))
            except BaseException:
                traceback.print_exc()
                status = 1
            finally:
                os._exit(status)
        children.add(pid)
    sock.close()

    def forward(signum: int, frame: object) -> None:
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signum)

    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGTERM, forward)
    worst = 0
    while children:
        pid, status = os.wait()
        children.discard(pid)
        code = os.waitstatus_to_exitcode(status)
        if code != 0:
            print(f"worker {pid} ended with status {code}", file=sys.stderr, flush=True)
            worst = worst or 1
    return worst


def main() -> None:
    parser = argparse.ArgumentParser(description="Long-poll HTTP server on aiopurgatory.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080, help="0 picks a free port")
    topics.add_options(parser)
    topics.add_scale_options(parser)
    args = parser.parse_args()
    limits = topics.limits_from(parser, args)
    if not 0 <= args.port <= 65535:
        parser.error(f"--port must be between 0 and 65535, got {args.port}")
    topics.check_scale_options(parser, args)
    options: dict[str, Any] = {
        "limits": limits,
        "redis": args.redis,
        "redis_pool": args.redis_pool,
        "redis_timeout": args.redis_timeout,
    }
    if args.workers > 1:
        sys.exit(run_workers(args.workers, args.host, args.port, **options))
    asyncio.run(serve(args.host, args.port, **options))


if __name__ == "__main__":
    main()
