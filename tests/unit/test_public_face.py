"""The public face: a few modules, a top level of at most 35 names, each documented.

Everything a user imports comes from one of `PUBLIC_MODULES`; every other module is
internal and may change without notice. Each public name appears in the README, docs/api.md, an
example or a notebook, and those import nothing but the public modules.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import pathlib
import re

import pytest

import langgraph_resilience

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _reference() -> object:
    spec = importlib.util.spec_from_file_location(
        "api_reference", ROOT / "scripts" / "api_reference.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


REFERENCE = _reference()
PUBLIC_MODULES: tuple[str, ...] = REFERENCE.PUBLIC_MODULES  # type: ignore[attr-defined]
TOP_LEVEL = [
    "EVENT_KEY",
    "AnswerPendingNode",
    "BreakerConfig",
    "ConfigurationError",
    "EscalateNode",
    "FailureClass",
    "GuardedToolNode",
    "PartialResult",
    "RepairNode",
    "ResilienceError",
    "ResilienceMiddleware",
    "ResiliencePolicy",
    "ResilienceState",
    "ResilienceWarning",
    "RetryNode",
    "Rule",
    "ThreadBusyError",
    "ToolError",
    "ToolProfile",
    "add_resilience",
    "aopen_postgres",
    "aresume",
    "current_idempotency_key",
    "current_item_keys",
    "list_threads",
    "next_step",
    "open_postgres",
    "open_sqlite",
    "resilient_model",
    "resume",
    "route_after_agent",
    "status_from",
    "thread_status",
    "tool_error_of",
]


def _documents() -> dict[str, str]:
    """The README, docs/, the examples and the notebooks' code and text, by path."""
    found = {"README.md": (ROOT / "README.md").read_text(encoding="utf-8")}
    for path in sorted((ROOT / "docs").glob("*.md")):
        found[str(path.relative_to(ROOT))] = path.read_text(encoding="utf-8")
    for path in sorted((ROOT / "examples").rglob("*.py")):
        found[str(path.relative_to(ROOT))] = path.read_text(encoding="utf-8")
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        found[str(path.relative_to(ROOT))] = "\n".join("".join(c["source"]) for c in cells)
    return found


def _readme_code() -> list[str]:
    """The ``python`` blocks of the README and of docs/."""
    texts = [(ROOT / "README.md").read_text(encoding="utf-8")]
    texts += [path.read_text(encoding="utf-8") for path in sorted((ROOT / "docs").glob("*.md"))]
    return [code for text in texts for code in re.findall(r"```python\n(.*?)```", text, re.DOTALL)]


def _public(module_name: str) -> object:
    """A public module; skipped where the optional extra it needs is not installed
    (the oldest-versions run installs only the test extra, without opentelemetry)."""
    if module_name.endswith(".telemetry"):
        pytest.importorskip("opentelemetry", reason="the otel extra is not installed")
    return importlib.import_module(module_name)


def package_imports(source: str) -> set[str]:
    """The package's modules `source` imports (names imported from it, not attributes)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
            "langgraph_resilience"
        ):
            found.add(node.module or "")
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("langgraph_resilience")}
    return found


def test_the_top_level_is_small_and_pinned() -> None:
    """What `from langgraph_resilience import *` gives is this list, at most 35 names."""
    assert langgraph_resilience.__all__ == TOP_LEVEL
    assert len(TOP_LEVEL) <= 35


@pytest.mark.parametrize("module_name", PUBLIC_MODULES)
def test_every_public_name_is_importable_and_documented(module_name: str) -> None:
    """Each name a public module exports imports, and a reader meets it in the README,
    docs/, an example or a notebook."""
    module = _public(module_name)
    documents = _documents()
    undocumented = []
    for name in module.__all__:
        namespace: dict[str, object] = {}
        exec(f"from {module_name} import {name}", namespace)
        assert namespace[name] is getattr(module, name)
        if not any(re.search(rf"\b{name}\b", text) for text in documents.values()):
            undocumented.append(name)
    assert undocumented == [], f"{module_name}: not in the README, docs, examples or notebooks"


def test_a_name_lives_in_one_public_module() -> None:
    """No name is exported by two public submodules (the top level re-exports the
    errors users catch most from `errors`, its home), so none has two homes."""
    seen: dict[str, str] = {}
    twice = []
    for module_name in PUBLIC_MODULES[1:]:
        for name in _public(module_name).__all__:  # type: ignore[attr-defined]
            if name in seen:
                twice.append(f"{name}: {seen[name]} and {module_name}")
            seen[name] = module_name
    assert twice == []


def test_the_readme_imports_only_public_modules() -> None:
    """The code in the README and docs/ imports nothing internal (examples and
    notebooks are checked where they are executed)."""
    imported = set().union(*(package_imports(code) for code in _readme_code()))
    assert imported <= set(PUBLIC_MODULES), sorted(imported - set(PUBLIC_MODULES))


def test_the_api_reference_is_current() -> None:
    """docs/api.md lists every public name with its docstring's first sentence, as
    `python scripts/api_reference.py` writes it now."""
    pytest.importorskip("opentelemetry", reason="the otel extra is not installed")
    stored = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    assert stored == REFERENCE.render(), "run python scripts/api_reference.py"  # type: ignore[attr-defined]


def _parameters(function: object) -> dict[str, tuple[object, object]]:
    import inspect  # noqa: PLC0415

    signature = inspect.signature(function)  # type: ignore[arg-type]
    return {
        name: (parameter.annotation, parameter.default)
        for name, parameter in signature.parameters.items()
        if name != "self"
    }


def test_a_keyword_means_one_thing_at_every_entry_point() -> None:
    """`add_resilience`, `ResilienceMiddleware` and `GuardedToolNode` take the same
    configuration: a keyword two of them accept has one type and one default in all of
    them (a default changed in one place only would silently split their behaviour)."""
    from langgraph_resilience import (  # noqa: PLC0415
        GuardedToolNode,
        ResilienceMiddleware,
        add_resilience,
    )
    from langgraph_resilience.mcp import mcp_server_tool  # noqa: PLC0415

    entry_points = {
        "add_resilience": _parameters(add_resilience),
        "ResilienceMiddleware": _parameters(ResilienceMiddleware.__init__),
        "GuardedToolNode": _parameters(GuardedToolNode.__init__),
        "mcp_server_tool": _parameters(mcp_server_tool),
    }
    shared = {"tools"}  # the middleware takes tools create_agent does not (BaseTools only)
    disagreements = []
    names = set().union(*entry_points.values()) - shared
    for name in sorted(names):
        seen = {where: found[name] for where, found in entry_points.items() if name in found}
        if len(set(map(repr, seen.values()))) > 1:
            disagreements.append(f"{name}: {seen}")
    assert not disagreements, "\n".join(disagreements)
    common = set.intersection(*(set(p) for p in list(entry_points.values())[:3]))
    assert common >= {"policy", "profiles", "clock", "rng", "rules", "breaker", "idempotency"}
