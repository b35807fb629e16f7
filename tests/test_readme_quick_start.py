"""The README's quick start runs as written: copied into a file, run with python."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def quick_start() -> str:
    """The first ``python`` block under the README's "Quick start" heading."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Quick start", 1)[1]
    found = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert found, "the README's Quick start has no python block"
    return found.group(1)


def test_the_quick_start_runs_as_written(tmp_path: pathlib.Path) -> None:
    """No name is left for the reader to define: it runs, and the agent answers."""
    script = tmp_path / "quick_start.py"
    script.write_text(quick_start(), encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "I found 3 desk lamps."
