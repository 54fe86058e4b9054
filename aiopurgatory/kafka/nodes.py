"""The nodes of a cluster in one process: their listeners and connections, the
followers each runs, the in-sync replica sets, and the faults a test applies to them.

Ground rules: one core, one group coordinator and one transaction coordinator serve
every node (the process is the cluster's shared disk); what makes the nodes distinct is
what each answers. A node answers for the partitions it leads and the groups and
transactional ids it coordinates; any other gets NOT_LEADER_OR_FOLLOWER or
NOT_COORDINATOR, as from Kafka. Each follower replica is a task of its node that
fetches from the leader's log, parked in the fetch purgatory as a consumer's fetch is,
and reports its log end with each fetch (which moves the high watermark over the ISR).
The topology's decisions are :mod:`.topology`'s; this module applies them: a leader that
stops is replaced by an ISR member, the log truncated to what the new leader holds
(nothing acknowledged with acks=all is beyond it), the leader epoch bumped, and what
waited on the old leader answered at once.

Faults: :meth:`Nodes.stop_node` (listener and connections closed),
:meth:`Nodes.start_node` (back as a follower that catches up), :meth:`Nodes.isolate`
(sockets open, nothing answered, nothing followed) and :meth:`Nodes.heal`. Each and
its effects are logged on ``aiopurgatory.kafka`` and recorded by the broker's observer.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import ssl
from collections.abc import Awaitable, Callable, Coroutine
from typing import Final

from kio.schema.errors import ErrorCode

from .connection import current_connection
from .core import BrokerCore
from .faults import FaultLog
from .leadership import epoch_error
from .limits import Limits
from .log import TopicPartition
from .records import StoredBatch
from .tls import PausedUntilTls
from .topology import NodeState, Placement, Topology

__all__ = ["FOLLOWER_MAX_WAIT", "Nodes"]

log = logging.getLogger("aiopurgatory.kafka")

FOLLOWER_MAX_WAIT: Final = 0.5
"""A follower's fetch waits this long for data before asking again (Kafka's
``replica.fetch.wait.max.ms``); a fetch that returns at the log end marks it caught up."""

Serve = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]
"""Serves one connection accepted by a node (the broker's)."""


class Nodes:
    """``topology.nodes`` listeners over one core, and the cluster's replication.

    Args:
        topology: The nodes' states and the partitions' placements.
        core: The log and its purgatories.
        serve: Serves a connection accepted by a node.
        host: The address every node listens on (each on its own port).
        ports: The port of each node (0 picks a free one).
        advertised_host: The host clients are told.
        ssl_context: TLS for every listener.
        limits: The broker's limits (the TLS handshake's bound).
        replica_lag: Seconds a follower may lag before it leaves the ISR (Kafka's
            ``replica.lag.time.max.ms``).
        follower_delay: Seconds a follower waits after a fetch that brought data.
        on_truncate: Told of each truncation (partition, new log end): the producer
            states and transactions above it are forgotten.
        faults: Where faults and their effects are recorded.
    """

    def __init__(
        self,
        topology: Topology,
        core: BrokerCore[StoredBatch],
        serve: Serve,
        *,
        host: str,
        ports: list[int],
        advertised_host: str,
        ssl_context: ssl.SSLContext | None,
        limits: Limits,
        replica_lag: float,
        follower_delay: float,
        on_truncate: Callable[[TopicPartition, int], None],
        faults: FaultLog | None = None,
    ) -> None:
        if len(ports) != topology.nodes:
            raise ValueError(f"{topology.nodes} nodes need {topology.nodes} ports, got {ports!r}")
        self.topology = topology
        self.core = core
        self._serve = serve
        self.host = host
        self.ports = list(ports)
        self.advertised_host = advertised_host
        self.ssl_context = ssl_context
        self.limits = limits
        self.replica_lag = replica_lag
        self.follower_delay = follower_delay
        self._on_truncate = on_truncate
        self.faults = FaultLog() if faults is None else faults
        self.servers: list[asyncio.Server | None] = [None] * topology.nodes
        self.connections: list[dict[asyncio.Task[None], asyncio.StreamWriter]] = [
            {} for _ in range(topology.nodes)
        ]
        self._reachable = [asyncio.Event() for _ in range(topology.nodes)]
        for event in self._reachable:
            event.set()
        self.followers: dict[tuple[TopicPartition, int], asyncio.Task[None]] = {}
        """A task per follower replica being fetched, keyed by (partition, slot)."""
        self._isr_check: asyncio.TimerHandle | None = None
        self._closed = False
        self._accepted: dict[asyncio.StreamWriter, None] = {}
        """Every connection accepted and not yet done, known from its protocol's
        connection_made: its task may never run (cancelled when the loop ends), and
        then nothing else would close it."""

    @property
    def clustered(self) -> bool:
        return self.topology.nodes > 1

    def _now(self) -> float:
        return asyncio.get_running_loop().time()

    # -- listeners -------------------------------------------------------------------

    async def start(self) -> None:
        """Listen on every node's port (the ports picked are kept: a node started again
        listens where clients knew it)."""
        for node in range(self.topology.nodes):
            await self._listen(node)
        self._arm_isr_check()

    async def _listen(self, node: int) -> None:
        # Plain TCP, even for TLS: the handshake is the connection's own
        # (:func:`.tls.start_tls`), once it is counted against max_connections.
        # (What asyncio.start_server does, but for the protocol.)
        loop = asyncio.get_running_loop()
        kind = asyncio.StreamReaderProtocol if self.ssl_context is None else PausedUntilTls

        def accept(
            reader: asyncio.StreamReader, writer: asyncio.StreamWriter
        ) -> Coroutine[None, None, None]:
            # Called in connection_made, at once: the task serving the connection
            # starts later, and may never start.
            self._accepted[writer] = None
            return self._accept(node, reader, writer)

        def protocol() -> asyncio.StreamReaderProtocol:
            return kind(asyncio.StreamReader(loop=loop), accept, loop=loop)

        server = await loop.create_server(protocol, self.host, self.ports[node])
        self.ports[node] = server.sockets[0].getsockname()[1]
        self.servers[node] = server

    def listening(self) -> list[tuple[int, str, int]]:
        """(node, host, port) of each node listening."""
        return [
            (node, self.host, self.ports[node])
            for node, server in enumerate(self.servers)
            if server is not None
        ]

    async def _accept(
        self, node: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        try:
            # Accepted as the listener closed (closing it ends the accepts, but not
            # those already under way): nothing would ever close it.
            if self._closed or self.topology.states[node] is NodeState.STOPPED:
                writer.transport.abort()
                return
            self.connections[node][task] = writer
            try:
                await self._serve(reader, writer, node)
            finally:
                self.connections[node].pop(task, None)
        finally:
            self._accepted.pop(writer, None)

    def address(self, node: int) -> tuple[str, int]:
        """What clients are told of ``node``."""
        return self.advertised_host, self.ports[node]

    async def wait_reachable(self, node: int) -> None:
        """Return once ``node`` is not isolated (at once, usually)."""
        event = self._reachable[node]
        if not event.is_set():
            await event.wait()

    async def aclose(self) -> None:
        self._closed = True
        if self._isr_check is not None:
            self._isr_check.cancel()
            self._isr_check = None
        for event in self._reachable:
            event.set()  # what was held is answered (by closed purgatories) and ends
        for server in self.servers:
            if server is not None:
                server.close()
        tasks = list(self.followers.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.followers.clear()

    async def wait_closed(self) -> None:
        """Once :meth:`aclose` and the connections' own ends: the connections accepted
        whose tasks never started, or that were accepted as the listeners closed, are
        aborted (and their tasks let run, to return at once rather than be cancelled
        when the loop ends), then the listeners waited for."""
        # Three turns: an accept under way when the listener closed creates its
        # transport in one, calls connection_made in the next, and its task starts in
        # the third.
        for _ in range(3):
            for writer in list(self._accepted):
                writer.transport.abort()
            await asyncio.sleep(0)
        for server in self.servers:
            if server is not None:
                await server.wait_closed()

    # -- placements ------------------------------------------------------------------

    def place(
        self, topic: str, first: int, count: int, factor: int, create: Callable[[], object]
    ) -> None:
        """Place partitions ``first..first+count-1`` of ``topic``, ``create`` them in the
        core (with ``factor`` follower slots: slot i is replica i), and start their
        followers.

        Raises:
            ValueError: What :meth:`Topology.assign` refuses (nothing placed or created).
        """
        placements = self.topology.assign(topic, first, count, factor, self._now())
        try:
            create()
        except BaseException:
            for index in range(first, first + count):
                self.topology.placements.pop(TopicPartition(topic, index), None)
            raise
        for index, placement in enumerate(placements, start=first):
            self.core.set_hw_slots(TopicPartition(topic, index), placement.hw_slots())
        self._sync_followers()

    def forget_topic(self, topic: str) -> None:
        """A deleted topic: its placements go, and its followers are cancelled now. Left
        to end by themselves (their next turn sees the partition gone), they would still
        hold their keys when a topic of the same name is created in the same loop turn,
        and its followers would never start."""
        self.topology.remove_topic(topic)
        self._sync_followers()

    def placement(self, tp: TopicPartition) -> Placement | None:
        return self.topology.placements.get(tp)

    # -- what a node answers -----------------------------------------------------------

    def leader_error(self, tp: TopicPartition, current_epoch: int) -> ErrorCode:
        """NONE if the running connection's node leads ``tp`` (an existing partition)
        and ``current_epoch`` (-1: unchecked) is its leader epoch; else Kafka's answer."""
        placement = self.topology.placements.get(tp)
        if placement is not None and placement.leader != current_connection.get().node:
            return ErrorCode.not_leader_or_follower
        return epoch_error(current_epoch, self.core.partitions[tp].epoch)

    def isr_size(self, tp: TopicPartition, replicas: int) -> int:
        """Replicas in sync (``replicas``, all of them, on one node's simulated ones)."""
        placement = self.topology.placements.get(tp)
        return replicas if placement is None else len(placement.isr)

    def coordinator(self, key: str) -> int:
        """The node coordinating ``key`` (node 0 on one node)."""
        return self.topology.coordinator(key) if self.clustered else 0

    # -- followers --------------------------------------------------------------------

    def _wanted(self) -> set[tuple[TopicPartition, int]]:
        wanted = set()
        topology = self.topology
        for tp, placement in topology.placements.items():
            if placement.leader == -1:
                continue
            for slot, node in enumerate(placement.replicas):
                if node != placement.leader and topology.up(node):
                    wanted.add((tp, slot))
        return wanted

    def _sync_followers(self) -> None:
        """Start the follower tasks the topology wants, cancel those it does not."""
        if self._closed:
            return
        wanted = self._wanted()
        for key in [key for key in self.followers if key not in wanted]:
            self.followers.pop(key).cancel()
        for key in wanted:
            task = self.followers.get(key)
            if task is None or task.done():
                task = asyncio.create_task(self._follow(*key))
                self.followers[key] = task
                task.add_done_callback(functools.partial(self._follower_done, key))

    def _follower_done(self, key: tuple[TopicPartition, int], task: asyncio.Task[None]) -> None:
        if self.followers.get(key) is task:
            del self.followers[key]
        if not task.cancelled() and task.exception() is not None:
            log.error("follower of %s slot %d failed", key[0], key[1], exc_info=task.exception())

    async def _follow(self, tp: TopicPartition, slot: int) -> None:
        """Replica ``slot`` of ``tp`` following its leader: fetch from its log end,
        parked in the fetch purgatory, and report the new log end with the next fetch
        (which moves the HW over the ISR, which completes acks=all produces)."""
        core = self.core
        partition = core.partitions[tp]
        placement = self.topology.placements[tp]
        node = placement.replicas[slot]
        offset = partition.follower_leos[slot]
        # Until the topic is deleted (a topic created again under its name has its own).
        while core.partitions.get(tp) is partition:
            epoch = partition.epoch
            at_end = offset >= partition.leo
            op = core.fetch({tp: offset}, min_bytes=1, max_wait=FOLLOWER_MAX_WAIT, replica=slot)
            self._reported(tp, placement, node, slot, offset)
            fetched = (await op).get(tp, [])
            if at_end:
                placement.caught_up[slot] = self._now()  # at the end until now
            if fetched and self.follower_delay:
                await asyncio.sleep(self.follower_delay)  # a slow disk, a slow network
            if partition.epoch != epoch:
                # A new leader truncated the log: what was read may be gone.
                offset = min(offset, partition.follower_leos[slot], partition.leo)
                continue
            if fetched:
                # From the last batch's end: the cleaner leaves gaps between batches.
                offset = fetched[-1].end

    def _reported(
        self, tp: TopicPartition, placement: Placement, node: int, slot: int, offset: int
    ) -> None:
        """A follower fetched from ``offset``, its log end: it rejoins the ISR once it
        has what the HW covers (Kafka's rule) and its node is up."""
        partition = self.core.partitions[tp]
        if offset >= partition.leo:
            placement.caught_up[slot] = self._now()
        if node not in placement.isr and offset >= partition.hw and self.topology.up(node):
            placement.isr.add(node)
            self.core.set_hw_slots(tp, placement.hw_slots())
            self.faults.record(
                "isr_expand", f"{tp}: node {node} back in sync at {offset}", effect=True
            )

    def _arm_isr_check(self) -> None:
        if self._closed or not self.clustered:
            return
        loop = asyncio.get_running_loop()
        self._isr_check = loop.call_later(max(self.replica_lag / 2, 0.01), self._check_isr)

    def _check_isr(self) -> None:
        """Drop from each ISR the followers lagging for longer than the bound (Kafka's
        isr-expiration task, which runs at half the bound)."""
        self._isr_check = None
        try:
            now = self._now()
            for tp, placement in self.topology.placements.items():
                partition = self.core.partitions.get(tp)
                if partition is None or placement.leader == -1:
                    continue
                changed = False
                for slot, node in enumerate(placement.replicas):
                    if node == placement.leader:
                        continue
                    fetching = (tp, slot) in self.followers and self.topology.up(node)
                    if fetching and partition.follower_leos[slot] >= partition.leo:
                        placement.caught_up[slot] = now
                    elif (
                        node in placement.isr and now - placement.caught_up[slot] > self.replica_lag
                    ):
                        placement.isr.discard(node)
                        changed = True
                        self.faults.record(
                            "isr_shrink",
                            f"{tp}: node {node} out of sync"
                            f" ({partition.follower_leos[slot]} of {partition.leo})",
                            effect=True,
                        )
                if changed:
                    self.core.set_hw_slots(tp, placement.hw_slots())
        except Exception:
            log.exception("the ISR check failed")
        self._arm_isr_check()

    # -- leaders ---------------------------------------------------------------------

    def _move_leaders(self, node: int, why: str) -> None:
        """Every partition ``node`` leads gets a new leader from its ISR (or none)."""
        for tp, placement in list(self.topology.led_by(node)):
            if self.topology.elect(placement) != -1:
                placement.isr.discard(node)  # fenced: the controller takes it out
            # else it stays the ISR's last member, offline, and leads again once back
            # (an election from outside the ISR would lose what acks=all acknowledged).
            self._elect(tp, placement, why)

    def _elect(self, tp: TopicPartition, placement: Placement, why: str) -> None:
        old = placement.leader
        new = self.topology.elect(placement)
        partition = self.core.partitions[tp]
        placement.leader = new
        if new == -1:
            # Offline: nothing appended until an ISR member is back; the epoch moves so
            # that what waited on the old leader is answered now.
            epoch = self.core.change_leader(tp, partition.leo)
            self.faults.record(
                "leader_change", f"{tp}: node {old} -> none, epoch {epoch} ({why})", effect=True
            )
            return
        end = partition.leo if old == -1 else partition.follower_leos[placement.slot(new)]
        truncated = partition.leo - end
        epoch = self.core.change_leader(tp, end)
        if old != -1:
            # The old leader had the log up to the cut (it truncates there when back).
            partition.follower_leos[placement.slot(old)] = end
        self.core.set_hw_slots(tp, placement.hw_slots())
        if truncated:
            self._on_truncate(tp, end)
        self.faults.record(
            "leader_change",
            f"{tp}: node {old} -> {new}, epoch {epoch} ({why}"
            + (f"; {truncated} offsets not replicated truncated" if truncated else "")
            + ")",
            effect=True,
        )

    def _elect_offline(self, node: int) -> None:
        """Partitions without a leader whose ISR ``node`` is in get it as leader."""
        for tp, placement in self.topology.placements.items():
            if placement.leader == -1 and node in placement.isr:
                self._elect(tp, placement, f"node {node} is back")

    # -- faults ----------------------------------------------------------------------

    def _check_node(self, node: int) -> None:
        if not (isinstance(node, int) and 0 <= node < self.topology.nodes):
            raise ValueError(f"no node {node!r}: the nodes are 0..{self.topology.nodes - 1}")

    async def stop_node(self, node: int) -> None:
        """Stop ``node``: its listener and connections close, its followers stop, the
        partitions it led move to an ISR member (leader epoch bumped), it leaves every
        ISR, and the groups and transactions it coordinated move with their partitions.

        Raises:
            ValueError: No such node, or it is stopped already.
        """
        self._check_node(node)
        if self.topology.states[node] is NodeState.STOPPED:
            raise ValueError(f"node {node} is stopped already")
        self.faults.record("stop_node", f"node={node}")
        self.topology.states[node] = NodeState.STOPPED
        self._reachable[node].set()  # held requests go on, to closed connections
        server = self.servers[node]
        self.servers[node] = None
        if server is not None:
            server.close()
        for writer in list(self.connections[node].values()):
            writer.close()
        self._move_leaders(node, f"node {node} stopped")
        for tp, placement in self.topology.placements.items():
            if node in placement.isr and placement.leader != -1:
                placement.isr.discard(node)  # a follower: the controller takes it out
                self.core.set_hw_slots(tp, placement.hw_slots())
        self._sync_followers()
        if server is not None:
            await server.wait_closed()

    async def start_node(self, node: int) -> None:
        """Start ``node`` again on its port: it follows what it holds replicas of from
        where its log ended (truncated to what the leader kept) and rejoins each ISR
        once caught up; a partition left without a leader that it was in sync for
        gets it as leader.

        Raises:
            ValueError: No such node, or it is not stopped.
            OSError: Its port cannot be listened on again.
        """
        self._check_node(node)
        if self.topology.states[node] is not NodeState.STOPPED:
            raise ValueError(f"node {node} is not stopped")
        await self._listen(node)
        self.topology.states[node] = NodeState.UP
        self.faults.record("start_node", f"node={node} port={self.ports[node]}")
        self._elect_offline(node)
        self._sync_followers()

    def isolate(self, node: int) -> None:
        """Cut ``node`` off: its sockets stay open but nothing it receives is answered
        until :meth:`heal`, its followers stop fetching (each leaves its ISR after the
        lag bound), and the partitions it led and the groups it coordinated move to
        other nodes, as a controller fences a node whose session lapsed.

        Raises:
            ValueError: No such node, or it is not up.
        """
        self._check_node(node)
        if self.topology.states[node] is not NodeState.UP:
            raise ValueError(f"node {node} is {self.topology.states[node].value}, not up")
        self.faults.record("isolate", f"node={node}")
        self.topology.states[node] = NodeState.ISOLATED
        self._reachable[node].clear()
        self._move_leaders(node, f"node {node} isolated")
        self._sync_followers()

    def heal(self, node: int) -> None:
        """End :meth:`isolate`: what ``node`` held is answered (as things now stand),
        its followers fetch again and rejoin the ISR once caught up.

        Raises:
            ValueError: No such node, or it is not isolated.
        """
        self._check_node(node)
        if self.topology.states[node] is not NodeState.ISOLATED:
            raise ValueError(f"node {node} is {self.topology.states[node].value}, not isolated")
        self.topology.states[node] = NodeState.UP
        self._reachable[node].set()
        self.faults.record("heal", f"node={node}")
        self._elect_offline(node)
        self._sync_followers()
