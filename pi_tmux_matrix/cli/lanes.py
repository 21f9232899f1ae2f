"""``pi-matrix lanes``: the lanes (git worktrees under ``.worktrees/``) of a repository, which
agent uses each, and ``prune``: the worktrees no live agent uses removed, their branches with
them when merged (docs/decisions.md#a-lane-is-removed-only-when-merged-and-on-your-word).

Nothing is removed without the word (``--confirm yes-prune``, or y/N on a terminal): alone it is
a preview (exit 2). A lane a live agent runs in, or with uncommitted work, is never removed; an
unmerged branch is kept (``git branch -d``), so no commit is lost.
"""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING, Final

from .. import procs
from ..dispatch.lanes import LaneState, lane_states, remove_lane
from ..errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE, PiMatrixError
from ..safetext import printable
from .base import add_verb, confirmed, store_of
from .dispatch import dump_json

if TYPE_CHECKING:
    from ..matrix.model import Entry
    from .base import Io, Verbs

__all__ = ["PRUNE_WORD", "register"]

PRUNE_WORD: Final = "yes-prune"


def register(sub: Verbs, epilog: str) -> None:
    """Add ``lanes``."""
    lanes = add_verb(
        sub,
        "lanes",
        epilog,
        usage=f"pi-matrix lanes [prune [--abandoned] [--confirm {PRUNE_WORD}]] [--path DIR] [--json]",
    )
    lanes.add_argument(
        "action", nargs="?", choices=["prune"], help="remove idle lanes (a preview without the word)"
    )
    lanes.add_argument("--path", metavar="DIR", help="a folder of the repository (default: here)")
    lanes.add_argument(
        "--abandoned",
        action="store_true",
        help="prune: also unmerged idle lanes (their worktree only: the branch and its commits stay)",
    )
    lanes.add_argument(
        "--confirm", nargs="?", const=True, metavar="WORD", help=f"prune: {PRUNE_WORD} to really remove"
    )
    lanes.add_argument("--json", action="store_true")
    lanes.set_defaults(handler=cmd_lanes)


def _users(args: argparse.Namespace) -> dict[str, list[str]]:
    """The live agents by the folder they run in (their lane's worktree, or their cwd)."""
    users: dict[str, list[str]] = {}
    for entry in store_of(args).list().entries:
        if not (procs.is_alive(entry.process) or procs.is_alive(entry.child_process)):
            continue
        for folder in {_folder(entry)} - {None}:
            assert folder is not None
            users.setdefault(folder, []).append(entry.key)
    return users


def _folder(entry: Entry) -> str | None:
    where = entry.identity.worktree or entry.identity.cwd
    return os.path.realpath(where) if where else None


def _using(state: LaneState, users: dict[str, list[str]]) -> list[str]:
    root = os.path.realpath(state.lane.worktree)
    inside = [keys for folder, keys in users.items() if folder == root or folder.startswith(root + os.sep)]
    return sorted(key for keys in inside for key in keys)


def _state_word(state: LaneState, using: list[str]) -> str:
    if using:
        return "in use"
    if state.missing:
        return "missing"
    if state.dirty:
        return "dirty"
    return "merged" if state.merged else "idle"


def _prunable(word: str, abandoned: bool) -> bool:
    return word in ("merged", "missing") or (abandoned and word == "idle")


def cmd_lanes(args: argparse.Namespace, io: Io) -> int:
    """``pi-matrix lanes [prune …]``."""
    states = lane_states(args.path or os.getcwd())
    users = _users(args)
    rows = []
    for state in states:
        using = _using(state, users)
        word = _state_word(state, using)
        rows.append((state, word, using))
    if args.action != "prune":
        if args.json:
            dump_json(io, [_json(s, w, u) for s, w, u in rows])
        elif not rows:
            io.out.write("no lanes (a lane is made by fire --lane NAME, in <repo>/.worktrees/NAME)\n")
        for state, word, using in [] if args.json else rows:
            lane = state.lane
            who = f" by {', '.join(using)}" if using else ""
            branch = lane.branch or "(detached)"
            io.out.write(f"{lane.name}  {word}{who}  {branch}  {printable(lane.worktree)}\n")
        return EXIT_OK
    chosen = [(s, w) for s, w, _u in rows if _prunable(w, args.abandoned)]
    kept = [(s, w) for s, w, _u in rows if not _prunable(w, args.abandoned)]
    if not chosen:
        why = f" ({len(kept)} lane(s) kept: in use, dirty or unmerged)" if kept else ""
        io.out.write(f"nothing to prune{why}\n")
        return EXIT_OK
    if not confirmed(args, io, f"{len(chosen)} lane(s)", verb="prune", word=PRUNE_WORD):
        for state, word in chosen:
            io.out.write(f"would prune {state.lane.name} ({word}): {_plan(state)}\n")
        for state, word in kept:
            io.out.write(f"would keep {state.lane.name} ({word})\n")
        io.out.write(f"preview only: run again with --confirm {PRUNE_WORD} to remove them\n")
        return EXIT_USAGE
    failed = 0
    for state, _word in chosen:
        try:
            io.out.write(f"pruned {state.lane.name}: {remove_lane(state)}\n")
        except PiMatrixError as exc:
            failed += 1
            io.err.write(f"pi-matrix: error: {exc}\n")
    return EXIT_FAILED if failed else EXIT_OK


def _plan(state: LaneState) -> str:
    if state.merged:
        return f"remove its worktree and its merged branch {state.lane.branch}"
    return f"remove its worktree; keep branch {state.lane.branch or '(detached)'} (not merged)"


def _json(state: LaneState, word: str, using: list[str]) -> dict[str, object]:
    lane = state.lane
    return {
        "name": lane.name,
        "branch": lane.branch,
        "worktree": lane.worktree,
        "repo": lane.repo,
        "state": word,
        "merged": state.merged,
        "dirty": state.dirty,
        "missing": state.missing,
        "usedBy": using,
    }
