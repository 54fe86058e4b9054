"""The README's quickstart runs as written and prints what it says."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_quickstart_runs_as_written() -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)
    quickstart = next(block for block in blocks if "asyncio.run(main())" in block)
    done = subprocess.run(
        [sys.executable, "-c", quickstart], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n") == ["OK REQUEST_TIMED_OUT", "0", ""]
