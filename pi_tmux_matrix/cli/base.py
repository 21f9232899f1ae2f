"""What every verb module shares: the output sink (``Io``), the parser class and the epilog.

Kept apart from ``app`` so verb modules never import the module that imports them.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Iterable, Iterator
from typing import IO, TYPE_CHECKING, Final, NamedTuple

from ..errors import (
    EXIT_FAILED,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_USAGE,
    ContractError,
    PiMatrixError,
    UsageError,
)
from .verbs import HIDDEN, SUMMARY

if TYPE_CHECKING:
    from typing import TypeAlias

    from ..matrix.retention import Report
    from ..matrix.store import MatrixStore, Problem

    # What ``register(sub, epilog)`` adds its verbs to. Named for the type checker only: argparse's
    # action class takes no type argument at run time.
    Verbs: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]

__all__ = [
    "EPILOG",
    "STOP_WORD",
    "Io",
    "Parser",
    "add_verb",
    "age",
    "confirmed",
    "public_verbs",
    "report_problems",
    "require_matrix",
    "settle_and_sweep",
    "stop_target",
    "store_of",
    "sweep_history",
]

log = logging.getLogger(__name__)

EPILOG: Final = f"""\
exit codes:
  {EXIT_OK}  success
  {EXIT_FAILED}  the operation failed (a conflict, a refused stop, a failed launch)
  {EXIT_USAGE}  bad input or usage: the message names the field and the fix; nothing was written
  {EXIT_NOT_FOUND}  the thing named does not exist (no such entry, job or profile)

