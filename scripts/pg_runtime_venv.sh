#!/usr/bin/env bash
# Build a separate virtual environment with LangGraph Server on the open Postgres + Redis
# runtime (langgraph-runtime-pg, MIT, with its `langhost` CLI), for
# tests/server/test_multi_worker.py:
#
#   scripts/pg_runtime_venv.sh /tmp/pgrt && export LGR_PG_RUNTIME_VENV=/tmp/pgrt
#
# It is its own venv because langgraph-runtime-pg pins langgraph-api==0.11.1 and
# langgraph-checkpoint-postgres==3.1.0, older than what the dev extra's
# langgraph-cli[inmem] brings; installing it there would downgrade the dev stack.
# The package is installed editable so the deployed test graphs import this checkout.
set -euo pipefail
if [ $# -ne 1 ]; then
  echo "usage: $0 VENV_DIR" >&2
  exit 2
fi
repo="$(cd "$(dirname "$0")/.." && pwd)"
python3 -m venv "$1"
"$1/bin/python" -m pip install -q --upgrade pip
"$1/bin/python" -m pip install -q -e "$repo" \
  "langgraph-runtime-pg==0.11.1.post1" "langhost==0.11.1.post1" "langgraph-api==0.11.1"
"$1/bin/python" -m pip check
test -x "$1/bin/langhost"
