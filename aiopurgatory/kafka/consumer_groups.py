"""The coordinator of consumer-type groups: Kafka 4's consumer group protocol (KIP-848),
without the wire format (:mod:`.consumer_group_api` speaks it around this class).

The protocol, as Kafka's GroupMetadataManager runs it:

* a member joins with member epoch 0 and heartbeats with its epoch; it leaves with -1,
  or -2 for a static member (``group.instance.id``) that will be back;
* the group has an epoch, bumped whenever what the assignment depends on changes (a
  member joins or leaves, a subscription or the assignor changes, a subscribed topic is
  created, deleted or grows). The target assignment is recomputed by the assignor
  (:mod:`.assignors`) when the group epoch passed it, and takes its epoch;
* each member converges to its target through its own heartbeats (Kafka's
  CurrentAssignmentBuilder): partitions it must give up are first revoked (it keeps
  its epoch, and is told its assignment without them), and only once a heartbeat no
  longer lists them does it take the target's epoch; a partition it gains is handed
  to it only once no other member holds it, assigned or being revoked (until then the
  member is "unreleased" and gets it on a later heartbeat).

Invariant: a partition is held by at most one member at any time (:attr:`ConsumerGroup.owners`),
from the moment it is handed out until its holder's heartbeat no longer lists it (or
the holder is gone). So no two consumers ever read a partition at once, whatever the
order of heartbeats.

A deleted topic needs no listener here: the next heartbeat sees it gone (a new group
epoch, a target without it), its holders are told to revoke its partitions, and their
heartbeats, which can no longer name it by id, let go of them; a topic created again
under the name is handed out only then.

Sessions are on the broker's clock (``group.consumer.session.timeout.ms``): one
delayed operation per member in the ``consumer-session`` purgatory, pushed back by each
heartbeat, whose expiry removes the member, so :meth:`~.control.BrokerControl.advance`
expires a crashed member. A static member that left with -2 keeps its assignment for
its session; the same instance joining again takes its place (its assignment and
epoch, without a new group epoch).

Ground rules: a request is validated whole before anything changes; every table is
bounded: members per group (``max_members``), groups (the classic coordinator's table,
shared: a group keeps one type, its offsets live there, :meth:`GroupCoordinator.claim`),
ids, instance ids, rack ids and assignor names (``max_id_chars``), subscribed names
per member (``max_topics``, each at most a topic name's 249 characters) and the bytes
of all members' ids and subscriptions and of the groups' assignments
(``max_held_bytes``, with the classic members'; :data:`TARGET_ENTRY_BYTES` per
partition).
"""

from __future__ import annotations

import enum
import itertools
import logging
import uuid
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

import aiopurgatory as ap
from aiopurgatory.timeouts import TimerHandle
from aiopurgatory.timer import Clock

from .assignors import ASSIGNORS, DEFAULT_ASSIGNOR, TopicPartitions
from .groups import Group, GroupCoordinator, GroupError

log = logging.getLogger("aiopurgatory.kafka")

__all__ = [
    "JOIN_EPOCH",
    "LEAVE_EPOCH",
    "STATIC_LEAVE_EPOCH",
    "TARGET_ENTRY_BYTES",
    "ConsumerError",
    "ConsumerGroup",
    "ConsumerGroupCoordinator",
    "ConsumerMember",
    "HeartbeatResult",
    "MemberState",
]

JOIN_EPOCH: Final = 0
LEAVE_EPOCH: Final = -1
STATIC_LEAVE_EPOCH: Final = -2
MAX_TOPIC_NAME_CHARS: Final = 249
"""Kafka's longest topic name: a longer subscribed name is refused INVALID_REQUEST."""
TARGET_ENTRY_BYTES: Final = 128
"""What one partition of a group's assignment holds in the coordinator, about: its
(topic, index) pair and its places in the group's target, its member's assignment and
the owners' map. Counted in ``max_held_bytes`` for each partition of the topics a group
subscribes to, since that, not what a member sends, is what an assignment grows with: a
member of a few hundred bytes subscribing to every topic makes its group hold all the
broker's partitions."""


