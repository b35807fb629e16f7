"""The command's parser and entry point: ``langgraph-resilience demo|threads|resume|bench``."""

from __future__ import annotations

import argparse
import importlib
import os
import sqlite3
import sys
from collections.abc import Sequence
from typing import Any, NoReturn, TextIO

from langgraph_resilience.cli.options import DSN_ENV, UsageError

# The parser imports nothing heavy: `--help` and a usage error answer before
# LangGraph, psycopg or the demo are imported; a command imports what it runs.

__all__ = ["EXIT_USAGE", "build_parser", "main", "run"]

EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (no usage block)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def _answer_flags(parser: argparse.ArgumentParser, *, pause: bool) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--approve", action="store_true", help="a supervisor approves; the call runs again"
    )
    group.add_argument(
        "--skip",
        action="store_true",
        help="decline: the call is not run; the agent is told" + (" (default)" if pause else ""),
    )
    group.add_argument(
        "--edit",
        metavar="JSON",
        help="run the call with new arguments (a JSON object merged over the request's)",
    )
    group.add_argument(
        "--abort", action="store_true", help="stop the task (compensable effects are undone)"
    )
    if pause:
        group.add_argument(
            "--pause",
            action="store_true",
            help="leave the escalation pending; answer it later with `resume`",
        )


DEMO_EPILOG = """\
crash points (--crash-at STEP; the process is killed with SIGKILL, exit status 137,
after printing the command that resumes the thread):
  refund, goodwill_credit  inside the side-effecting tool, right after the effect and
                           before any checkpoint: `resume` reconciles it through the
                           tool's status check and never runs it twice
  NODE or NODE:K           at the boundary after the K-th run (default 1) of agent, tools,
                           retry, repair, planner, executor or escalate, once its
                           checkpoint is durable
  N                        after step N (the left column of the output)

the goodwill credit needs a human (POLICY). Without a flag the demo answers --skip on
your behalf: declining grants nothing, so it is the one answer a program may give for a
human. --pause leaves it waiting instead: `langgraph-resilience resume THREAD_ID --approve`
answers it later, from any process.
"""


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return value


Subparsers = Any  # argparse's _SubParsersAction is private


