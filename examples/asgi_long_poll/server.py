"""Long-poll HTTP server on Starlette (ASGI): the HTTP API of examples/long_poll.

    python examples/asgi_long_poll/server.py --host 127.0.0.1 --port 8080
    uvicorn examples.asgi_long_poll.server:app          # the default limits
    python examples/asgi_long_poll/server.py --workers 4 --redis redis://127.0.0.1:6379/0
    REDIS_URL=redis://127.0.0.1:6379/0 uvicorn examples.asgi_long_poll.server:app --workers 4

POST /topics/{name}                    append the body (UTF-8) -> {"offset": n}
GET  /topics/{name}?after=N&timeout=S  messages with offsets > N (200), waiting up to
                                       S seconds for one to arrive; 204 if none did
GET  /stats                            the purgatory's counts as JSON, and the
                                       worker's process id ("worker")
GET  /metrics                          Prometheus text (needs the metrics extra)

:class:`aiopurgatory.asgi.CancelOnDisconnect` cancels a GET's handler, hence its
wait, when its client hangs up; :class:`aiopurgatory.asgi.PurgatoryLifespan` opens the
purgatory with the app and closes it as soon as SIGINT or SIGTERM arrives, so that
waiting polls get 503 at once instead of holding up the server's shutdown.

With ``--redis URL`` or the ``REDIS_URL`` environment variable (how ``uvicorn --workers
N`` configures each worker it imports the app in), the topics live in Redis
(examples/long_poll/redis_topics.py) and one RedisFanout per process wakes the polls
of every worker and machine; a POST Redis does not answer in time gets 503. The URL
may name any node of a Redis Cluster (primary or replica).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import importlib
import json
import math
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from uvicorn.protocols.http.h11_impl import H11Protocol

import aiopurgatory as ap
from aiopurgatory.asgi import CancelOnDisconnect, PurgatoryLifespan

EXAMPLES = Path(__file__).resolve().parents[1]
if str(EXAMPLES) not in sys.path:  # the topics of examples/long_poll, shared
    sys.path.insert(0, str(EXAMPLES))

from long_poll.topics import (  # noqa: E402
    Limits,
    StoreUnavailable,
    TooManyTopics,
    Topics,
    add_options,
    add_scale_options,
    check_scale_options,
    limits_from,
    metrics_registry,
)

if TYPE_CHECKING:
    from long_poll.redis_topics import RedisTopics

LIMITS_ENV = "LONG_POLL_LIMITS"
"""JSON of the :class:`Limits` fields the app imported by uvicorn's workers takes."""
REDIS_ENV = "REDIS_URL"
REDIS_OPTIONS_ENV = "LONG_POLL_REDIS_OPTIONS"
"""JSON: ``{"pool_size": 4, "timeout": 2.0}``, RedisTopics' options."""


