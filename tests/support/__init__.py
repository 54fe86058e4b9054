"""What the tests share: fixtures, raw clients, servers started as subprocesses, builders
of hostile input. No tests here.

Ground rules: a test module imports from here, never from another test module; a module
here imports only other support modules, the library and ``bench`` (whose Redis nodes
the benchmarks start too), never a test module.
"""
