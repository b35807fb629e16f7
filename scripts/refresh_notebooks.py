"""Execute every notebook and store its outputs in place, so a reader on a code host
sees what each cell prints and draws. CI checks that the stored text outputs are
what the notebooks print (tests/test_notebooks_and_examples.py).

Run it from the repository root after changing a notebook (or the code it shows):

    python scripts/refresh_notebooks.py [notebooks/02_retry_backoff_budgets.ipynb ...]
"""

from __future__ import annotations

import pathlib
import sys
import tempfile

import nbformat
from nbclient import NotebookClient

ROOT = pathlib.Path(__file__).resolve().parent.parent


def refresh(path: pathlib.Path) -> None:
    """Run `path` in a fresh kernel (in a scratch directory) and write it back."""
    notebook = nbformat.read(path, as_version=4)
    with tempfile.TemporaryDirectory() as scratch:
        client = NotebookClient(
            notebook, kernel_name="python3", timeout=120, resources={"metadata": {"path": scratch}}
        )
        client.execute()
    for cell in notebook.cells:
        cell.get("metadata", {}).pop("execution", None)
    notebook.metadata.pop("widgets", None)
    nbformat.write(notebook, path)


def main(argv: list[str]) -> int:
    paths = [pathlib.Path(a) for a in argv] or sorted((ROOT / "notebooks").glob("*.ipynb"))
    for path in paths:
        print(f"running {path.name} ...", flush=True)
        refresh(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