class LongPollService:
    """The topics, the lifespan holding the purgatory, and the HTTP handlers."""

    def __init__(self, limits: Limits, redis: RedisTopics | None = None) -> None:
        self.limits = limits
        self.topics = Topics(limits)
        self.redis = redis
        """The topics in Redis (``--redis``, ``REDIS_URL``), or None: in :attr:`topics`."""
        self.registry, observer = metrics_registry()
        # The collector counts what finishes as the purgatory's observer and reports
        # its gauges once the lifespan has made it (track, at the first scrape).
        self.observer = observer
        self.lifespan = PurgatoryLifespan("long-poll", close_on_signals=True, observer=observer)

    @property
    def purgatory(self) -> ap.Purgatory:
        purgatory = self.lifespan.purgatory
        if purgatory is None:
            raise HTTPException(503, "the server is starting")
        return purgatory

    def app(self) -> Starlette:
        app = Starlette(
            routes=[
                Route("/topics/{name}", self.publish, methods=["POST"]),
                Route("/topics/{name}", self.poll, methods=["GET"]),
                Route("/stats", self.stats, methods=["GET"]),
                Route("/metrics", self.metrics, methods=["GET"]),
            ],
            lifespan=self.lifespan if self.redis is None else self._redis_lifespan,
        )
        app.add_middleware(CancelOnDisconnect)
        return app

    @contextlib.asynccontextmanager
    async def _redis_lifespan(self, app: object) -> AsyncIterator[dict[str, Any]]:
        """The purgatory's lifespan, with the Redis fanout attached to it inside."""
        assert self.redis is not None
        async with self.lifespan(app) as state:
            # A fanout made for this lifespan and closed at its end: the app may run
            # several lifespans one after another (as two TestClient(app) do).
            self.redis.start(self.lifespan.current())
            try:
                yield state
            finally:
                await self.redis.aclose()

    async def publish(self, request: Request) -> Response:
        name = request.path_params["name"]
        purgatory = self.purgatory
        if purgatory.closed:
            raise HTTPException(503, "the server is shutting down")
        body = await self._read_body(request)
        try:
            message = body.decode("utf-8")
        except UnicodeDecodeError:
            raise HTTPException(400, "the message must be UTF-8 text") from None
        if not message:
            raise HTTPException(400, "the message must not be empty")
        if self.redis is not None:
            try:
                offset = await self.redis.publish(name, message, len(body))
            except TooManyTopics as exc:
                raise HTTPException(503, str(exc), headers={"Retry-After": "5"}) from None
            except StoreUnavailable as exc:
                raise HTTPException(503, str(exc), headers={"Retry-After": "1"}) from None
            return JSONResponse({"offset": offset})
        try:
            offset = self.topics.publish(name, message, len(body))
        except TooManyTopics as exc:
            raise HTTPException(503, str(exc), headers={"Retry-After": "5"}) from None
        purgatory.notify(name)  # coalesced: a burst of POSTs re-checks the waiters once
        return JSONResponse({"offset": offset})

    async def _read_body(self, request: Request) -> bytes:
        """The body, or 413 as soon as it is longer than ``max_message_bytes``, or 408
        and the connection closed if it is not all in within ``body_timeout``."""
        limit = self.limits.max_message_bytes
        length = request.headers.get("content-length", "")
        if length.isdigit() and int(length) > limit:
            raise HTTPException(413, f"the message is longer than {limit} bytes")
        chunks: list[bytes] = []
        size = 0
        # Neither uvicorn nor hypercorn bounds the time to read a body once the headers
        # are in (hypercorn's --read-timeout bounds each silence, not a trickle): a body
        # that never arrives would hold the connection, hence a slot, for ever. Here,
        # in the app, the bound holds under any server.
        seconds = self.limits.body_timeout
        try:
            async with asyncio.timeout(seconds):
                async for chunk in request.stream():
                    size += len(chunk)
                    if size > limit:
                        raise HTTPException(413, f"the message is longer than {limit} bytes")
                    chunks.append(chunk)
        except TimeoutError:
            # Connection: close makes the server close the connection after the 408
            # instead of waiting for the rest of the body.
            raise HTTPException(
                408,
                f"the request body did not arrive within {seconds:g} s",
                headers={"Connection": "close"},
            ) from None
        return b"".join(chunks)

    async def poll(self, request: Request) -> Response:
        name = request.path_params["name"]
        purgatory = self.purgatory
        after = _int_param(request, "after", default=-1)
        # Absurd timeouts: nan, inf and negatives get 400, huge ones the cap.
        timeout = min(
            _seconds_param(request, "timeout", default=self.limits.max_timeout),
            self.limits.max_timeout,
        )
        if self.redis is not None:
            return await self._poll_redis(self.redis, purgatory, name, after, timeout)
        topic = self.topics.get(name)
        end = topic.end if topic is not None else 0
        if not -1 <= after < end:
            raise HTTPException(
                400, f"after must be between -1 and {end - 1} (the last offset), got {after}"
            )

        def has_news() -> bool:
            current = self.topics.get(name)  # created by the first POST
            return current is not None and current.end > after + 1

        if topic is not None:
            self.topics.begin_wait(topic)  # a topic somebody waits on does not expire
        try:
            arrived = await purgatory.wait_for([name], has_news, timeout)
        except ap.PurgatoryClosed:
            raise HTTPException(503, "the server is shutting down") from None
        finally:
            if topic is not None:
                self.topics.end_wait(topic)
        current = self.topics.get(name)
        if not arrived or current is None:
            return Response(status_code=204)
        return JSONResponse({"messages": current.read(after, self.limits.max_response_bytes)})

    async def _poll_redis(
        self, redis: RedisTopics, purgatory: ap.Purgatory, name: str, after: int, timeout: float
    ) -> Response:
        BadOffset = _redis_topics().BadOffset

        if purgatory.closed:
            raise HTTPException(503, "the server is shutting down")
        try:
            messages = await redis.poll(purgatory, name, after, timeout)
        except BadOffset as exc:
            raise HTTPException(400, str(exc)) from None
        except StoreUnavailable as exc:
            raise HTTPException(503, str(exc), headers={"Retry-After": "1"}) from None
        except ap.PurgatoryClosed:
            raise HTTPException(503, "the server is shutting down") from None
        if messages is None:
            return Response(status_code=204)
        return JSONResponse({"messages": messages})

    async def stats(self, request: Request) -> Response:
        # Never waits on Redis: what this worker counts and knows.
        result = {"worker": os.getpid(), **dataclasses.asdict(self.purgatory.stats)}
        if self.redis is not None:
            result.update(self.redis.stats())
        return JSONResponse(result)

    async def metrics(self, request: Request) -> Response:
        if self.registry is None or self.observer is None:
            raise HTTPException(404, "needs the metrics extra (prometheus-client)")
        import prometheus_client

        self.observer.track(self.purgatory)  # once: tracking again is a no-op
        return Response(
            prometheus_client.generate_latest(self.registry),
            media_type=prometheus_client.CONTENT_TYPE_LATEST,
        )


