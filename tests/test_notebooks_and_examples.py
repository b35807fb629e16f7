"""Every notebook executes cleanly and every example exits 0, as users will run them.

Notebooks run in a real IPython kernel started from this interpreter (so they see
the installed package and nothing else); only the nbclient driver runs in-process.
Examples run as ``python examples/<name>.py`` from the repository root, exactly as
their docstrings say.
"""

from __future__ import annotations

import ast
import json
import os
import pathlib
import re
import subprocess
import sys
from typing import Any

import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpec, KernelSpecManager
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient
from traitlets import default

from tests.unit.test_public_face import PUBLIC_MODULES as REFERENCE_MODULES

ROOT = pathlib.Path(__file__).resolve().parent.parent
DSN_ENV = "LANGGRAPH_RESILIENCE_DSN"
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
PUBLIC_MODULES = set(REFERENCE_MODULES)
"""What notebooks and examples may import from the package: the public API only."""


def _ids(paths: list[pathlib.Path]) -> list[str]:
    return [path.name for path in paths]


class ThisInterpreterSpecs(KernelSpecManager):
    """Resolves every kernel name to an IPython kernel on `sys.executable`, whatever
    kernel specs happen to be installed on the machine (a user-level ``python3`` spec
    may point at another interpreter)."""

    def get_kernel_spec(self, kernel_name: str) -> KernelSpec:
        return KernelSpec(
            argv=[sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            display_name=f"Python ({sys.executable})",
            language="python",
            resource_dir=str(ROOT),
        )


class ThisInterpreterKernel(AsyncKernelManager):
    """The kernel manager nbclient creates (and so shuts down and cleans up itself)."""

    @default("kernel_spec_manager")
    def _this_interpreter_specs(self) -> KernelSpecManager:
        return ThisInterpreterSpecs()


def _code_cells(path: pathlib.Path) -> list[Any]:
    notebook = nbformat.read(path, as_version=4)
    return [cell for cell in notebook.cells if cell.cell_type == "code"]


def _package_imports(source: str) -> set[str]:
    modules: set[str] = set()
    # Notebook cells may use top-level await, which IPython allows.
    flags = ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
    for node in ast.walk(compile(source, "<source>", "exec", flags=flags)):
        if isinstance(node, ast.ImportFrom) and node.module:
            modules.add(node.module)
        elif isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
    return {m for m in modules if m.split(".")[0] == "langgraph_resilience"}


def test_there_are_notebooks_and_examples() -> None:
    """The globs find something, so an emptied directory cannot pass silently."""
    assert NOTEBOOKS
    assert EXAMPLES


def _execute(notebook: Any, cwd: pathlib.Path) -> None:
    """Run every cell in a fresh kernel; nbclient raises on the first failing cell."""
    client = NotebookClient(
        notebook,
        kernel_name="python3",
        kernel_manager_class=ThisInterpreterKernel,
        timeout=120,
        allow_errors=False,
        resources={"metadata": {"path": str(cwd)}},
    )
    client.execute()


@pytest.mark.slow
def test_kernel_runs_on_this_interpreter(tmp_path: pathlib.Path) -> None:
    """The notebook kernel is the interpreter running the tests, so it sees this package."""
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell("import sys; print(sys.executable, end='')")]

    _execute(notebook, tmp_path)

    [output] = notebook.cells[0].outputs
    assert pathlib.Path(output.text).resolve() == pathlib.Path(sys.executable).resolve()


_VOLATILE = (
    (re.compile(r"/tmp/[\w./-]+"), "<tmp>"),
    (re.compile(r"\b(?=[0-9a-f]*\d)[0-9a-f]{8,}\b"), "<hex>"),
    (re.compile(r"\b[0-9a-f]{4,}…"), "<hex>…"),
    (re.compile(r"0x[0-9a-f]+"), "<addr>"),
)
"""What differs from run to run and says nothing: scratch paths, random ids (thread
ids, idempotency keys), object addresses."""

MAX_NOTEBOOK_BYTES = 120_000
"""A stored notebook, outputs and plots included, stays small."""


