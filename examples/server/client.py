"""The other side of ``examples/server``: a client of the deployed agent.

Start the server in ``examples/server`` (``langgraph dev``, from ``pip install -e
".[dev]"``), then, from the repository root:

    python examples/server/client.py --url http://127.0.0.1:2024

It asks for a refund over the server's API, then reads where the thread stands
with `thread_status` on the server (a `langgraph_sdk` client: the server owns the
checkpointer), and lists the server's threads.
"""

from __future__ import annotations

import argparse

from langgraph_sdk import get_sync_client

from langgraph_resilience import list_threads, thread_status


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:2024")
    url = parser.parse_args().url
    with get_sync_client(url=url) as client:
        thread = client.threads.create()
        ask = {"messages": [{"role": "user", "content": "refund A-1042"}]}
        result = client.runs.wait(thread["thread_id"], "agent", input=ask)
        print("agent:", result["messages"][-1]["content"])
        status = thread_status(client, thread["thread_id"])
        print(f"thread {status.thread_id}: {status.state}, {status.tally.get('calls')}")
        print(f"threads on the server: {len(list_threads(client))}")


if __name__ == "__main__":
    main()
