"""A consumer-group coordinator whose rebalances and member sessions wait in purgatories.

Kafka's GroupCoordinator, without the wire format (:mod:`aiopurgatory.kafka.broker`
speaks it around this class). Ground rules: a request is validated before anything
changes, and every table (groups, members, offsets) is bounded. Two purgatories:

* a rebalance is one ``DelayedJoin`` per group, in the ``join`` purgatory: it completes
  when every known member has sent its JoinGroup, or at the rebalance timeout (the
  largest of the members'), dropping the members that did not rejoin. A group that
  was empty waits ``initial_rebalance_delay`` first (Kafka's
  ``group.initial.rebalance.delay.ms``), so the members starting together land in one
  generation;
* each member's session is a ``DelayedHeartbeat`` in the ``heartbeat`` purgatory: every
  heartbeat (and every join, sync and commit) pushes its deadline back with
  :meth:`~aiopurgatory.DelayedOperation.reset_timeout`; when it expires the member is
  removed and the group rebalances, so a consumer that died loses its partitions
  within its session timeout.

The protocol chosen for a generation is one every member offers (the one most members
prefer). Committed offsets belong to the group and survive rebalances; everything is
in memory.

Static members (KIP-345): a member that joins with a ``group_instance_id`` keeps it across
restarts. Rejoining with an empty member id, it replaces its old member id (whose
requests are answered FENCED_INSTANCE_ID from then on) and, in a Stable group whose
protocols it still offers unchanged, gets its previous assignment at the current
generation, without a rebalance. As Kafka answers JoinGroup before v9 (KIP-814's
``skip_assignment``), a leader coming back this way is told the leader id it replaced:
it syncs as a follower and gets its own assignment back, and it leads the next
rebalance under its new id. Anywhere else (protocols changed, a rebalance under way) the
replacement joins the rebalance. A static member's session expiry removes it and the
group rebalances, as for any member.

What members make the coordinator hold is bounded: ids and protocol types by
``max_id_chars``, each member's protocols and its assignment by ``max_member_bytes``,
and all of them over every group by ``max_held_bytes``
(:attr:`GroupCoordinator.held_bytes`).

A group lives as long as Kafka's: a request that is refused creates none; a group
left without members and without offsets is removed at once (Kafka's Dead), and an
empty group's offsets expire ``offsets_retention`` after it became empty or after its
last standalone commit, whichever is later (one timer per empty group on the heartbeat
purgatory's wheel), taking the group with them.

A full table (``max_groups``) refuses a standalone commit to a new group, but not a new
consumer group: its first JoinGroup takes the place of the least recently used group
without members (its offsets dropped, as their retention would drop them, only
sooner). So commits alone can never lock consumer groups out, and never drop anyone's
offsets; only live groups (members heartbeating) fill the table for good. Kafka has no
such table bound at all.
"""

from __future__ import annotations

import asyncio
import enum
import itertools
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import aiopurgatory as ap
from aiopurgatory.timeouts import TimerHandle
from aiopurgatory.timer import Clock

log = logging.getLogger("aiopurgatory.kafka")

__all__ = [
    "DelayedHeartbeat",
    "DelayedJoin",
    "Group",
    "GroupCoordinator",
    "GroupError",
    "GroupState",
    "JoinResult",
    "Member",
    "SyncResult",
]


class GroupError(enum.IntEnum):
    """Kafka's error codes for the group APIs."""

    NONE = 0
    OFFSET_METADATA_TOO_LARGE = 12
    COORDINATOR_NOT_AVAILABLE = 15
    ILLEGAL_GENERATION = 22
    INCONSISTENT_GROUP_PROTOCOL = 23
    INVALID_GROUP_ID = 24
    UNKNOWN_MEMBER_ID = 25
    INVALID_SESSION_TIMEOUT = 26
    REBALANCE_IN_PROGRESS = 27
    INVALID_REQUEST = 42
    GROUP_ID_NOT_FOUND = 69
    GROUP_MAX_SIZE_REACHED = 81
    FENCED_INSTANCE_ID = 82


