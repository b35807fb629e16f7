"""The import rules of ARCHITECTURE.md, enforced: each room imports only what it may.

- ``core/`` is pure: the standard library, pydantic, langchain-core's types and
  ``langgraph.errors``, and nothing of the package outside ``core/`` and
  ``errors``; no psycopg, no sqlite3, no LangGraph graph machinery.
- ``stores/`` import nothing of ``_graph/``, ``cli/`` or ``testing/``.
- ``_graph/`` imports nothing of ``cli/`` or ``testing/``.
- nothing in the package imports the benchmarks (they are not in the wheel).
"""

from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "langgraph_resilience"

FORBIDDEN: dict[str, tuple[str, ...]] = {
    "core": (
        "langgraph_resilience._graph",
        "langgraph_resilience.stores",
        "langgraph_resilience.cli",
        "langgraph_resilience.testing",
        "langgraph_resilience.events",
        "psycopg",
        "psycopg_pool",
        "sqlite3",
        "aiosqlite",
        "langgraph.graph",
        "langgraph.pregel",
        "langgraph.prebuilt",
        "langgraph.checkpoint",
        "langgraph.types",
        "mcp",
        "langchain_mcp_adapters",
        "anyio",
        "benchmarks",
    ),
    "stores": (
        "langgraph_resilience._graph",
        "langgraph_resilience.cli",
        "langgraph_resilience.testing",
        "benchmarks",
    ),
    "_graph": ("langgraph_resilience.cli", "langgraph_resilience.testing", "benchmarks"),
    "testing": ("langgraph_resilience.cli", "benchmarks"),
}


def imports_of(path: pathlib.Path, root: pathlib.Path) -> list[tuple[int, str]]:
    """Every module `path` imports (absolute; ``from . import x`` resolved), with its line."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = ".".join(path.relative_to(root.parent).with_suffix("").parts[:-1])
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            found.append((node.lineno, module))
    return found


def _violations(room: str, root: pathlib.Path = PACKAGE) -> list[str]:
    bad: list[str] = []
    for path in sorted((root / room).rglob("*.py")):
        shown = path.relative_to(root.parent)
        bad.extend(
            f"{shown}:{line} imports {module}"
            for line, module in imports_of(path, root)
            if any(module == b or module.startswith(b + ".") for b in FORBIDDEN[room])
        )
    return bad


@pytest.mark.parametrize("room", sorted(FORBIDDEN))
def test_room_imports_only_what_it_may(room: str) -> None:
    """No module of `room` imports a module its rules forbid."""
    assert _violations(room) == []


def test_the_rules_catch_a_violation(tmp_path: pathlib.Path) -> None:
    """The checker itself: a forbidden import, absolute or relative, is found."""
    root = tmp_path / "langgraph_resilience"
    (root / "core").mkdir(parents=True)
    probe = root / "core" / "probe.py"
    probe.write_text("from .._graph import tools\nimport psycopg\n", encoding="utf-8")
    found = _violations("core", root)
    assert any("imports langgraph_resilience._graph" in v for v in found)
    assert any("imports psycopg" in v for v in found)
