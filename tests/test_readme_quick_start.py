"""The README's quick start runs as written: copied into a file, run with python."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def quick_starts() -> list[str]:
    """The ``python`` blocks of the README's "Quick start" section: the graph entry
    point (`add_resilience`), then `create_agent` with `ResilienceMiddleware`."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.DOTALL)
    assert len(blocks) == 2, "the README's Quick start shows both entry points"
    return blocks


@pytest.mark.parametrize("entry", [0, 1], ids=["add_resilience", "create_agent"])
def test_the_quick_start_runs_as_written(tmp_path: pathlib.Path, entry: int) -> None:
    """No name is left for the reader to define: it runs, and prints what the README
    says it prints (the recovered failure, then the agent's answer)."""
    script = tmp_path / "quick_start.py"
    script.write_text(quick_starts()[entry], encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    if entry == 1:
        assert done.stdout.strip() == "I found 3 desk lamps."
        return
    shown = section_text_block()
    assert done.stdout.strip() == shown
    assert "retry_scheduled create_order transient" in shown
    assert shown.endswith("Ordered a desk lamp.")


def section_text_block() -> str:
    """The output the README's Quick start says its first block prints."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```text\n(.*?)```", section, re.DOTALL)[0].strip()