def printed(cell: Any) -> list[str]:
    """What a code cell showed, as sorted lines: its text streams joined (however they
    were chunked), its displays (an image as ``<image>``), its error, each volatile
    part replaced. Sorted, because parallel tool calls may print in either order."""
    parts: list[str] = []
    for output in cell.get("outputs", []):
        if output.output_type == "stream":
            parts.append(output.text)
        elif output.output_type in ("execute_result", "display_data"):
            data = output.get("data", {})
            if "image/png" in data:
                parts.append("<image>\n")
            else:
                parts.append(str(data.get("text/markdown") or data.get("text/plain", "")) + "\n")
        elif output.output_type == "error":
            parts.append(f"error: {output.ename}\n")
    text = "".join(parts)
    for pattern, replacement in _VOLATILE:
        text = pattern.sub(replacement, text)
    return sorted(line.rstrip() for line in text.splitlines())


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_notebook_executes_and_prints_what_is_stored(
    path: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    """Every cell runs in a fresh kernel without an error, and prints what the stored
    notebook shows a reader (refresh it with ``python scripts/refresh_notebooks.py``)."""
    stored = nbformat.read(path, as_version=4)
    notebook = nbformat.read(path, as_version=4)

    _execute(notebook, tmp_path)

    ran = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert all(cell.execution_count is not None for cell in ran)
    errors = [o for cell in ran for o in cell.outputs if o.output_type == "error"]
    assert errors == []
    kept = [cell for cell in stored.cells if cell.cell_type == "code"]
    for index, (now, then) in enumerate(zip(ran, kept, strict=True)):
        assert printed(now) == printed(then), (
            f"{path.name}, code cell {index}: the stored output is stale; run "
            f"python scripts/refresh_notebooks.py {path.relative_to(ROOT)}"
        )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_notebook_is_stored_with_its_outputs(path: pathlib.Path) -> None:
    """A reader on a code host sees what each cell prints and draws; the file stays
    small (plots at a low resolution)."""
    cells = _code_cells(path)
    assert all(cell.execution_count is not None for cell in cells), f"{path.name}: not run"
    assert any(cell.outputs for cell in cells), f"{path.name}: stored without outputs"
    assert path.stat().st_size < MAX_NOTEBOOK_BYTES, f"{path.name}: {path.stat().st_size} bytes"


@pytest.mark.parametrize("path", [*NOTEBOOKS, *EXAMPLES], ids=_ids([*NOTEBOOKS, *EXAMPLES]))
def test_only_the_public_api_is_imported(path: pathlib.Path) -> None:
    """Notebooks and examples import the package's public modules only."""
    if path.suffix == ".ipynb":
        sources = [cell.source for cell in _code_cells(path)]
    else:
        sources = [path.read_text(encoding="utf-8")]
    imported = set().union(*(_package_imports(source) for source in sources))
    assert imported <= PUBLIC_MODULES, f"private imports: {sorted(imported - PUBLIC_MODULES)}"


def _run_example(path: pathlib.Path, env: dict[str, str]) -> str:
    result = subprocess.run(
        [sys.executable, str(path.relative_to(ROOT))],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    assert result.stdout.strip(), "the example printed nothing"
    return result.stdout


@pytest.mark.slow
@pytest.mark.parametrize("path", EXAMPLES, ids=_ids(EXAMPLES))
def test_example_exits_zero(path: pathlib.Path) -> None:
    """``python examples/<name>.py`` from the repository root exits 0; with no DSN
    named it touches no database server (the embedded SQLite default)."""
    env = {k: v for k, v in os.environ.items() if k != DSN_ENV}
    out = _run_example(path, env)
    assert "PostgreSQL at" not in out


POSTGRES_EXAMPLES = [p for p in EXAMPLES if DSN_ENV in p.read_text(encoding="utf-8")]


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.parametrize("path", POSTGRES_EXAMPLES, ids=_ids(POSTGRES_EXAMPLES))
def test_a_postgres_example_runs_on_the_database_it_is_given(
    path: pathlib.Path, pg_dsn: str
) -> None:
    """With ``LANGGRAPH_RESILIENCE_DSN`` naming a fresh database, the example runs there."""
    out = _run_example(path, {**os.environ, DSN_ENV: pg_dsn})
    assert "PostgreSQL at" in out


@pytest.mark.parametrize("path", EXAMPLES, ids=_ids(EXAMPLES))
def test_example_starts_with_a_docstring_saying_how_to_run_it(path: pathlib.Path) -> None:
    """Each example opens with a module docstring that gives its run command."""
    docstring = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
    assert docstring, f"{path.name} has no module docstring"
    assert f"python examples/{path.name}" in docstring


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_notebook_declares_the_python3_kernel(path: pathlib.Path) -> None:
    """Notebooks name the standard python3 kernel, which CI and users both have."""
    metadata = json.loads(path.read_text(encoding="utf-8"))["metadata"]
    assert metadata["kernelspec"]["name"] == "python3"


@pytest.mark.slow
def test_an_offline_html_export_shows_the_graph() -> None:
    """nbconvert's HTML hides a Mermaid block until mermaid.js, loaded from the network,
    draws it; the graph's edges are also printed as text, which shows offline."""
    from nbconvert import HTMLExporter  # noqa: PLC0415

    path = ROOT / "notebooks" / "01_classification_and_envelope.ipynb"
    html, _ = HTMLExporter().from_notebook_node(nbformat.read(path, as_version=4))
    plain: list[str] = re.findall(r"<pre>(.*?)</pre>", html, re.DOTALL)
    assert any("answer_pending --&gt; agent" in block for block in plain)
    assert any("tools -.-&gt; retry" in block for block in plain)
    assert "$$" not in (ROOT / "notebooks" / "00_why_this_matters.ipynb").read_text()
