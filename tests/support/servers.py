"""Start and stop the example servers as their READMEs document, and read what they hold."""

from __future__ import annotations

import re
import select
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def start_server(script: str, address: str, *options: str) -> tuple[subprocess.Popen[str], str]:
    """Run ``script`` (a path, or ``-m module``) on 127.0.0.1 and a free port; returns it
    and the first group of ``address`` (a regex) matched in the line where it reports
    where it listens."""
    program = script.split(" ", 1) if script.startswith("-m ") else [script]
    command = [sys.executable, *program, "--host", "127.0.0.1", "--port", "0", *options]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    readable, _, _ = select.select([process.stdout], [], [], 15.0)
    line = process.stdout.readline() if readable else ""
    match = re.search(rf"listening on {address}", line)
    if match is None:
        stop_server(process)
        pytest.fail(f"the server did not report its address: {line!r}")
    return process, match.group(1)


def refused_at_start(script: str, *options: str) -> str:
    """Start ``script`` with ``options`` and expect its command line to refuse them
    (argparse's status 2, before it listens); returns what it said on stderr."""
    done = subprocess.run(
        [sys.executable, script, "--port", "0", *options],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2, (options, done.stderr[-2000:])
    return done.stderr


def stop_server(process: subprocess.Popen[str]) -> int:
    """SIGTERM, then wait; kill if it does not stop. Returns the exit status."""
    process.terminate()
    try:
        return process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise
    finally:
        if process.stdout is not None:
            process.stdout.close()


def rss_kib(pid: int) -> int:
    """Resident memory of process ``pid``, in KiB (Linux)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")
