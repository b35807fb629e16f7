"""Public modules import their names on first use (PEP 562).

`import langgraph_resilience` and `langgraph-resilience --help` then load no LangGraph,
psycopg or pydantic until a name that needs them is touched, and an in-memory user
never loads a database driver.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    module: str, homes: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The `__getattr__` and `__dir__` of public module `module`, whose names live in
    `homes` (name -> the module that defines it)."""
    namespace = vars(sys.modules[module])

    def __getattr__(name: str) -> Any:  # noqa: N807 (the module hook PEP 562 names)
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home), name)
        namespace[name] = value  # the next access is a plain module attribute
        return value

    def __dir__() -> list[str]:  # noqa: N807
        return sorted({*namespace, *homes})

    return __getattr__, __dir__
