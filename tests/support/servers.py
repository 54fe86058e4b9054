"""Start and stop the example servers as their READMEs document, and read what they hold."""

from __future__ import annotations

import json
import re
import select
import subprocess
import sys
from collections.abc import Sequence
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


_EACH_ARGV = """
import contextlib, io, json, os, runpy, sys
script = sys.argv[1]
sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
runs = []
for argv in json.loads(sys.argv[2]):
    sys.argv = [script, *argv]
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
        try:
            runpy.run_path(script, run_name="__main__")
            status = 0
        except SystemExit as exit:
            code = exit.code
            status = code if isinstance(code, int) else 0 if code is None else 1
    runs.append([status, stderr.getvalue()])
print(json.dumps(runs))
"""


def refused_at_start_each(script: str, *option_lists: Sequence[str]) -> list[str]:
    """Start ``script`` with each of ``option_lists`` and expect its command line to
    refuse them (argparse's status 2, before it listens), all in one interpreter: a
    process per list, each importing the server's framework, cost 0.4 CPU-s (issue 46).
    Returns what each said on stderr."""
    argvs = [["--port", "0", *options] for options in option_lists]
    # An option taken by mistake would start a server: the timeout ends the run.
    done = subprocess.run(
        [sys.executable, "-c", _EACH_ARGV, script, json.dumps(argvs)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    runs = json.loads(done.stdout)  # [[status, stderr], ...]
    assert len(runs) == len(option_lists)
    for options, (status, stderr) in zip(option_lists, runs, strict=True):
        assert status == 2, (options, stderr[-2000:])
    return [str(stderr) for _, stderr in runs]


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
