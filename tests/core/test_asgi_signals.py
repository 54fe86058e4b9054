"""PurgatoryLifespan(close_on_signals=True) and the process's signal dispositions (issue
34, items 12 and 13), with real signals: each case runs in a child Python process that
starts and stops lifespans in a given order, sends itself SIGTERM with ``os.kill`` and
reports what happened. A child, because a signal whose disposition is left wrong kills
or breaks the process that receives it, and because the end state that matters is
what the next signal finds after every loop is gone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# argv: loop ("asyncio" or "uvloop"), the disposition SIGTERM has before anything starts
# ("default", "ignore" or "handler", a Python function that records its calls), then the
# steps: "+A" starts lifespan A, "-A" stops it, "kill" sends SIGTERM while the loop runs.
# Once asyncio.run has returned (the loop is closed) it prints what it saw and sends
# SIGTERM once more: that one must find the original disposition.
CHILD = r"""
import asyncio, os, signal, sys

from aiopurgatory.asgi import PurgatoryLifespan

loop_kind, original, *steps = sys.argv[1:]
events = []

def original_handler(signum, frame):
    events.append("original")

initial = {
    "default": signal.SIG_DFL, "ignore": signal.SIG_IGN, "handler": original_handler
}[original]
signal.signal(signal.SIGTERM, initial)

async def main():
    lifespans, contexts = {}, {}
    for step in steps:
        if step == "kill":
            os.kill(os.getpid(), signal.SIGTERM)
            # A handler closes its purgatory with call_soon_threadsafe: a few loop
            # iterations run it. Bounded, and an ignored signal closes nothing.
            running = [l for l in lifespans.values() if l.running]
            for _ in range(100):
                if not any(l.running for l in running):
                    break
                await asyncio.sleep(0)
            events.append("kill: " + ",".join(
                name for name, l in sorted(lifespans.items()) if l in running and not l.running
            ))
        elif step[0] == "+":
            name = step[1:]
            lifespan = PurgatoryLifespan(
                name, close_on_signals=True, on_close=lambda n=name: events.append("closed " + n)
            )
            lifespans[name] = lifespan
            contexts[name] = lifespan(None)
            await contexts[name].__aenter__()
        else:
            await contexts.pop(step[1:]).__aexit__(None, None, None)

if loop_kind == "uvloop":
    import uvloop
    uvloop.run(main())
else:
    asyncio.run(main())

after = signal.getsignal(signal.SIGTERM)
names = {signal.SIG_DFL: "default", signal.SIG_IGN: "ignore", original_handler: "handler"}
print("events:", "; ".join(events))
print("after:", names.get(after, repr(after)), flush=True)
events.clear()
os.kill(os.getpid(), signal.SIGTERM)
print("final:", "; ".join(events), flush=True)
"""


def run_child(loop: str, original: str, *steps: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-c", CHILD, loop, original, *steps],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


LOOPS = ["asyncio", "uvloop"]


# -- issue 34.12: nothing a stopped lifespan installed stays installed ------------------


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize(
    "steps",
    [
        pytest.param(["+A", "+B", "-A", "-B"], id="start-AB-stop-AB"),
        pytest.param(["+A", "+B", "-B", "-A"], id="start-AB-stop-BA"),
        pytest.param(["+A", "+B", "-A", "+C", "-B", "-C"], id="start-AB-stop-A-start-C-stop-BC"),
        pytest.param(["+A", "+B", "-A", "+C", "-C", "-B"], id="start-AB-stop-A-start-C-stop-CB"),
    ],
)
def test_after_every_lifespan_stopped_sigterm_finds_the_original_handler(
    loop: str, steps: list[str]
) -> None:
    result = run_child(loop, "handler", *steps)
    assert result.stderr == ""
    assert result.returncode == 0
    assert result.stdout.splitlines() == ["events: ", "after: handler", "final: original"]


@pytest.mark.parametrize("loop", LOOPS)
def test_lifespans_stopped_in_start_order_leave_sigterm_its_default_action(loop: str) -> None:
    # The first lifespan's handler, left installed, used to run on its closed loop:
    # "RuntimeError: Event loop is closed" in the main thread, exit status 1.
    result = run_child(loop, "default", "+A", "+B", "-A", "-B")
    assert result.stderr == ""
    assert result.returncode == -signal.SIGTERM
    assert result.stdout.splitlines() == ["events: ", "after: default"]


@pytest.mark.parametrize("loop", LOOPS)
def test_a_signal_between_two_stops_closes_the_one_running(loop: str) -> None:
    # A (under B in the chain) has stopped: SIGTERM closes B and reaches the handler A
    # replaced, once; after B's stop too, that handler is back.
    result = run_child(loop, "handler", "+A", "+B", "-A", "kill", "-B")
    assert result.stderr == ""
    assert result.returncode == 0
    assert result.stdout.splitlines() == [
        "events: original; closed B; kill: B",
        "after: handler",
        "final: original",
    ]


# -- issue 34.13: an ignored signal stays ignored ---------------------------------------


@pytest.mark.parametrize("loop", LOOPS)
def test_an_ignored_sigterm_stays_ignored(loop: str) -> None:
    # It used to be re-raised with its default action: the process died of it.
    result = run_child(loop, "ignore", "+A", "kill", "-A")
    assert result.stderr == ""
    assert result.returncode == 0
    assert result.stdout.splitlines() == ["events: kill: ", "after: ignore", "final: "]
