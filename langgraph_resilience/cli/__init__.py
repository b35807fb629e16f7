"""The ``langgraph-resilience`` command: ``demo``, ``threads`` and ``resume``.

``demo`` runs the support agent (`langgraph_resilience.cli.demo`) on a new thread and
prints, step by step, every tool call that failed, how it was classified, which
path recovered it and what that cost, then a table of every call and the back
office's side-effect log. Its state lives in an embedded SQLite file under
``$XDG_STATE_HOME/langgraph-resilience`` or, with ``--dsn postgresql://...`` (or
``LANGGRAPH_RESILIENCE_DSN``), in Postgres.

The goodwill credit the agent offers is above its limit: a POLICY failure that
only a human may decide. ``demo`` answers it on your behalf with ``--skip`` (the
default: declining grants nothing, so it is the one answer a program may give
for a human), ``--approve``, ``--edit JSON`` or ``--abort``; ``--pause`` leaves
the thread waiting durably instead, for ``resume THREAD_ID --approve`` from any
process, later.

``demo --crash-at STEP`` kills the process (SIGKILL: no cleanup, exit status 137
in a shell) at STEP, after printing the thread id and the command that resumes
it:

- ``refund`` (or ``goodwill_credit``): inside the side-effecting tool, right
  after the money moved and before anything else is recorded, the crash that
  makes naive agents pay twice; ``resume`` reconciles it through the tool's
  status check instead of running it again;
- ``NODE`` or ``NODE:K`` (``agent``, ``tools``, ``retry``, ``repair``, ``planner``,
  ``executor``, ``escalate``): at the node boundary after the K-th (default
  first) run of that node, once its checkpoint is durable;
- ``N``: after step N, as numbered in the left column of the output.

``threads`` lists the threads with where each stands; ``resume`` continues one
(holding its thread lock: a second concurrent ``resume`` is refused). User
mistakes end in one line on stderr and exit code 2, never a traceback.

The rooms: `main` (parser, entry point), `commands` (demo, resume, bench),
`threads`, `runner` (streams a thread, answers escalations, crashes on request),
`steps` (one line per event as it streams), `explain` and `summary` (a thread
after the fact), `session` (the store and the demo graph on it), `options`,
`output`; `demo` is the support agent itself.
"""

from langgraph_resilience.cli.main import build_parser, main, run

__all__ = ["build_parser", "main", "run"]
