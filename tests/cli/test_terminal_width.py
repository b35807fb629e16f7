"""What a person sees fits the terminal: at 60, 80 and 120 columns the demo and the
threads listing split no word, id or command across lines, and no line runs past the
width except a command or id printed to be copied (which must then be whole)."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

BOX = "│┃┏┓┗┛┡┩┣┫━─┳┻╇╈╋┼┬┴├┤└┘┌┐═║╭╮╯╰"
RANDOM = re.compile(r"[0-9a-f]{16,}|/[^\s)]*threads\.sqlite|\d\d:\d\d(:\d\d)?")
"""What differs between two runs of the demo (keys, state paths, times): masked."""
THREAD = "demo-width"


def render(width: int, state: pathlib.Path, *args: str) -> str:
    """The command's output at `width` columns, its state directory masked."""
    env = {**os.environ, "COLUMNS": str(width), "TERM": "dumb"}
    env.pop("LANGGRAPH_RESILIENCE_DSN", None)
    done = subprocess.run(
        [sys.executable, "-m", "langgraph_resilience", *args, "--state-dir", str(state)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.replace(str(state), "<state>")


def tokens(text: str) -> list[str]:
    """The words of `text`, box drawing removed and run-specific values masked."""
    return RANDOM.sub("<random>", text.translate({ord(c): " " for c in BOX})).split()


@pytest.fixture(scope="module")
def wide(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The demo and the threads listing at 1,000 columns: nothing wraps there."""
    state = tmp_path_factory.mktemp("wide")
    demo = render(1000, state, "demo", "--thread-id", THREAD, "--pause")
    return {"demo": demo, "threads": render(1000, state, "threads")}


@pytest.mark.slow
@pytest.mark.parametrize("width", [60, 80, 120])
def test_the_demo_splits_no_word_at(
    width: int, wide: dict[str, str], tmp_path: pathlib.Path
) -> None:
    """Every word at `width` is a word of the unwrapped output (a split word leaves
    fragments like ``STRUCTUR`` / ``AL`` that are not), and lines fit, but for whole
    commands."""
    narrow = render(width, tmp_path, "demo", "--thread-id", THREAD, "--pause")
    known = set(tokens(wide["demo"]))
    assert [t for t in tokens(narrow) if t not in known] == []
    assert "…" not in narrow  # nothing is cut short either (a node name, a cell)
    resume = f"langgraph-resilience resume {THREAD}"
    assert any(resume in line for line in narrow.splitlines()), "the resume command is split"
    copyable = (resume, "threads.sqlite")  # printed whole, to be copied
    too_long = [
        line
        for line in narrow.splitlines()
        if len(line) > width and not any(whole in line for whole in copyable)
    ]
    assert too_long == []


@pytest.mark.slow
@pytest.mark.parametrize("width", [60, 80, 120])
def test_the_threads_listing_keeps_ids_whole_at(
    width: int, wide: dict[str, str], tmp_path: pathlib.Path
) -> None:
    """The thread id appears whole on one line, and no word is split."""
    render(1000, tmp_path, "demo", "--thread-id", THREAD, "--pause")
    narrow = render(width, tmp_path, "threads")
    assert any(THREAD in line for line in narrow.splitlines())
    known = set(tokens(wide["threads"]))
    assert [t for t in tokens(narrow) if t not in known] == []


MARKS = "✗✓↻→⧗≈⇢⊘⟳✎⚑↩✝⟲"
"""The marks a step line may start with."""


def step_texts(output: str) -> list[str]:
    """The text column of each physical line of the demo's steps (its step number and
    node columns cut off)."""
    from langgraph_resilience.cli.output import NODE_WIDTH  # noqa: PLC0415

    offset = 4 + NODE_WIDTH + 1
    head = re.compile(r"^\s*\d*\s+[a-z_]*\s*$")
    return [line[offset:].rstrip() for line in output.splitlines() if head.match(line[:offset])]


@pytest.mark.slow
@pytest.mark.parametrize("width", [80, 120])
def test_the_demo_wraps_a_marked_line_under_its_text_at(
    width: int, wide: dict[str, str], tmp_path: pathlib.Path
) -> None:
    """A step line that starts with a mark (✗, ↻, →, ...) continues under its text,
    not under the mark, so the marks stay a column a reader can scan."""
    starts = {" ".join(tokens(text)[:3]) for text in step_texts(wide["demo"]) if text.strip()}
    narrow = render(width, tmp_path, "demo", "--thread-id", THREAD, "--pause")
    expected: int | None = None  # where the marked line now running continues
    checked = 0
    for text in step_texts(narrow):
        body = text.lstrip()
        if not body:
            continue
        indent = len(text) - len(body)
        if body[0] in MARKS:
            expected = indent + 2
        elif " ".join(tokens(text)[:3]) in starts:
            expected = None  # a new line of prose
        elif expected is not None:
            assert indent == expected, f"wrapped under the mark at {width} columns: {text!r}"
            checked += 1
    assert checked > 0, f"nothing wrapped at {width} columns: the check checked nothing"
