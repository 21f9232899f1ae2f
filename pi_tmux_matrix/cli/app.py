"""Parser, dispatch, and the one place errors become exit codes."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from typing import IO, Final

import attrs

from .. import __version__
from ..errors import EXIT_FAILED, EXIT_NOT_FOUND, EXIT_OK, EXIT_USAGE, PiMatrixError
from . import completion, demo, dispatch, doctor, entries, runs, supervise, top

__all__ = ["Io", "build_parser", "main", "run"]

EPILOG: Final = f"""\
exit codes:
  {EXIT_OK}  success
  {EXIT_FAILED}  the operation failed (a conflict, a refused stop, a failed launch)
  {EXIT_USAGE}  bad input or usage: the message names the field and the fix; nothing was written
  {EXIT_NOT_FOUND}  the thing named does not exist (no such entry, job or profile)

state dir: --state-dir, else $PI_MATRIX_STATE_DIR, else
$PI_CODING_AGENT_DIR/state/process-matrix, else ~/.pi/agent/state/process-matrix
"""


@attrs.frozen
class Io:
    """Where a command writes: injected so tests render to strings at a fixed width."""

    out: IO[str]
    err: IO[str]
    width: int | None = None


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        # argparse's own usage errors are exit 2 with one line, like every other bad input.
        self.exit(EXIT_USAGE, f"pi-matrix: error: {message}\n(see '{self.prog} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    """The whole command line (also the source of the generated CLI reference)."""
    parser = _Parser(
        prog="pi-matrix",
        description="The durable process matrix for pi coding agents in tmux.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"pi-matrix {__version__}")
    parser.add_argument(
        "--state-dir",
        metavar="DIR",
        help="the matrix state dir (default: see below)",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    entries.register(sub, EPILOG)
    supervise.register(sub, EPILOG)
    dispatch.register(sub, EPILOG)
    runs.register(sub, EPILOG)
    demo.register(sub, EPILOG)
    doctor.register(sub, EPILOG)
    completion.register(sub, EPILOG)
    top.register(sub, EPILOG)
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
    parser = build_parser()
    words = list(sys.argv[1:] if argv is None else argv)
    # Everything after the first "--" is the agent's argv, passed on untouched (never parsed,
    # never joined into a shell string).
    trailing: list[str] | None = None
    if "--" in words:
        cut = words.index("--")
        words, trailing = words[:cut], words[cut + 1 :]
    try:
        args = parser.parse_args(words)
    except SystemExit as exc:
        return int(exc.code) if isinstance(exc.code, int) else EXIT_USAGE
    if trailing is not None and not getattr(args, "takes_argv", False):
        io.err.write(f"pi-matrix: error: '{args.command}' takes no arguments after --\n")
        return EXIT_USAGE
    args.argv = trailing or []
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
        return exc.exit_code
    except KeyboardInterrupt:
        io.err.write("pi-matrix: interrupted\n")
        return 130
    except BrokenPipeError:
        return EXIT_FAILED
    finally:
        package_log.removeHandler(handler)


def run() -> None:
    """Console-script entry point."""
    sys.exit(main())