class ConsumerError(enum.IntEnum):
    """Kafka's error codes for the consumer group protocol's APIs."""

    NONE = 0
    COORDINATOR_NOT_AVAILABLE = 15
    INVALID_GROUP_ID = 24
    UNKNOWN_MEMBER_ID = 25
    INVALID_REQUEST = 42
    GROUP_ID_NOT_FOUND = 69
    GROUP_MAX_SIZE_REACHED = 81
    FENCED_MEMBER_EPOCH = 110
    UNRELEASED_INSTANCE_ID = 111
    UNSUPPORTED_ASSIGNOR = 112
    STALE_MEMBER_EPOCH = 113


class MemberState(enum.Enum):
    """Where a member is in its reconciliation (Kafka's MemberState)."""

    STABLE = "stable"
    UNREVOKED_PARTITIONS = "unrevoked_partitions"
    """Told to give up partitions; its epoch moves on once it has."""
    UNRELEASED_PARTITIONS = "unreleased_partitions"
    """At the target's epoch, waiting for partitions other members still hold."""


@dataclass(slots=True, eq=False)
class ConsumerMember:
    member_id: str
    instance_id: str | None
    rack_id: str | None
    client_id: str
    client_host: str
    subscribed: tuple[str, ...]
    assignor: str | None
    rebalance_timeout: float
    epoch: int = 0
    previous_epoch: int = -1
    state: MemberState = MemberState.STABLE
    assigned: TopicPartitions = frozenset()
    """The partitions it was told it owns."""
    revoking: TopicPartitions = frozenset()
    """The partitions it was told to give up and still may hold."""
    left: bool = False
    """A static member gone with epoch -2: its assignment kept for its session."""
    session: ConsumerSession | None = None
    revocation: TimerHandle | None = None
    """While it has partitions to revoke: its rebalance timeout, which removes it."""
    held: int = 0
    """The bytes counted for it in the classic coordinator's ``held_bytes``."""


@dataclass(slots=True, eq=False)
class ConsumerGroup:
    group_id: str
    entry: Group
    """Its place in the classic coordinator's table, where its offsets are."""
    epoch: int = 0
    assignment_epoch: int = 0
    target: dict[str, TopicPartitions] = field(default_factory=dict)
    members: dict[str, ConsumerMember] = field(default_factory=dict)
    static: dict[str, str] = field(default_factory=dict)
    """Instance id to the member id holding it."""
    owners: dict[tuple[str, int], str] = field(default_factory=dict)
    """Each partition held (assigned or being revoked) to its holder."""
    subscribed: Counter[str] = field(default_factory=Counter)
    """Subscribed topic name to the members subscribing to it."""
    topics_seen: tuple[tuple[str, uuid.UUID | None, int], ...] = ()
    """(name, id, partitions) of the subscribed topics when the target was computed."""
    assignor: str = DEFAULT_ASSIGNOR
    held: int = 0
    """The bytes counted for its assignment in the classic coordinator's ``held_bytes``
    (:data:`TARGET_ENTRY_BYTES` per partition of its target)."""

    def state(self) -> str:
        """Kafka's consumer group state: Empty, Assigning, Reconciling or Stable."""
        if not self.members:
            return "Empty"
        if self.epoch > self.assignment_epoch:
            return "Assigning"
        for member in self.members.values():
            if member.epoch != self.assignment_epoch or member.state is not MemberState.STABLE:
                return "Reconciling"
        return "Stable"


@dataclass(frozen=True, slots=True)
class HeartbeatResult:
    error: ConsumerError
    member_id: str | None = None
    epoch: int = -1
    assignment: TopicPartitions | None = None
    """The member's assignment, when it is to be sent (joined, changed, asked in full)."""
    message: str | None = None


