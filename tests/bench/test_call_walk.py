"""`benchmarks/call_walk.py` traces what it says: package functions only, and a side
effect walks further than a clean read (it claims, runs and records under a key)."""

from __future__ import annotations

from benchmarks.call_walk import PACKAGE, walk


def test_the_walk_counts_package_functions_only() -> None:
    functions, files = walk("search")
    assert functions
    assert all(path.startswith(PACKAGE) and "/testing/" not in path for path in files)
    assert {path for path, _, _ in functions} == set(files)


def test_a_side_effect_walks_further_than_a_read() -> None:
    read, read_files = walk("search")
    effect, effect_files = walk("create_order")
    assert len(effect) > len(read)
    assert set(effect_files) > set(read_files)


def test_a_retry_walks_through_the_retry_decision() -> None:
    functions, _ = walk("search", fail_first=True)
    names = {name for _, name, _ in functions}
    assert {"decide", "_carry_out"} <= names
