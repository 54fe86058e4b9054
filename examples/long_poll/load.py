"""Load the long-poll server: many concurrent long polls, publishers at a set rate.

    python examples/long_poll/load.py --url http://127.0.0.1:8080 --clients 10000

Every client long-polls one topic over its own connection, following the offsets.
Once every client's poll waits in the server (or ``--ramp-limit`` passes) the run
proper starts: for ``--duration`` seconds a publisher posts messages, and a fifth of
the clients hang up mid-wait at random moments. Then the publisher posts a last
message to every topic; each remaining client stops once it holds that message,
having seen every offset before it. The exit status is 0 only if every client
finished that way, no poll failed or saw a gap, and the server is left holding
nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import resource
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import aiohttp

LAST = "end"
"""The message the publisher ends every topic with."""


@dataclass
class Tally:
    polls: int = 0
    answered: int = 0
    timed_out: int = 0
    delivered: int = 0
    disconnected: int = 0
    caught_up: int = 0
    """Clients that stopped holding every message, the last one included."""
    errors: list[str] = field(default_factory=list)
    gaps: int = 0
    """Polls whose messages did not follow on from the client's last offset."""
    peak_waiting: int = 0
    """Most polls the server held at once, as sampled."""


@dataclass
class Client:
    topic: str
    last: int = -1
    """The last offset it received."""
    done: bool = False
    """It received the topic's last message."""


class Load:
    def __init__(self, session: aiohttp.ClientSession, args: argparse.Namespace) -> None:
        self.session = session
        self.args = args
        self.url: str = args.url.rstrip("/")
        self.tally = Tally()
        self.connected_after = 0.0
        """Seconds until the server held a poll of every client."""
        self.published = 0
        self.last_offsets: dict[str, int] = {}
        self.behind = 0
        """Clients that stopped short of their topic's last offset."""

    async def run(self) -> None:
        args = self.args
        rng = random.Random(args.seed)
        run_id = uuid.uuid4().hex[:8]
        topics = [f"load-{run_id}-{i}" for i in range(args.topics)]
        loop = asyncio.get_running_loop()
        began = loop.time()
        clients = [Client(topics[i % len(topics)]) for i in range(args.clients)]
        async with asyncio.TaskGroup() as tg:
            tasks = []
            for i, client in enumerate(clients):
                tasks.append(tg.create_task(self.follow(client)))
                if i % 250 == 249:  # ramp up rather than flood the accept queue
                    await asyncio.sleep(0.05)
            await self.until_all_wait(began + args.ramp_limit)
            start = loop.time()
            self.connected_after = start - began
            tg.create_task(self.publish(topics, rng, start + args.duration))
            for task in tasks[: round(args.clients * args.disconnect)]:
                hang_up_at = start + rng.uniform(0.1, 0.9) * args.duration
                loop.call_at(hang_up_at, self.hang_up, task)
        self.behind = sum(c.done and c.last != self.last_offsets[c.topic] for c in clients)

    async def until_all_wait(self, deadline: float) -> None:
        """Return once the server holds a poll of every client, or at ``deadline``."""
        loop = asyncio.get_running_loop()
        while loop.time() < deadline:
            if (await self.server_stats())["pending"] >= self.args.clients:
                return
            await asyncio.sleep(0.2)

    async def server_stats(self) -> dict[str, Any]:
        async with self.session.get(f"{self.url}/stats") as response:
            response.raise_for_status()
            stats: dict[str, Any] = await response.json()
        self.tally.peak_waiting = max(self.tally.peak_waiting, stats["pending"])
        return stats

    def hang_up(self, task: asyncio.Task[None]) -> None:
        # Cancelling the request closes its connection: the server sees a hang-up.
        if not task.done():
            task.cancel()
            self.tally.disconnected += 1

    async def publish(self, topics: list[str], rng: random.Random, until: float) -> None:
        loop = asyncio.get_running_loop()
        interval = 1.0 / self.args.rate
        next_at = loop.time()
        while (next_at := next_at + interval) < until:
            await asyncio.sleep(next_at - loop.time())
            await self.post(rng.choice(topics), "message")
            await self.server_stats()  # a sample of the server's load
        # A last message on every topic wakes every poll: a client holding it is done.
        for topic in topics:
            await self.post(topic, LAST)

    async def post(self, topic: str, message: str) -> None:
        url = f"{self.url}/topics/{topic}"
        async with self.session.post(url, data=message.encode()) as response:
            response.raise_for_status()
            self.last_offsets[topic] = (await response.json())["offset"]
        self.published += 1

    async def follow(self, client: Client) -> None:
        try:
            while not client.done:
                await self.poll(client)
        except (aiohttp.ClientError, ValueError) as exc:
            self.tally.errors.append(f"{client.topic}: {exc!r}")
        else:
            self.tally.caught_up += 1

    async def poll(self, client: Client) -> None:
        tally = self.tally
        params = {"after": str(client.last), "timeout": str(self.args.poll_timeout)}
        tally.polls += 1
        url = f"{self.url}/topics/{client.topic}"
        async with self.session.get(url, params=params) as response:
            if response.status == 204:
                tally.timed_out += 1
                return
            if response.status != 200:
                raise ValueError(f"status {response.status}: {await response.text()}")
            messages: list[dict[str, Any]] = (await response.json())["messages"]
        tally.answered += 1
        tally.delivered += len(messages)
        offsets = [message["offset"] for message in messages]
        if offsets != list(range(client.last + 1, client.last + 1 + len(offsets))):
            tally.gaps += 1
            raise ValueError(f"gap: after {client.last} got {offsets[:3]}...")
        client.last = offsets[-1]
        client.done = messages[-1]["value"] == LAST


