"""What ``aiopurgatory demo`` runs, shipped with the package so that it needs no checkout.

:mod:`aiopurgatory.demo.broker` is a Kafka-like broker simulator (produce requests with
acks=all, fetches with min_bytes, followers that lag or stall); ``examples/broker`` in
the repository is its command line.
"""
