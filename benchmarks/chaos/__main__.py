"""``python -m benchmarks.chaos``: the chaos benchmark, as ``langgraph-resilience bench``."""

import sys

from langgraph_resilience.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
