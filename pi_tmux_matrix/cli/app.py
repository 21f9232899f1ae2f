"""Parser, dispatch, and the one place errors become exit codes."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import IO, Final

from .. import __version__
from ..errors import EXIT_FAILED, EXIT_USAGE, PiMatrixError, UsageError, exit_code_for
from .base import EPILOG, Io, Parser
from .verbs import top_help

__all__ = ["Io", "build_parser", "main", "run"]


# The verb modules in their --help order (the supervision verbs: host, master, the owner's verbs,
# tree), and which one registers each verb: a command imports only its own module, so ``ls`` does
# not pay for the dispatcher, the host or the renderer (docs/decisions.md#a-verb-loads-only-what-it-uses).
# tests/test_cli.py holds the map equal to the whole parser.
MODULES: Final = (
    "entries",
    "host",
    "master",
    "owner",
    "gc",
    "tree",
    "dispatch",
    "teamwork",
    "lanes",
    "status",
    "runs",
    "demo",
    "doctor",
    "completion",
    "top_screen",
    "attach",
    "fake_model",
)
VERB_MODULES: Final = {
    "ls": "entries",
    "show": "entries",
    "repair": "entries",
    "host": "host",
    "master": "master",
    "scan": "owner",
    "reconcile": "owner",
    "adopt": "owner",
    "cleanup": "owner",
    "send": "owner",
    "stop": "owner",
    "gc": "gc",
    "tree": "tree",
    "fire": "dispatch",
    "jobs": "dispatch",
    "job": "dispatch",
    "followup": "dispatch",
    "dismiss": "dispatch",
    "resume": "dispatch",
    "profiles": "dispatch",
    "var": "teamwork",
    "stop-session": "teamwork",
    "notify": "teamwork",
    "set-status": "teamwork",
    "templates": "teamwork",
    "workspace": "teamwork",
    "lanes": "lanes",
    "status": "status",
    "setup-help": "status",
    "guard": "status",
    "fork": "runs",
    "runs": "runs",
    "demo": "demo",
    "doctor": "doctor",
    "complete-names": "completion",
    "top": "top_screen",
    "attach": "attach",
    "logs": "attach",
    "fake-model": "fake_model",
    # completion walks the whole parser: not here, so it gets every verb.
}
DESCRIPTION: Final = "The durable process matrix for pi coding agents in tmux."
# Verbs whose process leaves by os._exit once its command returned (see run()).
QUICK_EXIT_VERBS: Final = frozenset({"host"})


def verb_of(words: Sequence[str]) -> str | None:
    """The verb ``words`` run (after the global options), or None (help, version, a typo)."""
    at = 0
    while at < len(words):
        word = words[at]
        if word == "--state-dir":
            at += 2
        elif word.startswith("--state-dir="):
            at += 1
        elif word.startswith("-"):
            return None
        else:
            return word
    return None


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line (also the source of the generated CLI reference), or only the
    verbs of the cli module ``only``."""
    parser = Parser(
        prog="pi-matrix",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"pi-matrix {__version__}")
    parser.add_argument(
        "--state-dir",
        metavar="DIR",
        help="the matrix state dir (default: see below)",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True
    for name in MODULES if only is None else (only,):
        importlib.import_module(f"{__package__}.{name}").register(sub, EPILOG)
    return parser


class _StderrHandler(logging.Handler):
    def __init__(self, stream: IO[str]) -> None:
        super().__init__(logging.WARNING)
        self.stream = stream

    def emit(self, record: logging.LogRecord) -> None:
        try:
            level = "warning" if record.levelno < logging.ERROR else "error"
            self.stream.write(f"pi-matrix: {level}: {record.getMessage()}\n")
            self.stream.flush()
        except Exception:  # noqa: BLE001 - logging must never take the command down
            self.handleError(record)


def main(argv: Sequence[str] | None = None, *, io: Io | None = None) -> int:
    """Run ``pi-matrix`` with ``argv``; returns the exit code (never calls sys.exit)."""
    io = io or Io(sys.stdout, sys.stderr)
    words = list(sys.argv[1:] if argv is None else argv)
    # Everything after the first "--" is the agent's argv, passed on untouched (never parsed,
    # never joined into a shell string).
    trailing: list[str] | None = None
    if "--" in words:
        cut = words.index("--")
        words, trailing = words[:cut], words[cut + 1 :]
    verb = verb_of(words)
    if verb is None and "--version" in words and "-h" not in words and "--help" not in words:
        io.out.write(f"pi-matrix {__version__}\n")  # what argparse would print, without the verbs
        return 0
    if verb is None and ("-h" in words or "--help" in words):
        # The verbs by group from their one table, without loading a verb's module.
        io.out.write(top_help(EPILOG, DESCRIPTION))
        return 0
    parser = build_parser(VERB_MODULES.get(verb or ""))
    try:
        args = parser.parse_args(words)
    except UsageError as exc:
        io.err.write(f"pi-matrix: error: {exc}\n")
        return exit_code_for(exc)
    except SystemExit as exc:  # --help, --version
        return exit_code_for(exc)
    if trailing is not None and not getattr(args, "takes_argv", False):
        io.err.write(f"pi-matrix: error: '{args.command}' takes no arguments after --\n")
        return EXIT_USAGE
    args.argv = trailing or []
    args.parser = parser  # completion walks the parser it was parsed with
    package_log = logging.getLogger("pi_tmux_matrix")
    handler = _StderrHandler(io.err)
    package_log.addHandler(handler)
    if package_log.level == logging.NOTSET:
        package_log.setLevel(logging.WARNING)
    try:
        command: Callable[[argparse.Namespace, Io], int] = args.handler
        return command(args, io)
    except PiMatrixError as exc:
        io.err.write(f"pi-matrix: error: {exc}\n")
        return exit_code_for(exc)
    except KeyboardInterrupt:
        io.err.write("pi-matrix: interrupted\n")
        return 130
    except BrokenPipeError:
        return EXIT_FAILED
    except OSError as exc:
        # A full disk, a read-only folder, a file where a folder should be: one line, never a
        # traceback (what the library could name, it already raised as a PiMatrixError).
        io.err.write(f"pi-matrix: error: {exc}\n")
        return exit_code_for(exc)
    finally:
        package_log.removeHandler(handler)


def run() -> None:
    """Console-script entry point."""
    code = main()
    words = sys.argv[1:]
    if verb_of(words[: words.index("--")] if "--" in words else words) in QUICK_EXIT_VERBS:
        # The host recorded its agent's end before it returned, and holds nothing else: tearing
        # the interpreter down costs ~20 ms of CPU per host, paid 50 times over when a team's
        # workers end at once, on the CPUs their master needs to deliver their handoffs.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
