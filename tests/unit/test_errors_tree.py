"""The exception tree drawn in `errors.py` is the real one, and every exception the
package exports is raised somewhere in it."""

from __future__ import annotations

import builtins
import functools
import importlib
import inspect
import pathlib
import pkgutil
import re

import langgraph_resilience
from langgraph_resilience import errors

_PACKAGE = pathlib.Path(langgraph_resilience.__file__).parent
_BRANCH = re.compile(r"^(?P<indent>[ │]*)[├└]── (?P<name>\w+)")


def _drawn() -> dict[str, str]:
    """Each class drawn in the docstring's tree -> the class drawn as its parent."""
    parents: dict[str, str] = {}
    stack = ["Exception"]
    for line in (errors.__doc__ or "").splitlines():
        match = _BRANCH.match(line.strip("\n")[4:])
        if match is None:
            continue
        depth = len(match["indent"]) // 4
        del stack[depth + 1 :]
        parents[match["name"]] = stack[depth]
        stack.append(match["name"])
    return parents


@functools.cache
def _package_exceptions() -> tuple[dict[str, type], tuple[str, ...]]:
    """Every exception class the package defines (the CLI and test doubles aside), and
    the modules not imported because an optional extra (mcp, otel) is not installed."""
    found: dict[str, type] = {}
    missing: list[str] = []
    for module in pkgutil.walk_packages(langgraph_resilience.__path__, "langgraph_resilience."):
        if module.name.endswith("__main__") or ".cli" in module.name or ".testing" in module.name:
            continue
        try:
            imported = importlib.import_module(module.name)
        except ModuleNotFoundError as exc:
            if (exc.name or "").startswith("langgraph_resilience"):
                raise
            missing.append(module.name)
            continue
        for value in vars(imported).values():
            ours = inspect.isclass(value) and value.__module__.startswith("langgraph_resilience")
            if ours and issubclass(value, BaseException):
                found[value.__name__] = value
    return found, tuple(missing)


def _class(name: str) -> type | None:
    """The class drawn as `name`; None when its module needs an extra not installed."""
    found, missing = _package_exceptions()
    value = found.get(name) or getattr(builtins, name, None)
    if value is None and missing:
        return None
    assert isinstance(value, type), f"{name} is drawn in errors.py but defined nowhere"
    return value


def test_the_drawn_tree_is_the_class_hierarchy() -> None:
    """Every drawn class exists under its drawn parent, and every exception class the
    package defines (but private ones) is drawn."""
    drawn = _drawn()
    for name, parent in drawn.items():
        child, base = _class(name), _class(parent)
        if child is not None and base is not None:
            assert base in child.__mro__[1:], f"{name} is not a {parent}"
    undrawn = {n for n in _package_exceptions()[0] if not n.startswith("_")} - set(drawn)
    assert not undrawn, f"not drawn in errors.py's tree: {sorted(undrawn)}"


def test_every_exported_exception_is_drawn_and_raised() -> None:
    drawn = _drawn()
    source = "\n".join(p.read_text() for p in _PACKAGE.rglob("*.py"))
    for name in langgraph_resilience.__all__:
        value = getattr(langgraph_resilience, name)
        if not (isinstance(value, type) and issubclass(value, BaseException | Warning)):
            continue
        assert name in drawn, f"{name} is exported but missing from errors.py's tree"
        subclasses = [n for n, p in drawn.items() if p == name]
        raised = re.search(rf"raise {name}\b|\b{name}\(", source.replace(f"class {name}(", ""))
        as_category = rf"^\s+{name},$|category={name}\b"  # warnings.warn(text, Name, ...)
        warned = issubclass(value, Warning) and re.search(as_category, source, re.M)
        assert raised or warned or subclasses, f"{name} is exported but never raised"
