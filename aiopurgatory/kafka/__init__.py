"""A Kafka-protocol broker for tests: ``aiopurgatory.kafka`` (the ``kafka`` extra).

aiokafka, kafka-python and confluent-kafka connect to it with their defaults. It starts
in milliseconds, in process or as a command, with a single-node Kafka's development
defaults, and its delayed requests wait in aiopurgatory's purgatories.

    pip install 'aiopurgatory[kafka]'

* ``async with KafkaBroker() as broker:`` on the running loop (``broker.bootstrap``);
* ``with BrokerThread() as bootstrap:`` on a loop of its own, for blocking clients;
* the pytest fixtures ``kafka_bootstrap``, ``kafka_broker`` and ``kafka_broker_factory``
  (:mod:`aiopurgatory.kafka.pytest_plugin`, a pytest plugin of its own);
* ``python -m aiopurgatory.kafka --port 0`` or ``aiopurgatory kafka --port 0``.

The layout, lowest first: each module imports only those before it here, so that
nothing imports back up and there is no cycle. These need no kio: :mod:`._extra` (the
extra's install hint), :mod:`.log` (topic partitions and their logs, the high
watermark), :mod:`.topology` (the nodes' states, placements and elections, decisions
only), :mod:`.delayed` (DelayedProduce for acks=all, DelayedLogFetch for min bytes),
:mod:`.core` (BrokerCore: topics, appends, reads, retention, followers), :mod:`.simulator`
(the broker simulator that ``aiopurgatory demo`` runs, on the core), :mod:`.groups`
(the group coordinator), :mod:`.assignors` (KIP-848's server-side assignors),
:mod:`.consumer_groups` (the consumer-type groups' coordinator, KIP-848),
:mod:`.limits` (Limits and the single-node defaults),
:mod:`.configs` (the topic configs served), :mod:`.views` (snapshots for assertions),
:mod:`.sasl` (SASL users, PLAIN and SCRAM), :mod:`.tls` (TLS contexts, throwaway
certificates), :mod:`.codecs` (the batches' compression), :mod:`.connection` (framing,
the byte budget, the serve loop). These do: :mod:`.records` (v2 record batches),
:mod:`.cleaner` (log compaction, a bounded step at a time), :mod:`.producers`
(idempotent producers), :mod:`.transactions` (the transaction
coordinator), :mod:`.protocol` (kio glue, the API keys), :mod:`.leadership` (the leader
epoch check), :mod:`.faults` (the fault rules and the fault log: no handler),
:mod:`.nodes` (the nodes in one process, their followers and faults), :mod:`.topics`
(the topics' lifecycle: create, grow, delete, told to its listeners), the handlers
:mod:`.data_api` (Produce, Fetch, ListOffsets, InitProducerId), :mod:`.group_api`,
:mod:`.consumer_group_api` (ConsumerGroupHeartbeat, ConsumerGroupDescribe),
:mod:`.txn_api`, :mod:`.admin_api` (groups, configs, partitions, records, the cluster),
:mod:`.epoch_api` (OffsetForLeaderEpoch), :mod:`.sasl_api` (SaslHandshake,
SaslAuthenticate, the gate before authentication), :mod:`.answers` (the error answers
over every handler), :mod:`.topic_api` (ApiVersions, Metadata, CreateTopics,
DeleteTopics), :mod:`.control` (the test-control verbs, and the surface the broker and
its thread share), :mod:`.broker` (KafkaBroker: wiring, lifecycle, dispatch),
:mod:`.thread` (BrokerThread), :mod:`.pytest_plugin` (the fixtures), :mod:`.cli` (the
command) and :mod:`.__main__`. A new concern is a module of state beside
:mod:`.producers` and one of handlers beside :mod:`.group_api`, as transactions are; a
new table keyed by topic forgets a deleted topic as a listener of :mod:`.topics`; a new
verb goes in :mod:`.control`'s class and Protocol, and mypy then asks for it in
:mod:`.thread`.

Importing this package does not import kio: the names that need it (:class:`KafkaBroker`,
:class:`BrokerThread`) load on first use (PEP 562), and raise an ImportError naming
``pip install 'aiopurgatory[kafka]'`` when kio is missing. The simulator that
``aiopurgatory demo`` runs (:mod:`.simulator`) is built on the same core and needs no
extra.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._extra import KAFKA_EXTRA_HINT, missing_extra
from .core import BrokerCore
from .groups import GroupCoordinator
from .limits import Limits
from .log import TopicPartition
from .views import GroupInfo, PartitionOffsets, TransactionInfo

if TYPE_CHECKING:
    from .broker import KafkaBroker
    from .thread import BrokerThread

__all__ = [
    "KAFKA_EXTRA_HINT",
    "BrokerCore",
    "BrokerThread",
    "GroupCoordinator",
    "GroupInfo",
    "KafkaBroker",
    "Limits",
    "PartitionOffsets",
    "TopicPartition",
    "TransactionInfo",
]

_LAZY = {"KafkaBroker": ".broker", "BrokerThread": ".thread"}
"""The public names that need kio, and their modules."""


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        value = getattr(importlib.import_module(module, __name__), name)
    except ImportError as exc:
        if exc.name is not None and exc.name.split(".")[0] in ("kio", "crc32c"):
            raise missing_extra(exc) from exc
        raise
    globals()[name] = value  # the next look-up is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