def _int_param(request: Request, name: str, *, default: int) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise HTTPException(400, f"{name} must be an integer, got {raw!r}") from None


def _seconds_param(request: Request, name: str, *, default: float) -> float:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds >= 0):
        raise HTTPException(400, f"{name} must be a number of seconds >= 0, got {raw!r}")
    return seconds


def header_timeout_protocol(seconds: float) -> type[H11Protocol]:
    """Uvicorn's h11 protocol, closing a connection that has not sent a complete
    request within ``seconds`` of its start or of its last response (slowloris)."""

    class HeaderTimeoutH11Protocol(H11Protocol):
        _header_timer: Any = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
            super().connection_lost(exc)

        def _arm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
            self._header_timer = self.loop.call_later(seconds, self._expire)

        def _expire(self) -> None:
            self._header_timer = None
            idle = self.cycle is None or self.cycle.response_complete
            if idle and not self.transport.is_closing():
                self.transport.close()

    return HeaderTimeoutH11Protocol


def uvicorn_options(limits: Limits) -> dict[str, Any]:
    """Uvicorn's settings for ``limits``: connections, idle and header timeouts."""
    return {
        # 503 beyond. Uvicorn counts the connection asking among those open: + 1 lets
        # max_connections connections be served, as on the aiohttp server.
        "limit_concurrency": limits.max_connections + 1,
        "timeout_keep_alive": limits.idle_timeout,
        "http": header_timeout_protocol(limits.idle_timeout),
        "h11_max_incomplete_event_size": 16 * 1024,  # bytes of request line and headers
        "backlog": 1024,
        "access_log": False,
        "timeout_graceful_shutdown": 5,
    }