class GroupState(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"
    """Removed from the coordinator: empty and without offsets (or they expired)."""


@dataclass(frozen=True, slots=True)
class JoinResult:
    error: GroupError
    member_id: str
    generation: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    members: tuple[tuple[str, str | None, bytes], ...] = ()
    """For the leader only: (member id, group instance id, its metadata for the protocol)."""


@dataclass(frozen=True, slots=True)
class SyncResult:
    error: GroupError
    assignment: bytes = b""
    protocol_type: str | None = None
    protocol_name: str | None = None


@dataclass(slots=True, eq=False)
class Member:
    member_id: str
    group_instance_id: str | None
    client_id: str
    session_timeout: float
    rebalance_timeout: float
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    joined: bool = False
    """Has sent JoinGroup in the current rebalance."""
    join_waiter: asyncio.Future[JoinResult] | None = None
    sync_waiter: asyncio.Future[SyncResult] | None = None
    assignment: bytes = b""
    session: DelayedHeartbeat | None = None
    held: int = 0
    """The bytes counted for it in the coordinator's ``held_bytes``."""

    def metadata(self, protocol: str) -> bytes:
        return next(meta for name, meta in self.protocols if name == protocol)


@dataclass(slots=True, eq=False)
class Group:
    group_id: str
    state: GroupState = GroupState.EMPTY
    generation: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    members: dict[str, Member] = field(default_factory=dict)
    join_op: DelayedJoin | None = None
    offsets: dict[tuple[str, int], tuple[int, str]] = field(default_factory=dict)
    """(topic, partition) to (committed offset, metadata)."""
    expiry: TimerHandle | None = None
    """While the group is empty and holds offsets: when they expire."""
    static: dict[str, str] = field(default_factory=dict)
    """Group instance id to the member id that holds it now (static members)."""
    kind: str = "classic"
    """Kafka's group type: ``"classic"``, or ``"consumer"`` for a group of the consumer
    group protocol (KIP-848), whose members live in :mod:`.consumer_groups`: this table
    keeps its offsets and its place, and its state is STABLE while it has members
    there (:meth:`GroupCoordinator.claim`), EMPTY once they are gone."""

    def all_joined(self) -> bool:
        return all(member.joined for member in self.members.values())


class DelayedJoin(ap.DelayedOperation[None]):
    """A group's rebalance: done when every member has rejoined, else at its timeout."""

    __slots__ = ("coordinator", "group", "initial")

    def __init__(
        self, coordinator: GroupCoordinator, group: Group, timeout: float, initial: bool
    ) -> None:
        super().__init__(timeout)
        self.coordinator = coordinator
        self.group = group
        self.initial = initial

    def try_complete(self) -> bool:
        # The first generation of an empty group waits out its delay: more members
        # starting at the same time join it instead of forcing a second rebalance.
        if self.initial or not self.group.all_joined():
            return False
        return self.force_complete()

    def on_complete(self) -> None:
        self.coordinator._complete_join(self.group)


class DelayedHeartbeat(ap.DelayedOperation[None]):
    """A member's session: pushed back by each heartbeat, its expiry removes the member."""

    __slots__ = ("coordinator", "group", "member")

    def __init__(self, coordinator: GroupCoordinator, group: Group, member: Member) -> None:
        super().__init__(member.session_timeout)
        self.coordinator = coordinator
        self.group = group
        self.member = member

    def try_complete(self) -> bool:
        return False  # it only ends by expiring, or cancelled when the member leaves

    def on_complete(self) -> None:
        return None

    def on_expiration(self) -> None:
        self.coordinator._session_expired(self.group, self.member)


class GroupCoordinator:
    """Groups, their members and committed offsets; the ``join`` and ``heartbeat``
    purgatories. Every limit is a constructor argument."""

    def __init__(
        self,
        *,
        initial_rebalance_delay: float = 3.0,
        min_session_timeout: float = 6.0,
        max_session_timeout: float = 1800.0,
        max_rebalance_timeout: float = 3600.0,
        max_groups: int = 1000,
        max_members: int = 1000,
        max_offsets: int = 100_000,
        max_metadata_bytes: int = 4096,
        max_id_chars: int = 255,
        max_member_bytes: int = 1024 * 1024,
        max_held_bytes: int = 256 * 1024 * 1024,
        offsets_retention: float = 7 * 24 * 3600.0,
        clock: Clock | None = None,
        observer: ap.OperationObserver | None = None,
    ) -> None:
        self.initial_rebalance_delay = initial_rebalance_delay
        self.min_session_timeout = min_session_timeout
        self.max_session_timeout = max_session_timeout
        self.max_rebalance_timeout = max_rebalance_timeout
        self.max_groups = max_groups
        self.max_members = max_members
        self.max_offsets = max_offsets
        self.max_metadata_bytes = max_metadata_bytes
        self.max_id_chars = max_id_chars
        self.max_member_bytes = max_member_bytes
        self.max_held_bytes = max_held_bytes
        self.held_bytes = 0
        """Bytes of members' ids, protocol types, protocols and assignments held, over every
        group."""
        if not offsets_retention > 0:
            raise ValueError(f"offsets_retention must be > 0 seconds, got {offsets_retention!r}")
        self.offsets_retention = offsets_retention
        self.groups: dict[str, Group] = {}
        self.idle: dict[str, Group] = {}
        """The groups without members (Empty, holding offsets), least recently used
        first (by when they became empty or were last committed to standalone): a new
        consumer group takes the place of the first when the table is full."""
        self.join_purgatory = ap.Purgatory("join", clock=clock, observer=observer)
        self.heartbeat_purgatory = ap.Purgatory("heartbeat", clock=clock, observer=observer)
        self._ids = itertools.count(1)

    def close(self) -> None:
        for group in self.groups.values():
            for member in group.members.values():
                self._answer_waiters(member, GroupError.COORDINATOR_NOT_AVAILABLE)
        self.join_purgatory.close()
        self.heartbeat_purgatory.close()

    # -- the group table: a group exists while it has members or offsets ---------------

    def _became_empty(self, group: Group) -> None:
        """The last member is gone: the group goes now (nothing to keep) or its offsets
        start their retention, as Kafka expires an empty group's offsets."""
        group.state = GroupState.EMPTY
        if not group.offsets:
            self._delete(group)
        else:
            self._start_expiry(group)

    def _start_expiry(self, group: Group) -> None:
        """(Re)start the retention of an empty group's offsets from now: it is the most
        recently used of the idle groups."""
        if group.expiry is not None:
            group.expiry.cancel()
            group.expiry = None
        self.idle.pop(group.group_id, None)
        self.idle[group.group_id] = group
        if self.heartbeat_purgatory.closed:
            return  # closing: nothing expires any more
        group.expiry = self.heartbeat_purgatory.call_later(
            self.offsets_retention, self._expire, group
        )

    def _stop_expiry(self, group: Group) -> None:
        if group.expiry is not None:
            group.expiry.cancel()
            group.expiry = None
        if self.idle.get(group.group_id) is group:
            del self.idle[group.group_id]

    def _room_for_members(self) -> bool:
        """Whether a new group with members fits: the table has room, or an idle group
        can give its place (:meth:`_make_room`)."""
        return len(self.groups) < self.max_groups or bool(self.idle)

    def _make_room(self) -> None:
        """A new group with members is about to be made: in a full table the least
        recently used group without members goes, with its offsets."""
        if len(self.groups) < self.max_groups:
            return
        oldest = next(iter(self.idle.values()))
        log.info(
            "group %r: its committed offsets dropped to make room for a new consumer group"
            " (max_groups)",
            oldest.group_id,
        )
        oldest.offsets.clear()
        self._delete(oldest)

    def _expire(self, group: Group) -> None:
        group.expiry = None
        # Only the same group, still empty: a member or a commit since would have
        # cancelled or moved this timer, this guards against a callback already queued.
        if self.groups.get(group.group_id) is group and group.state is GroupState.EMPTY:
            group.offsets.clear()
            self._delete(group)

    def _delete(self, group: Group) -> None:
        self._stop_expiry(group)
        group.state = GroupState.DEAD
        if self.groups.get(group.group_id) is group:
            del self.groups[group.group_id]

    # -- consumer-type groups (KIP-848): their members are elsewhere --------------------

    def claim(self, group_id: str) -> Group | GroupError:
        """The entry of a group about to have consumer-protocol members: made if new
        (making room as a new classic group does), an empty classic group converted
        with its offsets (as Kafka converts one), its offsets' retention stopped. A
        classic group with members stays classic: GROUP_ID_NOT_FOUND, Kafka's answer
        ("not a consumer group"); a full table COORDINATOR_NOT_AVAILABLE."""
        group = self.groups.get(group_id)
        if group is None:
            if not self._room_for_members():
                return GroupError.COORDINATOR_NOT_AVAILABLE
            self._make_room()
            group = self.groups[group_id] = Group(group_id)
        elif group.kind != "consumer" and group.members:
            return GroupError.GROUP_ID_NOT_FOUND
        if group.kind != "consumer":
            group.kind, group.protocol_type, group.protocol_name = "consumer", "consumer", None
        self._stop_expiry(group)
        group.state = GroupState.STABLE
        return group

    def release(self, group: Group) -> None:
        """A consumer-type group's last member is gone: it is empty now (its offsets
        kept for their retention, or the group gone without any)."""
        if self.groups.get(group.group_id) is group:
            self._became_empty(group)

    # -- JoinGroup ----------------------------------------------------------------------

    async def join(
        self,
        group_id: str,
        member_id: str,
        *,
        group_instance_id: str | None,
        client_id: str,
        session_timeout: float,
        rebalance_timeout: float,
        protocol_type: str,
        protocols: Sequence[tuple[str, bytes]],
    ) -> JoinResult:
        """A member joining (``member_id`` empty: a new one, or a static member coming
        back); answered when the rebalance it starts or joins completes."""
        # Everything that can refuse the request is checked before anything changes:
        # a refused JoinGroup leaves no group and no member behind.
        if not self.min_session_timeout <= session_timeout <= self.max_session_timeout:
            return JoinResult(GroupError.INVALID_SESSION_TIMEOUT, member_id)
        # Kafka checks only the session's bounds, and its timer expires a rebalance with
        # a negative delay at once; here a negative (or NaN) rebalance timeout would make
        # the DelayedJoin refuse to exist mid-rebalance, so it is refused up front, with
        # Kafka's answer for a group timeout it does not take. A long one is capped: the
        # rebalance then ends at the cap, dropping members that have not rejoined.
        if not rebalance_timeout >= 0:
            return JoinResult(GroupError.INVALID_SESSION_TIMEOUT, member_id)
        rebalance_timeout = min(rebalance_timeout, self.max_rebalance_timeout)
        refused = self._check_ids(group_id, member_id, group_instance_id)
        if refused is not None:
            return JoinResult(refused, member_id[: self.max_id_chars])
        if len(protocol_type) > self.max_id_chars:
            # Kept with the member, and with its group once empty: a name ("consumer",
            # "connect"), bounded as the ids are; Kafka has no bound.
            return JoinResult(GroupError.INVALID_REQUEST, member_id)
        names = [name for name, _ in protocols]
        if not names:
            return JoinResult(GroupError.INCONSISTENT_GROUP_PROTOCOL, member_id)
        if self._protocols_size(protocols) > self.max_member_bytes:
            return JoinResult(GroupError.INVALID_REQUEST, member_id)
        group = self.groups.get(group_id)
        if group is not None and group.kind == "consumer":
            if group.state is not GroupState.EMPTY:
                # A group keeps its type while it has members (Kafka, with online
                # migration off, answers a classic JoinGroup so).
                return JoinResult(GroupError.INCONSISTENT_GROUP_PROTOCOL, member_id)
            group.kind = "classic"  # an empty one converts, with its offsets
        if member_id:
            member = group.members.get(member_id) if group is not None else None
            if group is None or member is None:
                fenced = group is not None and self._fenced(group, member_id, group_instance_id)
                return JoinResult(fenced or GroupError.UNKNOWN_MEMBER_ID, member_id)
            fenced = self._fenced(group, member_id, group_instance_id)
            if fenced is not None:
                return JoinResult(fenced, member_id)
            if not self._compatible(group, protocol_type, names, member_id):
                return JoinResult(GroupError.INCONSISTENT_GROUP_PROTOCOL, member_id)
            grown = self._size(member, protocols, member.assignment) - member.held
            if self.held_bytes + grown > self.max_held_bytes:
                return JoinResult(GroupError.COORDINATOR_NOT_AVAILABLE, member_id)
            unchanged = member.protocols == list(protocols)
            member.protocols = list(protocols)
            member.session_timeout = session_timeout
            member.rebalance_timeout = rebalance_timeout
            self._account(member)
            self._touch(member)
            if unchanged and (
                group.state is GroupState.COMPLETING_REBALANCE
                or (group.state is GroupState.STABLE and member_id != group.leader)
            ):
                # A member asking again for the generation it is in: answered at once.
                # Not the leader of a Stable group: as Kafka, its JoinGroup rebalances
                # (it rejoins when what its assignment depends on changed, such as the
                # partitions of a topic it had no metadata for at the last one).
                return self._join_result(group, member)
            return await self._await_join(group, member)
        if group is not None and group_instance_id in group.static:
            assert group_instance_id is not None
            return await self._replace_static(
                group,
                group_instance_id,
                client_id=client_id,
                session_timeout=session_timeout,
                rebalance_timeout=rebalance_timeout,
                protocol_type=protocol_type,
                protocols=protocols,
            )
        if group is None:
            if not self._room_for_members():
                return JoinResult(GroupError.COORDINATOR_NOT_AVAILABLE, member_id)
        elif not self._compatible(group, protocol_type, names, member_id):
            return JoinResult(GroupError.INCONSISTENT_GROUP_PROTOCOL, member_id)
        elif len(group.members) >= self.max_members:
            return JoinResult(GroupError.GROUP_MAX_SIZE_REACHED, member_id)
        member_id = f"{client_id or 'member'}-{next(self._ids)}"
        member = Member(
            member_id,
            group_instance_id,
            client_id,
            session_timeout,
            rebalance_timeout,
            protocol_type,
            list(protocols),
        )
        if self.held_bytes + self._size(member) > self.max_held_bytes:
            return JoinResult(GroupError.COORDINATOR_NOT_AVAILABLE, "")
        if group is None:
            self._make_room()
            group = self.groups[group_id] = Group(group_id)
        try:
            self._stop_expiry(group)  # a member again: its offsets no longer expire
            group.members[member_id] = member
            self._account(member)
            if group_instance_id is not None:
                group.static[group_instance_id] = member_id
            if not group.leader:
                group.leader = member_id
            member.session = DelayedHeartbeat(self, group, member)
            self.heartbeat_purgatory.try_complete_else_watch(
                member.session, [("member", group_id, member_id)]
            )
            waiter = self._await_join(group, member)
        except BaseException:
            # Nothing may stay half-done (a member without a session, a group
            # without members): the request fails as if it had never come.
            self._undo_new_member(group, member)
            raise
        return await waiter

    async def _replace_static(
        self,
        group: Group,
        instance: str,
        *,
        client_id: str,
        session_timeout: float,
        rebalance_timeout: float,
        protocol_type: str,
        protocols: Sequence[tuple[str, bytes]],
    ) -> JoinResult:
        """A static member back with an empty member id: a new member id takes the old
        one's place (its assignment, its place as leader); the old one is fenced."""
        old = group.members[group.static[instance]]
        names = [name for name, _ in protocols]
        if not self._compatible(group, protocol_type, names, old.member_id):
            return JoinResult(GroupError.INCONSISTENT_GROUP_PROTOCOL, "")
        member = Member(
            f"{client_id or 'member'}-{next(self._ids)}",
            instance,
            client_id,
            session_timeout,
            rebalance_timeout,
            protocol_type,
            list(protocols),
            assignment=old.assignment,
        )
        if self.held_bytes - old.held + self._size(member) > self.max_held_bytes:
            return JoinResult(GroupError.COORDINATOR_NOT_AVAILABLE, "")
        session = DelayedHeartbeat(self, group, member)
        self.heartbeat_purgatory.try_complete_else_watch(
            session, [("member", group.group_id, member.member_id)]
        )
        # Nothing below can fail: the swap is whole or (above) not begun.
        member.session = session
        # The old member id is fenced: its parked JoinGroup or SyncGroup (a client that
        # has not noticed it was restarted) is answered now.
        if old.session is not None and not old.session.done():
            old.session.cancel()
        self._answer_waiters(old, GroupError.FENCED_INSTANCE_ID)
        self.held_bytes -= old.held
        old.held = 0
        # In the old one's place, so that the order of the members (and the leader
        # chosen after a departure) does not change.
        group.members = {
            (member.member_id if key == old.member_id else key): (member if other is old else other)
            for key, other in group.members.items()
        }
        self._account(member)
        group.static[instance] = member.member_id
        leader = group.leader
        if leader == old.member_id:
            group.leader = member.member_id
        if group.state is GroupState.STABLE and old.protocols == member.protocols:
            # Kafka before JoinGroup v9: the current generation, no members, and the
            # leader id as it was before the swap, so the member syncs as a follower
            # and gets its previous assignment.
            assert group.protocol_name is not None
            return JoinResult(
                GroupError.NONE,
                member.member_id,
                group.generation,
                group.protocol_type,
                group.protocol_name,
                leader,
            )
        return await self._await_join(group, member)

    def _await_join(self, group: Group, member: Member) -> asyncio.Future[JoinResult]:
        """Mark ``member`` as joined and start or advance the rebalance; the future its
        JoinGroup awaits."""
        if member.join_waiter is not None and not member.join_waiter.done():
            # A retried JoinGroup supersedes the one still waiting.
            member.join_waiter.set_result(
                JoinResult(GroupError.REBALANCE_IN_PROGRESS, member.member_id)
            )
        waiter: asyncio.Future[JoinResult] = asyncio.get_running_loop().create_future()
        member.join_waiter = waiter
        member.joined = True
        if group.state is GroupState.PREPARING_REBALANCE:
            self.join_purgatory.check_and_complete(("join", group.group_id))
        else:
            self._prepare_rebalance(group)
        return waiter

    def _undo_new_member(self, group: Group, member: Member) -> None:
        if group.members.get(member.member_id) is member:
            self._remove(group, member, GroupError.UNKNOWN_MEMBER_ID)
        # It never was in a generation: the others need no rebalance for it, only a
        # check if they were all waiting for it.
        state = group.state
        if state is GroupState.PREPARING_REBALANCE and not self.join_purgatory.closed:
            self.join_purgatory.check_and_complete(("join", group.group_id))
        elif state is GroupState.EMPTY and self.groups.get(group.group_id) is group:
            self._became_empty(group)  # gone again, or its offsets' retention restarted

    @staticmethod
    def _compatible(group: Group, protocol_type: str, names: Sequence[str], member_id: str) -> bool:
        others = [m for m in group.members.values() if m.member_id != member_id]
        if not others:
            return True
        if any(m.protocol_type != protocol_type for m in others):
            return False
        common = set(names)
        for other in others:
            common &= {name for name, _ in other.protocols}
        return bool(common)

    # -- what a member makes the coordinator hold ----------------------------------------

    def _check_ids(
        self, group_id: str, member_id: str, group_instance_id: str | None
    ) -> GroupError | None:
        """Ids are kept as long as their group or member: bounded. Kafka has no bound;
        a group id beyond it is answered as an invalid one (INVALID_GROUP_ID), a member
        or instance id INVALID_REQUEST."""
        if not self.valid_group_id(group_id):
            return GroupError.INVALID_GROUP_ID
        if len(member_id) > self.max_id_chars:
            return GroupError.INVALID_REQUEST
        if group_instance_id is not None and not 0 < len(group_instance_id) <= self.max_id_chars:
            return GroupError.INVALID_REQUEST
        return None

    def valid_group_id(self, group_id: str) -> bool:
        """A group id the coordinator would keep: not empty (Kafka's check) and at most
        ``max_id_chars`` (a group lives as long as its offsets: its id is kept too)."""
        return 0 < len(group_id) <= self.max_id_chars

    @staticmethod
    def _protocols_size(protocols: Sequence[tuple[str, bytes]]) -> int:
        return sum(len(name) + len(metadata) for name, metadata in protocols)

    def _size(
        self,
        member: Member,
        protocols: Sequence[tuple[str, bytes]] | None = None,
        assignment: bytes | None = None,
    ) -> int:
        """What ``member`` holds (with these protocols or this assignment instead)."""
        protocols = member.protocols if protocols is None else protocols
        assignment = member.assignment if assignment is None else assignment
        ids = len(member.member_id) + len(member.group_instance_id or "") + len(member.client_id)
        ids += len(member.protocol_type)
        return ids + self._protocols_size(protocols) + len(assignment)

    def _account(self, member: Member) -> None:
        """Count ``member``'s bytes as they are now in ``held_bytes``."""
        size = self._size(member)
        self.held_bytes += size - member.held
        member.held = size

    @staticmethod
    def _fenced(group: Group, member_id: str, group_instance_id: str | None) -> GroupError | None:
        """Kafka's check of a request naming a static member: its instance id must be
        held by this member id (else the sender was replaced: FENCED_INSTANCE_ID), and
        be known at all (else UNKNOWN_MEMBER_ID)."""
        if group_instance_id is None:
            return None
        current = group.static.get(group_instance_id)
        if current is None:
            return GroupError.UNKNOWN_MEMBER_ID
        if current != member_id:
            return GroupError.FENCED_INSTANCE_ID
        return None

    def _prepare_rebalance(self, group: Group) -> None:
        previous = group.state
        initial = previous is GroupState.EMPTY
        if initial:
            timeout = self.initial_rebalance_delay
        else:
            timeout = max((m.rebalance_timeout for m in group.members.values()), default=0.0)
        # Made before the group changes state: were it refused, the group would wait in
        # PreparingRebalance for a rebalance nobody finishes (every JoinGroup parked).
        op = DelayedJoin(self, group, timeout, initial)
        if previous is GroupState.COMPLETING_REBALANCE:
            for member in group.members.values():
                self._answer_sync(member, SyncResult(GroupError.REBALANCE_IN_PROGRESS))
        group.state = GroupState.PREPARING_REBALANCE
        group.join_op = op
        try:
            self.join_purgatory.try_complete_else_watch(op, [("join", group.group_id)])
        except BaseException:
            if not op.done():  # not registered: the group is as it was
                group.state = previous
                group.join_op = None
            raise

    def _complete_join(self, group: Group) -> None:
        group.join_op = None
        for member in [m for m in group.members.values() if not m.joined]:
            self._remove(group, member, GroupError.UNKNOWN_MEMBER_ID)
        group.generation += 1
        if not group.members:
            # Kafka keeps an emptied group's protocol type (ListGroups and DescribeGroups
            # still say "consumer"; librdkafka would call it a simple consumer group
            # otherwise); its next first member sets it again.
            group.protocol_name = None
            group.leader = ""
            self._became_empty(group)
            return
        members = list(group.members.values())
        if group.leader not in group.members:
            group.leader = members[0].member_id
        group.protocol_type = members[0].protocol_type
        group.protocol_name = self._choose_protocol(members)
        group.state = GroupState.COMPLETING_REBALANCE
        for member in members:
            member.joined = False
            member.assignment = b""
            self._account(member)
            self._touch(member)
            waiter, member.join_waiter = member.join_waiter, None
            if waiter is not None and not waiter.done():
                waiter.set_result(self._join_result(group, member))

    @staticmethod
    def _choose_protocol(members: Sequence[Member]) -> str:
        """The protocol every member offers that most members prefer (Kafka's vote)."""
        common = {name for name, _ in members[0].protocols}
        for member in members[1:]:
            common &= {name for name, _ in member.protocols}
        votes: dict[str, int] = {}
        for member in members:
            choice = next(name for name, _ in member.protocols if name in common)
            votes[choice] = votes.get(choice, 0) + 1
        leader_order = [name for name, _ in members[0].protocols if name in votes]
        return max(leader_order, key=lambda name: votes[name])

    def _join_result(self, group: Group, member: Member) -> JoinResult:
        assert group.protocol_name is not None
        protocol = group.protocol_name
        members: tuple[tuple[str, str | None, bytes], ...] = ()
        if member.member_id == group.leader:
            members = tuple(
                (m.member_id, m.group_instance_id, m.metadata(protocol))
                for m in group.members.values()
            )
        return JoinResult(
            GroupError.NONE,
            member.member_id,
            group.generation,
            group.protocol_type,
            protocol,
            group.leader,
            members,
        )

    # -- SyncGroup, Heartbeat, LeaveGroup ------------------------------------------------

    def _member_of(
        self, group_id: str, member_id: str, group_instance_id: str | None
    ) -> tuple[Group, Member] | GroupError:
        """The group and its member, or why not: unknown, or fenced (a static member's
        replaced id)."""
        group = self.groups.get(group_id)
        if group is None:
            return GroupError.UNKNOWN_MEMBER_ID
        fenced = self._fenced(group, member_id, group_instance_id)
        if fenced is not None:
            return fenced
        member = group.members.get(member_id)
        if member is None:
            return GroupError.UNKNOWN_MEMBER_ID
        return group, member

    def _check_member(
        self, group_id: str, generation: int, member_id: str, group_instance_id: str | None
    ) -> tuple[Group, Member] | GroupError:
        found = self._member_of(group_id, member_id, group_instance_id)
        if isinstance(found, GroupError):
            return found
        if generation != found[0].generation:
            return GroupError.ILLEGAL_GENERATION
        return found

    async def sync(
        self,
        group_id: str,
        generation: int,
        member_id: str,
        assignments: Mapping[str, bytes],
        *,
        group_instance_id: str | None = None,
    ) -> SyncResult:
        """The leader hands out the assignments; every member gets its own once it has."""
        checked = self._check_member(group_id, generation, member_id, group_instance_id)
        if isinstance(checked, GroupError):
            return SyncResult(checked)
        group, member = checked
        self._touch(member)
        if group.state is GroupState.PREPARING_REBALANCE:
            return SyncResult(GroupError.REBALANCE_IN_PROGRESS)
        if group.state is GroupState.STABLE:
            return self._sync_result(group, member)
        if member.member_id == group.leader:
            # The leader's assignments are checked whole before any is kept: one too
            # large, or all of them beyond what the coordinator may hold, refuse the
            # SyncGroup and the generation waits as it was (the leader rejoins).
            new = {m: assignments.get(m, b"") for m in group.members}
            if any(len(a) > self.max_member_bytes for a in new.values()):
                return SyncResult(GroupError.INVALID_REQUEST)
            grown = sum(len(new[m]) - len(o.assignment) for m, o in group.members.items())
            if self.held_bytes + grown > self.max_held_bytes:
                return SyncResult(GroupError.COORDINATOR_NOT_AVAILABLE)
            for other in group.members.values():
                other.assignment = new[other.member_id]
                self._account(other)
            group.state = GroupState.STABLE
            for other in group.members.values():
                if other is not member:
                    self._answer_sync(other, self._sync_result(group, other))
            return self._sync_result(group, member)
        if member.sync_waiter is not None and not member.sync_waiter.done():
            member.sync_waiter.set_result(SyncResult(GroupError.REBALANCE_IN_PROGRESS))
        waiter: asyncio.Future[SyncResult] = asyncio.get_running_loop().create_future()
        member.sync_waiter = waiter
        return await waiter

    @staticmethod
    def _sync_result(group: Group, member: Member) -> SyncResult:
        return SyncResult(
            GroupError.NONE, member.assignment, group.protocol_type, group.protocol_name
        )

    def heartbeat(
        self,
        group_id: str,
        generation: int,
        member_id: str,
        *,
        group_instance_id: str | None = None,
    ) -> GroupError:
        found = self._member_of(group_id, member_id, group_instance_id)
        if isinstance(found, GroupError):
            return found
        group, member = found
        self._touch(member)
        if group.state is GroupState.PREPARING_REBALANCE:
            return GroupError.REBALANCE_IN_PROGRESS  # rejoin
        if generation != group.generation:
            return GroupError.ILLEGAL_GENERATION
        return GroupError.NONE

    def leave(self, group_id: str, member_ids: Iterable[str]) -> list[tuple[str, GroupError]]:
        """Members leaving by member id (LeaveGroup before v3)."""
        results = self.leave_members(group_id, [(member_id, None) for member_id in member_ids])
        return [(member_id, error) for (member_id, _), error in results]

    def leave_members(
        self, group_id: str, identities: Iterable[tuple[str, str | None]]
    ) -> list[tuple[tuple[str, str | None], GroupError]]:
        """Members leaving (LeaveGroup v3+), each named by member id, group instance id
        or both, as Kafka takes them: an empty member id with an instance id removes
        whichever member holds that instance (an admin removing a static member); both
        must match, else FENCED_INSTANCE_ID; unknown ones UNKNOWN_MEMBER_ID."""
        group = self.groups.get(group_id)
        results = []
        for member_id, instance in identities:
            error = GroupError.UNKNOWN_MEMBER_ID
            member = None
            if group is not None:
                if not member_id and instance is not None:
                    current = group.static.get(instance)
                    member = group.members.get(current) if current is not None else None
                else:
                    fenced = self._fenced(group, member_id, instance)
                    if fenced is not None:
                        error = fenced
                    else:
                        member = group.members.get(member_id)
            if group is None or member is None:
                results.append(((member_id, instance), error))
                continue
            self._remove(group, member, GroupError.UNKNOWN_MEMBER_ID)
            self._member_gone(group)
            results.append(((member_id, instance), GroupError.NONE))
        return results

    # -- sessions -----------------------------------------------------------------------

    def _touch(self, member: Member) -> None:
        """Push the member's session deadline back: it is alive."""
        if member.session is not None and not member.session.done():
            member.session.reset_timeout(member.session_timeout)

    def _session_expired(self, group: Group, member: Member) -> None:
        if group.members.get(member.member_id) is not member:
            return
        waiting = member.join_waiter is not None and not member.join_waiter.done()
        waiting |= member.sync_waiter is not None and not member.sync_waiter.done()
        if waiting:
            # A member waiting for the rebalance to answer it is not dead: its session
            # starts again (Kafka keeps such members alive too).
            member.session = DelayedHeartbeat(self, group, member)
            self.heartbeat_purgatory.try_complete_else_watch(
                member.session, [("member", group.group_id, member.member_id)]
            )
            return
        self._remove(group, member, GroupError.UNKNOWN_MEMBER_ID)
        self._member_gone(group)

    def _remove(self, group: Group, member: Member, error: GroupError) -> None:
        del group.members[member.member_id]
        self.held_bytes -= member.held
        member.held = 0
        instance = member.group_instance_id
        if instance is not None and group.static.get(instance) == member.member_id:
            del group.static[instance]
        if member.session is not None and not member.session.done():
            member.session.cancel()
        self._answer_waiters(member, error)
        if group.leader == member.member_id:
            group.leader = next(iter(group.members), "")

    def _member_gone(self, group: Group) -> None:
        if group.state is GroupState.PREPARING_REBALANCE:
            self.join_purgatory.check_and_complete(("join", group.group_id))
        elif group.state is not GroupState.EMPTY:
            self._prepare_rebalance(group)

    def _answer_waiters(self, member: Member, error: GroupError) -> None:
        if member.join_waiter is not None and not member.join_waiter.done():
            member.join_waiter.set_result(JoinResult(error, member.member_id))
        self._answer_sync(member, SyncResult(error))

    @staticmethod
    def _answer_sync(member: Member, result: SyncResult) -> None:
        if member.sync_waiter is not None and not member.sync_waiter.done():
            member.sync_waiter.set_result(result)

    # -- offsets ------------------------------------------------------------------------

    def commit(
        self,
        group_id: str,
        generation: int,
        member_id: str,
        offsets: Mapping[tuple[str, int], tuple[int, str]],
        *,
        group_instance_id: str | None = None,
    ) -> GroupError:
        """Store ``offsets`` for the group: from a member of its current generation, or
        from a standalone consumer (generation -1, no member id) while it has no members.

        Metadata longer than ``max_metadata_bytes`` (counted in characters, as Kafka
        counts ``offset.metadata.max.bytes``) refuses the whole commit here; the broker
        answers it per partition before calling this."""
        if any(len(metadata) > self.max_metadata_bytes for _, metadata in offsets.values()):
            return GroupError.OFFSET_METADATA_TOO_LARGE
        refused = self._check_ids(group_id, member_id, group_instance_id)
        if refused is not None:
            return refused
        group = self.groups.get(group_id)
        if generation < 0 and not member_id:
            if group is not None and group.members:
                return GroupError.UNKNOWN_MEMBER_ID
        else:
            checked = self._check_member(group_id, generation, member_id, group_instance_id)
            if isinstance(checked, GroupError):
                return checked
            # Kafka takes commits of the current generation while the next one is being
            # prepared (a consumer commits before it rejoins), not while it is handed out.
            if checked[0].state is GroupState.COMPLETING_REBALANCE:
                return GroupError.REBALANCE_IN_PROGRESS
            self._touch(checked[1])
        stored = group.offsets if group is not None else {}
        new = sum(key not in stored for key in offsets)
        if len(stored) + new > self.max_offsets:
            return GroupError.COORDINATOR_NOT_AVAILABLE
        return self._store(group_id, group, offsets)

    def commit_transactional(
        self, group_id: str, offsets: Mapping[tuple[str, int], tuple[int, str]]
    ) -> GroupError:
        """Store the offsets a transaction committed (TxnOffsetCommit, at its EndTxn),
        whatever the group's members: the producer's request was checked when it
        arrived, as Kafka's coordinator stores them on reading the commit marker.
        Bounded like any commit (``max_offsets``, ``max_groups``, ``max_id_chars``)."""
        if not self.valid_group_id(group_id):
            return GroupError.INVALID_GROUP_ID
        group = self.groups.get(group_id)
        stored = group.offsets if group is not None else {}
        if len(stored) + sum(key not in stored for key in offsets) > self.max_offsets:
            return GroupError.COORDINATOR_NOT_AVAILABLE
        return self._store(group_id, group, offsets)

    def _store(
        self,
        group_id: str,
        group: Group | None,
        offsets: Mapping[tuple[str, int], tuple[int, str]],
    ) -> GroupError:
        """Keep checked ``offsets`` in ``group`` (made if None and there is room)."""
        if group is None:
            if not offsets:
                return GroupError.NONE  # nothing to keep: no group to keep it in
            if len(self.groups) >= self.max_groups:
                return GroupError.COORDINATOR_NOT_AVAILABLE
            group = self.groups[group_id] = Group(group_id)
        group.offsets.update(offsets)
        if group.state is GroupState.EMPTY:
            # A standalone consumer's offsets are kept a retention after its last commit.
            self._start_expiry(group)
        return GroupError.NONE

    def committed(
        self, group_id: str, partitions: Iterable[tuple[str, int]] | None
    ) -> dict[tuple[str, int], tuple[int, str]]:
        """Committed (offset, metadata) per partition; -1 where nothing was committed.
        ``partitions`` None: every partition the group committed."""
        group = self.groups.get(group_id)
        stored = group.offsets if group is not None else {}
        if partitions is None:
            return dict(stored)
        return {tp: stored.get(tp, (-1, "")) for tp in partitions}

    # -- the admin APIs: DeleteGroups, OffsetDelete ------------------------------------

    def delete_group(self, group_id: str) -> bool:
        """Delete an empty group and its offsets (Kafka's DeleteGroups); False, and
        nothing changed, while it has members."""
        group = self.groups[group_id]
        if group.members or group.state is not GroupState.EMPTY:
            return False
        group.offsets.clear()
        self._delete(group)
        return True

    def delete_offsets(self, group_id: str, partitions: Iterable[tuple[str, int]]) -> None:
        """Drop the group's offsets of ``partitions`` (Kafka's OffsetDelete; the caller
        refused the partitions its members subscribe to). An empty group left without
        offsets goes, as it would at their expiry."""
        group = self.groups[group_id]
        for tp in partitions:
            group.offsets.pop(tp, None)
        if not group.members and not group.offsets:
            self._delete(group)

    def forget_topic(self, topic: str) -> None:
        """The topic was deleted: every group's offsets for it go with it, as Kafka drops
        them, and a group left with neither members nor offsets goes too."""
        for group in list(self.groups.values()):
            stale = [key for key in group.offsets if key[0] == topic]
            if not stale:
                continue
            for key in stale:
                del group.offsets[key]
            if group.state is GroupState.EMPTY and not group.offsets:
                self._delete(group)