def _unsubscribe(group: ConsumerGroup, names: Iterable[str]) -> None:
    """A member's subscription leaves the group's count; a name nobody subscribes to
    any more goes (the count holds only what members hold)."""
    for name in names:
        group.subscribed[name] -= 1
        if group.subscribed[name] <= 0:
            del group.subscribed[name]


class ConsumerSession(ap.DelayedOperation[None]):
    """A member's session: pushed back by each heartbeat, its expiry removes it."""

    __slots__ = ("coordinator", "group", "member")

    def __init__(
        self,
        coordinator: ConsumerGroupCoordinator,
        group: ConsumerGroup,
        member: ConsumerMember,
        timeout: float,
    ) -> None:
        super().__init__(timeout)
        self.coordinator = coordinator
        self.group = group
        self.member = member

    def try_complete(self) -> bool:
        return False  # it only ends by expiring, or cancelled when the member leaves

    def on_complete(self) -> None:
        return None

    def on_expiration(self) -> None:
        self.coordinator._session_expired(self.group, self.member)


def _size(member: ConsumerMember) -> int:
    """What the member makes the coordinator hold, in bytes (about)."""
    return (
        len(member.member_id)
        + len(member.instance_id or "")
        + len(member.rack_id or "")
        + len(member.client_id)
        + len(member.assignor or "")
        + sum(len(name) for name in member.subscribed)
        + 256
    )