def raise_open_file_limit(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        if hard != resource.RLIM_INFINITY and hard < needed:
            raise SystemExit(f"{needed} open files needed, the hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


async def main_async(args: argparse.Namespace) -> bool:
    raise_open_file_limit(args.clients + 256)
    # One connection per concurrent poll, and no client-side timeout: the server's
    # timeout is what is being measured.
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        load = Load(session, args)
        before = await load.server_stats()
        started = time.monotonic()
        try:
            limit = args.ramp_limit + args.duration + 2 * args.poll_timeout + 60
            async with asyncio.timeout(limit):
                await load.run()
        except TimeoutError:
            print("gave up waiting for the clients")
        elapsed = time.monotonic() - started
        for _ in range(200):  # a hang-up reaches the server a moment after the client left
            after = await load.server_stats()
            if not after["pending"]:
                break
            await asyncio.sleep(0.05)
    tally = load.tally

    def delta(name: str) -> int:
        return int(after[name] - before[name])

    print(f"clients:       {args.clients} on {args.topics} topics")
    print(f"duration:      {elapsed:.1f} s (all waiting after {load.connected_after:.1f} s)")
    print(f"peak waiting:  {tally.peak_waiting} polls held by the server at once")
    print(f"published:     {load.published} messages ({args.rate:g}/s for {args.duration:g} s)")
    print(f"polls:         {tally.polls}")
    print(f"answered:      {tally.answered} (200, {tally.delivered} messages)")
    print(f"timed out:     {tally.timed_out} (204)")
    print(f"disconnected:  {tally.disconnected} (hung up mid-wait)")
    print(f"caught up:     {tally.caught_up} (every message, the last included)")
    print(f"errors:        {len(tally.errors)}")
    print(f"lost:          {tally.gaps + load.behind} (gaps in the offsets, clients behind)")
    print(
        f"server:        pending {after['pending']}, watched {after['watched']};"
        f" in this run completed {delta('completed')}, expired {delta('expired')},"
        f" cancelled {delta('cancelled')}; timer lag max {after['timer_lag_max'] * 1e3:.0f} ms"
        " (since it started)"
    )
    for error in tally.errors[:5]:
        print(f"  error: {error}")
    finished = tally.caught_up + tally.disconnected == args.clients
    lost = tally.gaps + load.behind
    return finished and not (tally.errors or lost or after["pending"] or after["watched"])


def main() -> None:
    parser = argparse.ArgumentParser(description="Load the long-poll example server.")
    parser.add_argument("--url", default="http://127.0.0.1:8080")
    parser.add_argument("--clients", type=int, default=10_000)
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of publishing")
    parser.add_argument("--topics", type=int, default=10)
    parser.add_argument("--rate", type=float, default=0.5, help="messages per second, in all")
    parser.add_argument("--poll-timeout", type=float, default=15.0, help="seconds")
    parser.add_argument("--disconnect", type=float, default=0.2, help="share that hang up")
    parser.add_argument(
        "--ramp-limit", type=float, default=60.0, help="seconds to wait for every poll to arrive"
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.clients < 1 or args.topics < 1 or not args.rate > 0 or not 0 <= args.disconnect <= 1:
        parser.error("need --clients >= 1, --topics >= 1, --rate > 0, 0 <= --disconnect <= 1")
    raise SystemExit(0 if asyncio.run(main_async(args)) else 1)


if __name__ == "__main__":
    main()