state dir: --state-dir, else $PI_MATRIX_STATE_DIR, else
$PI_CODING_AGENT_DIR/state/process-matrix, else ~/.pi/agent/state/process-matrix
"""


class Io(NamedTuple):
    """Where a command writes: injected so tests render to strings at a fixed width. (A named
    tuple, immutable like our attrs classes: every verb builds one, and ``--version`` or ``ls``
    should not import attrs for it.)"""

    out: IO[str]
    err: IO[str]
    width: int | None = None


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        # argparse's own usage errors are exit 2 with one line, like every other bad input, and
        # written where every other error is (main's stderr, not the process's).
        raise UsageError(f"{message}\n(see '{self.prog} --help')")


def add_verb(sub: Verbs, name: str, epilog: str, *, usage: str | None = None) -> argparse.ArgumentParser:
    """A verb's parser, its summary from :data:`.verbs.SUMMARY` (the one place a verb is
    described), ending its help with the shared epilog (kept as written, not re-wrapped). A verb
    the product runs for itself (:data:`.verbs.HIDDEN`) has no summary and is not listed."""
    raw = argparse.RawDescriptionHelpFormatter
    # argparse lists a verb in --help whenever ``help`` is passed, even as None: only a verb
    # given one gets it.
    if name in HIDDEN:
        return sub.add_parser(name, epilog=epilog, formatter_class=raw, usage=usage)
    return sub.add_parser(name, help=SUMMARY[name], epilog=epilog, formatter_class=raw, usage=usage)


def report_problems(problems: Iterable[Problem], io: Io) -> None:
    """Every entry file a listing could not read, one warning line each, then what to do: run
    ``repair`` for corrupt or foreign files (it quarantines them), upgrade for files a newer
    pi-matrix wrote (repair leaves those alone). The valid entries were listed all the same."""
    kinds: set[str] = set()
    for problem in problems:
        kinds.add(problem.kind)
        io.err.write(f"pi-matrix: warning: {problem.line()}\n")
    if kinds - {"newer"}:
        io.err.write(
            "pi-matrix: hint: run 'pi-matrix repair' to move the unreadable files to quarantine/ "
            "('pi-matrix repair --dry-run' shows what it would move)\n"
        )
    if "newer" in kinds:
        io.err.write(
            "pi-matrix: hint: files written by a newer pi-matrix are left alone by repair; "
            "upgrade pi-matrix to read them\n"
        )


def store_of(args: argparse.Namespace) -> MatrixStore:
    """The store of the state dir the command names (``--state-dir``, else the default chain)."""
    from ..matrix.store import MatrixStore
    from ..settings import resolve_state_dir

    return MatrixStore(resolve_state_dir(args.state_dir))


def sweep_history(store: MatrixStore) -> Report | None:
    """The state dir's sweep after a reconcile (``reconcile``, a master's activation): at most
    once an hour, never raising (``retention.sweep_if_due``); imported only when it runs, so a
    verb that never reconciles does not load the dispatcher's and the fork runs' records."""
    from ..retention import sweep_if_due

    return sweep_if_due(store)


def settle_and_sweep(store: MatrixStore) -> Report | None:
    """A master's housekeeping after its activation's reconcile: the job rounds whose host and
    agent both ended unseen get their result (the master notices too:
    docs/decisions.md#a-hostless-round-stays-open-until-its-agent-ends), then the
    sweep. Never raising: a record it cannot write is the next reader's to write."""
    from ..matrix.records import RecordStore

    try:
        # The dispatcher's records are loaded only when there is a job (~12 ms of a master's start).
        if RecordStore(store, "jobs").names():
            from ..dispatch.hostless import settle_all

            settle_all(store)
    except (PiMatrixError, OSError) as exc:
        log.warning("the open rounds of dead hosts were not settled: %s", exc)
    return sweep_history(store)


def age(then_ms: int | None, now: int | None = None) -> str:
    """How long ago, in the largest unit that still reads exactly enough (``-`` for never)."""
    if then_ms is None:
        return "-"
    if now is None:
        from ..matrix.store import now_ms

        now = now_ms()
    seconds = max(0, (now - then_ms) // 1000)
    for unit, size, below in (("s", 1, 120), ("m", 60, 7200), ("h", 3600, 48 * 3600)):
        if seconds < below:
            return f"{seconds // size}{unit}"
    return f"{seconds // 86400}d"


def public_verbs(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """Each verb a person types, with its parser. A hidden verb (one of the programs the product
    starts of itself) is registered without ``help``, so argparse lists it nowhere; it is left out
    of completion and the reference too."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            listed = {c.dest for c in action._choices_actions}
            for name, sub in action.choices.items():
                if name in listed:
                    yield name, sub


def require_matrix(verb: str) -> None:
    """The off switch: with ``processMatrix.enabled: false`` nothing may be written, so a verb
    that writes (or whose reads would create the state dir) refuses, saying why."""
    from ..settings import load_settings

    if not load_settings().enabled:
        raise ContractError(
            "processMatrix.enabled",
            f"is false, so the matrix writes nothing and '{verb}' cannot run",
            "enable the matrix in settings.json (processMatrix.enabled: true) to use it",
        )


STOP_WORD: Final = "yes-tmux-stop"


def confirmed(
    args: argparse.Namespace, io: Io, what: str, *, verb: str = "stop", word: str = STOP_WORD
) -> bool:
    """One rule for every stop (and every other act that cannot be undone, with its own word):
    the word ``yes-tmux-stop``, or a y/N answered on a terminal (``--confirm`` alone); any other
    word, or no answer, is a preview (the caller exits 2)."""
    if args.confirm == word:
        return True
    if args.confirm is True and io.err.isatty() and sys.stdin.isatty():
        io.err.write(f"{verb} {what}? [y/N] ")
        io.err.flush()
        return sys.stdin.readline().strip().lower() in ("y", "yes")
    return False


def stop_target(args: argparse.Namespace) -> str:
    """The KEY or job ID a ``stop`` names. ``stop --confirm KEY`` reads as ``stop KEY --confirm``:
    argparse hands the word to ``--confirm``, and a key is never the confirming word."""
    if args.key is None and isinstance(args.confirm, str) and args.confirm != STOP_WORD:
        args.key, args.confirm = args.confirm, True
    if args.key is None:
        raise ContractError("KEY|ID", "missing", "name the agent's entry key (worker-...) or the job id")
    key: str = args.key
    return key