class ConsumerGroupCoordinator:
    """Consumer-type groups, their members, epochs and assignments; the
    ``consumer-session`` purgatory.

    Args:
        groups: The classic coordinator, whose table (and offsets) these groups share.
        partitions: Topic name to its partition count (the log's, live).
        topic_ids: Topic name to its id (the log's, live).
        session_timeout: Seconds (``group.consumer.session.timeout.ms``).
        heartbeat_interval: Seconds (``group.consumer.heartbeat.interval.ms``).
        max_members: Members per group.
        max_subscribed: Subscribed topic names per member.
        max_id_chars: Group, member, instance and rack ids, and assignor names.
        clock: The broker's clock.
        observer: Told of every session's life.
    """

    __slots__ = (
        "_ids",
        "clock",
        "groups",
        "heartbeat_interval",
        "max_id_chars",
        "max_members",
        "max_subscribed",
        "partitions",
        "purgatory",
        "session_timeout",
        "table",
        "topic_ids",
    )

    def __init__(
        self,
        groups: GroupCoordinator,
        partitions: Mapping[str, int],
        topic_ids: Mapping[str, uuid.UUID],
        *,
        session_timeout: float = 45.0,
        heartbeat_interval: float = 5.0,
        max_members: int = 1000,
        max_subscribed: int = 1000,
        max_id_chars: int = 255,
        clock: Clock | None = None,
        observer: ap.OperationObserver | None = None,
    ) -> None:
        if not 0 < heartbeat_interval < session_timeout:
            raise ValueError(
                "the heartbeat interval must be > 0 and below the session timeout, got "
                f"{heartbeat_interval!r} and {session_timeout!r}"
            )
        self.groups = groups
        self.partitions = partitions
        self.topic_ids = topic_ids
        self.session_timeout = session_timeout
        self.heartbeat_interval = heartbeat_interval
        self.max_members = max_members
        self.max_subscribed = max_subscribed
        self.max_id_chars = max_id_chars
        self.clock = clock
        self.table: dict[str, ConsumerGroup] = {}
        """The groups with members (a group without members is only an entry of the
        classic table, with its offsets and its epoch, as ``generation``)."""
        self.purgatory = ap.Purgatory("consumer-session", clock=clock, observer=observer)
        self._ids = itertools.count(1)

    def close(self) -> None:
        self.purgatory.close()

    # -- ConsumerGroupHeartbeat ---------------------------------------------------------

    def _check(
        self,
        group_id: str,
        member_id: str,
        epoch: int,
        instance_id: str | None,
        rack_id: str | None,
        subscribed: Sequence[str] | None,
        assignor: str | None,
        owned: Iterable[tuple[str, int]] | None,
        version: int,
    ) -> tuple[ConsumerError, str] | None:
        """Why the heartbeat is refused before anything changes (None: it is not)."""
        if not group_id:
            return ConsumerError.INVALID_REQUEST, "GroupId can't be empty."
        if len(group_id) > self.max_id_chars:
            return ConsumerError.INVALID_GROUP_ID, f"GroupId longer than {self.max_id_chars}."
        for what, value in (("MemberId", member_id), ("InstanceId", instance_id or "")):
            if len(value) > self.max_id_chars:
                return ConsumerError.INVALID_REQUEST, f"{what} longer than {self.max_id_chars}."
        if len(rack_id or "") > self.max_id_chars or len(assignor or "") > self.max_id_chars:
            return ConsumerError.INVALID_REQUEST, "RackId or ServerAssignor too long."
        if version >= 1 and not member_id:
            return ConsumerError.INVALID_REQUEST, "MemberId can't be empty."
        if epoch < STATIC_LEAVE_EPOCH:
            return ConsumerError.INVALID_REQUEST, f"MemberEpoch is invalid: {epoch}."
        if epoch == STATIC_LEAVE_EPOCH and instance_id is None:
            return ConsumerError.INVALID_REQUEST, "InstanceId can't be null."
        if epoch > JOIN_EPOCH and not member_id:
            return ConsumerError.INVALID_REQUEST, "MemberId can't be empty."
        if epoch == JOIN_EPOCH:
            if subscribed is None:  # a subscription by regular expression is not served
                return (
                    ConsumerError.INVALID_REQUEST,
                    "SubscribedTopicNames must be set in first request.",
                )
            if owned is not None and any(True for _ in owned):
                return (
                    ConsumerError.INVALID_REQUEST,
                    "TopicPartitions must be empty when (re-)joining.",
                )
        if subscribed is not None:
            if len(subscribed) > self.max_subscribed:
                return ConsumerError.INVALID_REQUEST, f"more than {self.max_subscribed} topics."
            if any(len(name) > MAX_TOPIC_NAME_CHARS for name in subscribed):
                return ConsumerError.INVALID_REQUEST, "a subscribed topic name is too long."
        if assignor is not None and assignor not in ASSIGNORS:
            return (
                ConsumerError.UNSUPPORTED_ASSIGNOR,
                f"ServerAssignor {assignor} is not supported.",
            )
        return None

    def heartbeat(
        self,
        group_id: str,
        member_id: str,
        epoch: int,
        *,
        instance_id: str | None = None,
        rack_id: str | None = None,
        rebalance_timeout: float | None = None,
        subscribed: Sequence[str] | None = None,
        assignor: str | None = None,
        owned: Iterable[tuple[str, int]] | None = None,
        client_id: str = "",
        client_host: str = "",
        version: int = 1,
    ) -> HeartbeatResult:
        """One ConsumerGroupHeartbeat: join (epoch 0), heartbeat, or leave (-1, -2).
        ``owned``: the partitions the member holds, by name (None: unchanged)."""
        owned_set = None if owned is None else frozenset(owned)
        refused = self._check(
            group_id,
            member_id,
            epoch,
            instance_id,
            rack_id,
            subscribed,
            assignor,
            owned_set,
            version,
        )
        if refused is not None:
            return HeartbeatResult(refused[0], member_id or None, message=refused[1])
        subscribed = None if subscribed is None else tuple(dict.fromkeys(subscribed))
        group = self.table.get(group_id)
        if epoch in (LEAVE_EPOCH, STATIC_LEAVE_EPOCH):
            return self._leave(group, member_id, epoch, instance_id)
        if epoch == JOIN_EPOCH:
            found = self._join(
                group_id,
                group,
                member_id,
                instance_id=instance_id,
                rack_id=rack_id,
                rebalance_timeout=rebalance_timeout,
                subscribed=subscribed or (),
                assignor=assignor,
                client_id=client_id,
                client_host=client_host,
            )
            if isinstance(found, HeartbeatResult):
                return found
            group, member, changed = found
            sent = True
        else:
            known = group.members.get(member_id) if group is not None else None
            if group is None or known is None or known.left:
                return HeartbeatResult(
                    ConsumerError.UNKNOWN_MEMBER_ID,
                    member_id,
                    message=f"Member {member_id} is not a member of group {group_id}.",
                )
            member = known
            if epoch != member.epoch and not (
                epoch == member.previous_epoch
                and owned_set is not None
                and owned_set <= member.assigned
            ):
                # A member behind (or ahead of) the epoch it was given is fenced; one
                # epoch behind with what it was given is the answer it lost, resent.
                relation = "smaller" if epoch < member.epoch else "greater"
                return HeartbeatResult(
                    ConsumerError.FENCED_MEMBER_EPOCH,
                    member_id,
                    message=f"The consumer group member has a {relation} member epoch "
                    f"({epoch}) than the one known by the group coordinator ({member.epoch}).",
                )
            changed = self._update(group, member, subscribed, assignor, rebalance_timeout, rack_id)
            sent = owned_set is not None and subscribed is not None  # a full request
        self._touch(member)
        if self._refresh_topics(group) or changed:
            self._bump(group)  # one new epoch for whatever changed
        self._compute_target(group)
        before = member.assigned
        self._reconcile(group, member, owned_set)
        sent |= member.assigned != before
        return HeartbeatResult(
            ConsumerError.NONE,
            member.member_id,
            member.epoch,
            member.assigned if sent else None,
        )

    def _join(
        self,
        group_id: str,
        group: ConsumerGroup | None,
        member_id: str,
        *,
        instance_id: str | None,
        rack_id: str | None,
        rebalance_timeout: float | None,
        subscribed: tuple[str, ...],
        assignor: str | None,
        client_id: str,
        client_host: str,
    ) -> tuple[ConsumerGroup, ConsumerMember, bool] | HeartbeatResult:
        """A member joining (or joining again): the group made or claimed if need be."""
        if group is not None:
            old = group.members.get(member_id) if member_id else None
            if old is not None and not (old.left and old.instance_id == instance_id):
                # The same member joining again (after a fence), or a client taking the
                # id of a static member gone with -2 without its instance id: one member
                # per id, as Kafka keeps, so the old one goes first (it holds nothing
                # now). Replaced in the table without that, it stayed counted in
                # max_group_bytes for ever, its session's expiry no longer finding it.
                # Its group stays (with its epoch), even empty for this instant.
                self._remove(group, old)
                self._bump(group)
        holder = group.static.get(instance_id) if group is not None and instance_id else None
        if group is not None and holder is not None:
            previous = group.members[holder]
            if not previous.left:
                return HeartbeatResult(
                    ConsumerError.UNRELEASED_INSTANCE_ID,
                    member_id,
                    message=f"Static member {holder} with instance id {instance_id} "
                    "is not released yet.",
                )
        elif group is not None and len(group.members) >= self.max_members:
            return HeartbeatResult(
                ConsumerError.GROUP_MAX_SIZE_REACHED,
                member_id,
                message=f"The consumer group has reached its maximum capacity of "
                f"{self.max_members} members.",
            )
        member = ConsumerMember(
            member_id or f"{client_id or 'consumer'}-{uuid.uuid4()}",
            instance_id,
            rack_id,
            client_id,
            client_host,
            subscribed,
            assignor,
            rebalance_timeout if rebalance_timeout is not None and rebalance_timeout > 0 else 300.0,
        )
        size = _size(member)
        growth = self._assignment_growth(group, subscribed)
        if self.groups.held_bytes + size + growth > self.groups.max_held_bytes:
            if group is not None:
                self._gone_if_empty(group)  # a rejoining member's group, left empty
            return HeartbeatResult(ConsumerError.COORDINATOR_NOT_AVAILABLE, member_id)
        if group is None:
            entry = self.groups.claim(group_id)
            if isinstance(entry, GroupError):
                message = None
                if entry is GroupError.GROUP_ID_NOT_FOUND:
                    message = f"Group {group_id} is not a consumer group."
                return HeartbeatResult(ConsumerError(entry), member_id, message=message)
            group = self.table[group_id] = ConsumerGroup(group_id, entry, epoch=entry.generation)
        member.held = size
        self.groups.held_bytes += size
        changed = True
        if holder is not None:
            # The same instance back: it takes its predecessor's place, assignment and
            # epoch, without a new group epoch (Kafka's static member replacement).
            previous = group.members.pop(holder)
            self._unaccount(previous)
            self._cancel_session(previous)
            self._stop_revocation(previous)
            member.epoch, member.previous_epoch = previous.epoch, previous.previous_epoch
            member.assigned, member.revoking = previous.assigned, previous.revoking
            member.state = previous.state
            if member.revoking and not self.purgatory.closed:
                member.revocation = self.purgatory.call_later(
                    member.rebalance_timeout, self._revocation_expired, group, member
                )
            for tp in member.assigned | member.revoking:
                group.owners[tp] = member.member_id
            if holder in group.target:
                group.target[member.member_id] = group.target.pop(holder)
            _unsubscribe(group, previous.subscribed)
            changed = previous.subscribed != subscribed or previous.assignor != assignor
        group.members[member.member_id] = member
        for name in subscribed:
            group.subscribed[name] += 1
        if instance_id is not None:
            group.static[instance_id] = member.member_id
        member.session = ConsumerSession(self, group, member, self.session_timeout)
        self.purgatory.try_complete_else_watch(
            member.session, [("consumer", group_id, member.member_id)]
        )
        return group, member, changed

    def _update(
        self,
        group: ConsumerGroup,
        member: ConsumerMember,
        subscribed: tuple[str, ...] | None,
        assignor: str | None,
        rebalance_timeout: float | None,
        rack_id: str | None,
    ) -> bool:
        """What a heartbeat changed of the member (fields it sent): whether the group's
        assignment depends on it (a new group epoch). A change that would take the
        coordinator past ``max_held_bytes`` is not made (the member goes on as it was)."""
        if rebalance_timeout is not None and rebalance_timeout > 0:
            member.rebalance_timeout = rebalance_timeout
        new_subscribed = member.subscribed if subscribed is None else subscribed
        new_assignor = member.assignor if assignor is None else assignor
        new_rack = member.rack_id if rack_id is None else rack_id
        changed = new_subscribed != member.subscribed or new_assignor != member.assignor
        if not changed and new_rack == member.rack_id:
            return False
        old = (member.subscribed, member.assignor, member.rack_id)
        member.subscribed, member.assignor, member.rack_id = new_subscribed, new_assignor, new_rack
        size = _size(member)
        growth = self._assignment_growth(group, new_subscribed) if new_subscribed != old[0] else 0
        if self.groups.held_bytes - member.held + size + growth > self.groups.max_held_bytes:
            member.subscribed, member.assignor, member.rack_id = old
            return False
        self.groups.held_bytes += size - member.held
        member.held = size
        if new_subscribed != old[0]:
            _unsubscribe(group, old[0])
            for name in new_subscribed:
                group.subscribed[name] += 1
        return changed

    def _leave(
        self, group: ConsumerGroup | None, member_id: str, epoch: int, instance_id: str | None
    ) -> HeartbeatResult:
        member = group.members.get(member_id) if group is not None else None
        if group is None or member is None:
            return HeartbeatResult(
                ConsumerError.UNKNOWN_MEMBER_ID,
                member_id,
                message=f"Member {member_id} is not a member of the group.",
            )
        if epoch == STATIC_LEAVE_EPOCH and member.instance_id == instance_id:
            # Back soon: its assignment waits for it until its session ends.
            member.left = True
            self._touch(member)
            return HeartbeatResult(ConsumerError.NONE, member_id, STATIC_LEAVE_EPOCH)
        self._remove(group, member)
        self._bump(group)
        self._gone_if_empty(group)
        return HeartbeatResult(ConsumerError.NONE, member_id, LEAVE_EPOCH)

    # -- epochs, the target, reconciliation ---------------------------------------------

    def _bump(self, group: ConsumerGroup) -> None:
        group.epoch += 1

    def _refresh_topics(self, group: ConsumerGroup) -> bool:
        """Whether a subscribed topic was created, deleted (or made again) or grew since
        the target was computed: then a new group epoch is due, so a new target (topics
        created later are picked up at the next heartbeat)."""
        # Over the smaller side: the group's subscribed names or the broker's topics
        # (at most max_topics), so a group subscribing to many names that are no
        # topics costs no more per heartbeat than the broker's topics.
        names: Iterable[str]
        if len(group.subscribed) <= len(self.topic_ids):
            names = [name for name in group.subscribed if name in self.topic_ids]
        else:
            names = [name for name in self.topic_ids if group.subscribed.get(name, 0) > 0]
        seen = tuple(
            (name, self.topic_ids.get(name), self.partitions.get(name, 0)) for name in sorted(names)
        )
        if seen == group.topics_seen:
            return False
        group.topics_seen = seen
        return True

    def _compute_target(self, group: ConsumerGroup) -> None:
        if group.epoch <= group.assignment_epoch:
            return
        # The assignor most members name, else the default (Kafka's choice).
        named = Counter(m.assignor for m in group.members.values() if m.assignor is not None)
        group.assignor = named.most_common(1)[0][0] if named else DEFAULT_ASSIGNOR
        subscriptions = {m.member_id: m.subscribed for m in group.members.values()}
        partitions = {name: count for name, _, count in group.topics_seen if count > 0}
        group.target = ASSIGNORS[group.assignor](subscriptions, partitions, group.target)
        group.assignment_epoch = group.epoch
        # Each partition of a subscribed topic is in the target once: what it holds is
        # counted from now (over the budget only when topics grew under the group).
        self._hold(group, TARGET_ENTRY_BYTES * sum(partitions.values()))

    def _assignment_growth(self, group: ConsumerGroup | None, names: Iterable[str]) -> int:
        """The bytes the group's assignment grows by when ``names`` are subscribed: the
        partitions of those that are topics and not in its target yet (O(topics))."""
        seen = {name for name, _, _ in group.topics_seen} if group is not None else set()
        fresh = {name for name in names if name not in seen}
        return TARGET_ENTRY_BYTES * sum(self.partitions.get(name, 0) for name in fresh)

    def _hold(self, group: ConsumerGroup, size: int) -> None:
        self.groups.held_bytes += size - group.held
        group.held = size

    def _reconcile(
        self, group: ConsumerGroup, member: ConsumerMember, owned: TopicPartitions | None
    ) -> None:
        """Move the member toward its target (Kafka's CurrentAssignmentBuilder)."""
        if member.revoking:
            if owned is None or owned & member.revoking:
                return  # still holds some: it keeps its epoch until it lets go
            self._release(group, member, member.revoking)
            member.revoking = frozenset()
            self._stop_revocation(member)
        if member.epoch >= group.assignment_epoch and member.state is MemberState.STABLE:
            return
        target = group.target.get(member.member_id, frozenset())
        keep = member.assigned & target
        revoke = member.assigned - target
        if revoke:
            member.assigned, member.revoking = keep, revoke
            member.state = MemberState.UNREVOKED_PARTITIONS
            if not self.purgatory.closed:
                # Kafka's rebalance timeout: a member that does not let go in time is
                # removed, so its partitions cannot wait for it for ever.
                member.revocation = self.purgatory.call_later(
                    member.rebalance_timeout, self._revocation_expired, group, member
                )
            return
        free = frozenset(
            tp for tp in target - keep if group.owners.get(tp, member.member_id) == member.member_id
        )
        for tp in free:
            group.owners[tp] = member.member_id
        member.assigned = keep | free
        if member.epoch != group.assignment_epoch:
            member.previous_epoch, member.epoch = member.epoch, group.assignment_epoch
        member.state = (
            MemberState.STABLE if member.assigned == target else MemberState.UNRELEASED_PARTITIONS
        )

    @staticmethod
    def _release(
        group: ConsumerGroup, member: ConsumerMember, tps: Iterable[tuple[str, int]]
    ) -> None:
        for tp in tps:
            if group.owners.get(tp) == member.member_id:
                del group.owners[tp]

    # -- sessions and removal -----------------------------------------------------------

    def _touch(self, member: ConsumerMember) -> None:
        if member.session is not None and not member.session.done():
            member.session.reset_timeout(self.session_timeout)

    def _cancel_session(self, member: ConsumerMember) -> None:
        if member.session is not None and not member.session.done():
            member.session.cancel()
        member.session = None

    def _session_expired(self, group: ConsumerGroup, member: ConsumerMember) -> None:
        if group.members.get(member.member_id) is not member:
            return
        log.info("group %r: member %s's session expired", group.group_id, member.member_id)
        self._remove(group, member)
        self._bump(group)
        self._gone_if_empty(group)

    @staticmethod
    def _stop_revocation(member: ConsumerMember) -> None:
        if member.revocation is not None:
            member.revocation.cancel()
            member.revocation = None

    def _revocation_expired(self, group: ConsumerGroup, member: ConsumerMember) -> None:
        member.revocation = None
        if group.members.get(member.member_id) is not member or not member.revoking:
            return
        log.info(
            "group %r: member %s did not revoke its partitions within its rebalance timeout",
            group.group_id,
            member.member_id,
        )
        self._remove(group, member)
        self._bump(group)
        self._gone_if_empty(group)

    def _unaccount(self, member: ConsumerMember) -> None:
        self.groups.held_bytes -= member.held
        member.held = 0

    def _remove(self, group: ConsumerGroup, member: ConsumerMember) -> None:
        del group.members[member.member_id]
        self._release(group, member, member.assigned | member.revoking)
        group.target.pop(member.member_id, None)
        _unsubscribe(group, member.subscribed)
        if (
            member.instance_id is not None
            and group.static.get(member.instance_id) == member.member_id
        ):
            del group.static[member.instance_id]
        self._cancel_session(member)
        self._stop_revocation(member)
        self._unaccount(member)

    def _gone_if_empty(self, group: ConsumerGroup) -> None:
        if group.members or self.table.get(group.group_id) is not group:
            return
        del self.table[group.group_id]
        self._hold(group, 0)
        group.entry.generation = group.epoch  # kept with its offsets
        self.groups.release(group.entry)

    # -- what the other APIs ask ---------------------------------------------------------

    def owns(self, group_id: str) -> bool:
        """Whether ``group_id`` is a consumer-type group (with members or not)."""
        entry = self.groups.groups.get(group_id)
        return entry is not None and entry.kind == "consumer"

    def check_commit(self, group_id: str, member_id: str, epoch: int) -> ConsumerError:
        """Whether an offset commit (or a fetch with a member) may be taken, as Kafka
        checks it: from a member at its epoch; STALE_MEMBER_EPOCH for one behind, or a
        static member gone with -2; without an epoch (-1: an admin, or a consumer
        outside the group) while the group has no members, whatever id it names."""
        group = self.table.get(group_id)
        if epoch < 0 and group is None:
            return ConsumerError.NONE  # no members: a group without one has no entry here
        member = group.members.get(member_id) if group is not None else None
        if member is None:
            return ConsumerError.UNKNOWN_MEMBER_ID
        if member.left or epoch != member.epoch:
            # Gone with -2, a static member has Kafka's epoch -2 until it is back: a
            # commit at its old epoch is a zombie's (and must not push its session back).
            return ConsumerError.STALE_MEMBER_EPOCH
        self._touch(member)
        return ConsumerError.NONE

    def state_of(self, group_id: str) -> str:
        """A consumer-type group's state as Kafka names it (Empty without members)."""
        group = self.table.get(group_id)
        return "Empty" if group is None else group.state()