def _redis_topics() -> Any:
    """The Redis store's module (needs redis-py), imported only with a Redis URL."""
    return importlib.import_module("long_poll.redis_topics")


def create_app(
    limits: Limits | None = None,
    *,
    redis: str | None = None,
    redis_pool: int = 4,
    redis_timeout: float = 2.0,
) -> Starlette:
    limits = limits or Limits()
    store = None
    if redis:
        store = _redis_topics().RedisTopics(
            redis, limits, pool_size=redis_pool, timeout=redis_timeout
        )
    return LongPollService(limits, store).app()


def limits_from_env() -> Limits:
    """The limits ``main`` hands to uvicorn's workers, or the defaults."""
    raw = os.environ.get(LIMITS_ENV)
    return Limits(**json.loads(raw)) if raw else Limits()


def create_app_from_env() -> Starlette:
    """The app as configured by the environment: ``REDIS_URL`` (empty or unset: the
    topics in memory), ``LONG_POLL_LIMITS``, ``LONG_POLL_REDIS_OPTIONS``."""
    options = json.loads(os.environ.get(REDIS_OPTIONS_ENV) or "{}")
    return create_app(
        limits_from_env(),
        redis=os.environ.get(REDIS_ENV) or None,
        redis_pool=int(options.get("pool_size", 4)),
        redis_timeout=float(options.get("timeout", 2.0)),
    )


app = create_app_from_env()
"""For ``uvicorn examples.asgi_long_poll.server:app [--workers N]``: the default limits
and the topics in memory, or in Redis when ``REDIS_URL`` is set; uvicorn's own
connection settings (give it ``--limit-concurrency`` and ``--timeout-keep-alive``)."""

WorkerH11Protocol = header_timeout_protocol(limits_from_env().idle_timeout)
"""The header timeout for ``main``'s workers, which uvicorn imports by name."""


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description="Long-poll ASGI server on aiopurgatory.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080, help="0 picks a free port")
    add_options(parser)
    add_scale_options(parser)
    args = parser.parse_args(argv)
    limits = limits_from(parser, args)
    if not 0 <= args.port <= 65535:
        parser.error(f"--port must be between 0 and 65535, got {args.port}")
    check_scale_options(parser, args)
    options = uvicorn_options(limits)
    # Bound here to report the port --port 0 picked; uvicorn serves on it.
    sock = socket.create_server((args.host, args.port), backlog=options.pop("backlog"))
    print(f"asgi long-poll server listening on http://{args.host}:{sock.getsockname()[1]}")
    sys.stdout.flush()
    # Uvicorn re-raises the signal that stopped it once it is done: exit 0 then.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    if args.workers == 1:
        application = create_app(
            limits,
            redis=args.redis,
            redis_pool=args.redis_pool,
            redis_timeout=args.redis_timeout,
        )
        config = uvicorn.Config(application, log_level="warning", **options)
        uvicorn.Server(config).run(sockets=[sock])
        return
    # Workers: uvicorn starts fresh processes that import the app by name, so the
    # configuration goes through the environment, as under `uvicorn --workers`.
    from uvicorn.supervisors import Multiprocess

    os.environ[LIMITS_ENV] = json.dumps(dataclasses.asdict(limits))
    os.environ[REDIS_ENV] = args.redis
    os.environ[REDIS_OPTIONS_ENV] = json.dumps(
        {"pool_size": args.redis_pool, "timeout": args.redis_timeout}
    )
    root = str(EXAMPLES.parent)
    if root not in sys.path:
        sys.path.insert(0, root)  # the workers inherit it: `examples.` imports there
    options["http"] = "examples.asgi_long_poll.server:WorkerH11Protocol"
    config = uvicorn.Config(
        "examples.asgi_long_poll.server:app",
        log_level="warning",
        workers=args.workers,
        **options,
    )
    Multiprocess(config, sockets=[sock]).run()


if __name__ == "__main__":
    main()
