"""``python -m langgraph_resilience`` runs the command-line interface."""

import sys

from langgraph_resilience.cli import main

sys.exit(main())
