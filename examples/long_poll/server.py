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
from typing import TYPE_CHECKING, Final

from aiohttp import web

import aiopurgatory as ap

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from aiopurgatory.metrics import PurgatoryCollector

MAX_MESSAGES: Final = 1000
"""Messages in one response at most; the client asks again after the last one."""


class Topic:
    """An append-only log of messages keeping the newest ``retain`` or more of them."""

    __slots__ = ("base", "messages", "retain")

    def __init__(self, retain: int) -> None:
        self.base = 0
        """Offset of ``messages[0]``."""
        self.messages: list[str] = []
        self.retain = retain

    @property
    def end(self) -> int:
        """The offset the next message will get."""
        return self.base + len(self.messages)

    def append(self, message: str) -> int:
        self.messages.append(message)
        if len(self.messages) >= 2 * self.retain:  # trim in bulk: O(1) amortised
            dropped = len(self.messages) - self.retain
            del self.messages[:dropped]
            self.base += dropped
        return self.end - 1

    def read(self, after: int) -> list[dict[str, object]]:
        start = max(after + 1 - self.base, 0)
        batch = self.messages[start : start + MAX_MESSAGES]
        return [{"offset": self.base + start + i, "value": m} for i, m in enumerate(batch)]


class LongPollService:
    """The topics, the purgatory holding the waiting GETs, and the HTTP handlers."""

    def __init__(self, *, max_timeout: float, retain: int) -> None:
        self.max_timeout = max_timeout
        self.retain = retain
        self.topics: dict[str, Topic] = {}
        self.registry, observer = _metrics()
        self.purgatory = ap.Purgatory("long-poll", observer=observer)
        if observer is not None:
            observer.track(self.purgatory)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/topics/{name}", self.publish)
        app.router.add_get("/topics/{name}", self.poll)
        app.router.add_get("/stats", self.stats)
        if self.registry is not None:
            app.router.add_get("/metrics", self.metrics)
        # Shutdown runs before aiohttp waits for the open requests: closing the
        # purgatory here answers every waiting GET (503) instead of stalling it.
        app.on_shutdown.append(self._close)
        return app

    async def publish(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if self.purgatory.closed:
            raise web.HTTPServiceUnavailable(text="the server is shutting down\n")
        try:
            message = (await request.read()).decode("utf-8")
        except UnicodeDecodeError:
            raise web.HTTPBadRequest(text="the message must be UTF-8 text\n") from None
        if not message:
            raise web.HTTPBadRequest(text="the message must not be empty\n")
        topic = self.topics.get(name)
        if topic is None:
            topic = self.topics[name] = Topic(self.retain)
        offset = topic.append(message)
        # Coalesced: a burst of POSTs in one loop pass re-checks the waiters once.
        self.purgatory.notify(name)
        return web.json_response({"offset": offset})

    async def poll(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        after = _int_param(request, "after", default=-1)
        timeout = _seconds_param(request, "timeout", default=self.max_timeout)
        timeout = min(timeout, self.max_timeout)
        topic = self.topics.get(name)
        end = topic.end if topic is not None else 0
        if not -1 <= after < end:
            raise web.HTTPBadRequest(
                text=f"after must be between -1 and {end - 1} (the last offset), got {after}\n"
            )

        def has_news() -> bool:
            current = self.topics.get(name)  # created by the first POST
            return current is not None and current.end > after + 1

        try:
            arrived = await self.purgatory.wait_for([name], has_news, timeout)
        except ap.PurgatoryClosed:
            raise web.HTTPServiceUnavailable(text="the server is shutting down\n") from None
        if not arrived:
            return web.Response(status=204)
        return web.json_response({"messages": self.topics[name].read(after)})

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


def _metrics() -> tuple[CollectorRegistry | None, PurgatoryCollector | None]:
    """A Prometheus registry and the collector in it, if the metrics extra is installed."""
    try:
        from prometheus_client import CollectorRegistry

        from aiopurgatory.metrics import PurgatoryCollector
    except ImportError:
        return None, None
    registry = CollectorRegistry()
    collector = PurgatoryCollector()
    registry.register(collector)
    return registry, collector


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


async def serve(host: str, port: int, *, max_timeout: float, retain: int) -> None:
    service = LongPollService(max_timeout=max_timeout, retain=retain)
    # handler_cancellation: a client hanging up cancels its handler, hence its wait.
    runner = web.AppRunner(
        service.app(), handler_cancellation=True, access_log=None, shutdown_timeout=5.0
    )
    await runner.setup()
    try:
        # Many clients connect at once under load: a deeper accept queue than 128.
        await web.TCPSite(runner, host, port, backlog=1024).start()
        bound_port = runner.addresses[0][1]
        print(f"long-poll server listening on http://{host}:{bound_port}", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        await stop.wait()
    finally:
        await runner.cleanup()
    print(f"stopped: {service.purgatory.stats}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description="Long-poll HTTP server on aiopurgatory.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080, help="0 picks a free port")
    parser.add_argument(
        "--max-timeout", type=float, default=30.0, help="cap on a GET's timeout (seconds)"
    )
    parser.add_argument("--retain", type=int, default=10_000, help="messages kept per topic")
    args = parser.parse_args()
    if not (args.max_timeout >= 0 and math.isfinite(args.max_timeout)):
        parser.error("--max-timeout must be a finite number of seconds >= 0")
    if args.retain < 1:
        parser.error("--retain must be >= 1")
    asyncio.run(serve(args.host, args.port, max_timeout=args.max_timeout, retain=args.retain))


if __name__ == "__main__":
    main()
