"""One worker of a long poll joined through Redis: run two or more (any port, any host).

GET /TOPIC?after=N waits up to 30 s for a message past offset N; POST /TOPIC stores one
and wakes every worker: python worker.py PORT REDIS_URL (port 0: a free one, printed).
"""

import asyncio
import contextlib
import sys
from collections import Counter
from collections.abc import Hashable

from aiohttp import web

import aiopurgatory as ap
from aiopurgatory.redis import FanoutUnavailable, RedisFanout

latest: dict[str, int] = {}  # the local copy: messages per topic polled here
polls: Counter[str] = Counter()  # polls here per topic, reading or waiting


async def main(port: int, url: str) -> None:
    async def refresh(topics: list[Hashable]) -> None:  # before woken topics are re-checked
        mine = [t for t in topics if isinstance(t, str) and polls[t]]
        async with fanout.client.pipeline(transaction=False) as pipe:
            for topic in mine:
                pipe.llen(f"m:{topic}")
            for topic, n in zip(mine, await pipe.execute(), strict=True):
                latest[topic] = max(latest.get(topic, 0), n)

    async def get(request: web.Request) -> web.Response:
        topic, after = request.match_info["topic"], int(request.query.get("after", 0))
        polls[topic] += 1  # counted first: a wake-up from now on refreshes our copy
        try:
            n = await fanout.client.llen(f"m:{topic}")  # then read
            latest[topic] = max(latest.get(topic, 0), n)
            if not await purgatory.wait_for([topic], lambda: latest[topic] > after, 30):
                return web.Response(status=204)
            new = await fanout.client.lrange(f"m:{topic}", after, -1)
        except FanoutUnavailable:
            return web.Response(status=503)
        finally:
            polls[topic] -= 1
            if not polls[topic]:  # nobody polls it here: forget the copy
                del polls[topic]
                latest.pop(topic, None)
        return web.json_response({"next": after + len(new), "messages": new})

    async def post(request: web.Request) -> web.Response:
        topic, body = request.match_info["topic"], await request.read()
        try:
            offset = await fanout.client.rpush(f"m:{topic}", body)  # the data first
        except FanoutUnavailable:
            return web.Response(status=503)  # not stored (or, after a timeout, not known)
        # Then the wake-up, to every worker. If it fails, the message is stored all the
        # same: a 503 would make the client send it again, storing it twice.
        with contextlib.suppress(FanoutUnavailable):
            await fanout.publish(topic)
        return web.json_response({"offset": offset})

    async with (
        ap.Purgatory("polls") as purgatory,
        RedisFanout(url, refresh=refresh, redis_options={"decode_responses": True}) as fanout,
    ):
        fanout.attach(purgatory)
        app = web.Application()
        app.add_routes([web.get("/{topic}", get), web.post("/{topic}", post)])
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", port)
        await site.start()
        print(f"listening on {runner.addresses[0][1]}", flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), sys.argv[2]))