def _add_demo(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    demo = sub.add_parser(
        "demo",
        parents=[common],
        help="run the support agent whose tools fail in every way; explain each recovery",
        description="Run the support agent on a new thread and explain every recovery.",
        epilog=DEMO_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    demo.add_argument("--thread-id", help="thread id to use (default: a new one)")
    demo.add_argument("--seed", type=int, default=7, help="jitter seed (default: 7)")
    demo.add_argument(
        "--crash-at",
        metavar="STEP",
        help="kill the process at STEP: refund (inside the side effect, after it happened), "
        "a node name (agent, tools, retry, ...) or NODE:K, or a step number",
    )
    _answer_flags(demo, pause=True)
    demo.set_defaults(handler="commands:cmd_demo")


def _server_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url",
        help="a LangGraph Server (e.g. http://127.0.0.1:2024 for `langgraph dev`): its "
        "threads, through its API, instead of the local store",
    )


def _add_threads_and_resume(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    threads = sub.add_parser(
        "threads",
        parents=[common],
        help="list threads and where each stands",
        description="List the threads in the store, most recently written first: done, "
        "interrupted (why), failed, stopped.",
    )
    threads.add_argument(
        "--limit",
        type=_positive_int,
        metavar="N",
        help="only the N most recently written threads (default: all)",
    )
    _server_flags(threads)
    threads.set_defaults(handler="threads:cmd_threads", seed=7)
    resume = sub.add_parser(
        "resume",
        parents=[common],
        help="continue a thread, answering its pending escalation",
        description="Continue a thread after a crash, or answer the escalation it waits on.",
    )
    resume.add_argument("thread_id", metavar="THREAD_ID")
    resume.add_argument("--seed", type=int, default=7, help="jitter seed (default: 7)")
    _answer_flags(resume, pause=False)
    _server_flags(resume)
    resume.add_argument(
        "--assistant",
        default="agent",
        help="with --url: the graph (langgraph.json name) that runs the thread (default: agent)",
    )
    resume.set_defaults(handler="commands:cmd_resume")


def _add_bench(sub: Subparsers) -> None:
    bench = sub.add_parser(
        "bench",
        help="chaos benchmark: recovery under injected faults against plain LangGraph",
        description="Run the seeded task suite under fault mixes for each contender; print the "
        "table, write JSON and a PNG chart; exit 1 if add_resilience or the middleware "
        "misses a behaviour target.",
    )
    bench.add_argument("--quick", action="store_true", help="a small suite (< 1 minute)")
    bench.add_argument(
        "--contenders",
        nargs="+",
        help="contenders to run (default: toolnode retry_policy create_agent resilient middleware)",
    )
    bench.add_argument("--mix", nargs="+", help="fault mixes to run (default: all)")
    bench.add_argument("--seeds", type=int, help="fault seeds per task (pass^k)")
    bench.add_argument(
        "--out",
        help="directory for the JSON report and the chart (default: ./chaos-bench-DATE)",
    )
    bench.set_defaults(handler="commands:cmd_bench", json=False, jsonl=False)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``langgraph-resilience`` command."""
    common = _Parser(add_help=False)
    common.add_argument(
        "--dsn", help=f"PostgreSQL DSN (default: ${DSN_ENV}, else the embedded SQLite file)"
    )
    common.add_argument(
        "--state-dir",
        help="directory of the SQLite file (default: $XDG_STATE_HOME/langgraph-resilience)",
    )
    form = common.add_mutually_exclusive_group()
    form.add_argument("--json", action="store_true", help="one JSON document on stdout")
    form.add_argument(
        "--jsonl", action="store_true", help="JSON Lines on stdout, one record as it happens"
    )
    parser = _Parser(
        prog="langgraph-resilience",
        description="Classification-driven recovery for LangGraph agents: see it work.",
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add_demo(sub, common)
    _add_threads_and_resume(sub, common)
    _add_bench(sub)
    return parser


def main(
    argv: Sequence[str] | None = None,
    *,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
) -> int:
    """Entry point of the console script and of ``python -m langgraph_resilience``.

    `stdout`/`stderr` default to the process's streams; passing them lets a caller
    (a test, an embedding program) capture the output without swapping globals.
    """
    err = stderr if stderr is not None else sys.stderr
    try:
        args = build_parser().parse_args(argv)
    except UsageError as exc:
        print(f"langgraph-resilience: error: {one_line_of(exc)}", file=err)
        return EXIT_USAGE
    return _dispatch(args, stdout, err)


def one_line_of(exc: BaseException) -> str:
    """`cli.output.one_line`, imported only when there is an error to show."""
    from langgraph_resilience.cli.output import one_line  # noqa: PLC0415

    return one_line(exc)


def _dispatch(args: argparse.Namespace, stdout: TextIO | None, err: TextIO) -> int:
    """Run the parsed command; its user mistakes end in one line and exit code 2."""
    import httpx  # noqa: PLC0415 (imported by the command, not by --help)
    import psycopg  # noqa: PLC0415

    from langgraph_resilience.cli.output import Output, one_line  # noqa: PLC0415
    from langgraph_resilience.errors import (  # noqa: PLC0415
        PersistenceError,
        ThreadBusyError,
        ThreadNotFoundError,
    )

    module, _, name = str(args.handler).partition(":")
    if getattr(args, "url", None):  # a deployed graph: the server's threads
        module, name = "server", f"cmd_server_{args.command}"
    try:
        handler = getattr(importlib.import_module(f"langgraph_resilience.cli.{module}"), name)
        out = Output(json_mode=args.json, lines=getattr(args, "jsonl", False), file=stdout)
        code: int = handler(args, out)
        out.flush()
    except (UsageError, PersistenceError, ThreadBusyError, ThreadNotFoundError) as exc:
        print(f"langgraph-resilience: error: {one_line(exc)}", file=err)
        return EXIT_USAGE
    except (psycopg.OperationalError, sqlite3.OperationalError) as exc:
        print(f"langgraph-resilience: error: database failure: {one_line(exc)}", file=err)
        return EXIT_USAGE
    except httpx.HTTPError as exc:  # --url: the LangGraph server failed us
        where = f" at {args.url}" if getattr(args, "url", None) else ""
        if isinstance(exc, httpx.HTTPStatusError):
            why = f"answered {exc.response.status_code}: {one_line(exc)}"
        else:
            why = f"did not answer: {one_line(exc)} (is it running? `langgraph dev` starts one)"
        print(f"langgraph-resilience: error: the LangGraph server{where} {why}", file=err)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("langgraph-resilience: interrupted; `resume` continues the thread", file=err)
        return 130
    except BrokenPipeError:  # e.g. `| head`: stop quietly; the thread stays resumable
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return code


def run() -> None:
    """Console-script entry point: exit with `main`'s code."""
    sys.exit(main())
