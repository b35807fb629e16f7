"""Process-wide state only where a process-wide fact needs it, each piece documented:
every module-level table of the package (an empty container, or one of the few stateful
singletons) is named in ARCHITECTURE.md's "Process-wide state" section."""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "langgraph_resilience"
_CONTAINERS = frozenset(
    {"dict", "set", "list", "OrderedDict", "defaultdict", "WeakKeyDictionary"}
    | {"WeakValueDictionary", "WeakSet", "SimpleQueue", "RunLeases", "_LocalLeases"}
)


def module_tables(root: pathlib.Path = PACKAGE) -> list[tuple[str, str]]:
    """(module path, name) of each module-level mutable table: ``{}``, ``[]`` or a
    container built with no arguments, or a stateful singleton."""
    found: list[tuple[str, str]] = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if not isinstance(node, ast.Assign | ast.AnnAssign) or node.value is None:
                continue
            value = node.value
            empty = isinstance(value, ast.Dict | ast.List | ast.Set) and not (
                value.keys if isinstance(value, ast.Dict) else value.elts
            )
            func = value.func if isinstance(value, ast.Call) else None
            called = getattr(func, "id", None) or getattr(func, "attr", None)
            built = isinstance(value, ast.Call) and not value.args and called in _CONTAINERS
            if empty or built:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                module = str(path.relative_to(root).with_suffix(""))
                found += [(module, t.id) for t in targets if isinstance(t, ast.Name)]
    return found


def _section() -> str:
    text = (ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8")
    start = text.index("## Process-wide state")
    return text[start : text.index("\n## ", start + 1)]


def test_every_module_level_table_is_documented() -> None:
    """A new registry needs its reason written down (module and name, as in the text)."""
    section = _section()
    missing = [
        f"{module}.{name}"
        for module, name in module_tables()
        if not module.startswith("testing")
        and (module.split("/")[-1] not in section or name not in section)
    ]
    assert missing == []


def test_the_finder_sees_a_table(tmp_path: pathlib.Path) -> None:
    """The checker itself: an empty dict, a WeakSet() and a constant table."""
    (tmp_path / "probe.py").write_text(
        "import weakref\n_A: dict[str, int] = {}\n_B = weakref.WeakSet()\n_C = {'x': 1}\n",
        encoding="utf-8",
    )
    assert module_tables(tmp_path) == [("probe", "_A"), ("probe", "_B")]
