"""The ``gc`` verb: what the state dir's sweep would remove, and, with the word, removing it.

Without ``--confirm yes-gc`` (or ``--confirm`` alone answered y on a terminal) it is a preview,
exit 2 when there is something to remove, as every act that cannot be undone is previewed
(``stop``, ``lanes prune``); nothing is created, locked or removed. What goes and what stays is
``pi_tmux_matrix.retention``'s (docs/on-disk-format.md, "What is kept, and how long").
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from ..errors import EXIT_OK, EXIT_USAGE
from ..safetext import printable
from .base import add_verb, confirmed, require_matrix, store_of
from .verbs import GC_WORD

if TYPE_CHECKING:
    from ..matrix.retention import Found, Plan
    from .base import Io, Verbs

__all__ = ["GC_WORD", "cmd_gc", "register"]


def register(sub: Verbs, epilog: str) -> None:
    gc = add_verb(
        sub,
        "gc",
        epilog,
    )
    gc.add_argument(
        "--older-than",
        type=float,
        metavar="DAYS",
        help="the window in days, for this run (default: processMatrix.historyRetentionDays, 30)",
    )
    gc.add_argument(
        "--confirm",
        nargs="?",
        const=True,
        metavar="WORD",
        help=f"really remove, with the word {GC_WORD} (alone: asks y/N on a terminal); else a preview",
    )
    gc.add_argument("--verbose", "-v", action="store_true", help="name every path, with the reason")
    gc.add_argument("--json", action="store_true")
    gc.set_defaults(handler=cmd_gc)


def size(count: float) -> str:
    """Bytes as a person reads them: ``812 B``, ``12.3 KiB``, ``4.1 MiB``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} GiB"  # pragma: no cover


def totals(items: Iterable[Found]) -> dict[str, dict[str, int]]:
    """Files and bytes per folder of the state dir."""
    found: dict[str, dict[str, int]] = {}
    for item in items:
        row = found.setdefault(item.folder, {"files": 0, "bytes": 0})
        row["files"] += item.files
        row["bytes"] += item.size
    return dict(sorted(found.items()))


def _json(item: Found) -> dict[str, object]:
    return {
        "path": item.path,
        "folder": item.folder,
        "files": item.files,
        "bytes": item.size,
        "reason": item.reason,
    }


def _table(io: Io, title: str, items: tuple[Found, ...], *, verbose: bool) -> None:
    rows = totals(items)
    files = sum(r["files"] for r in rows.values())
    io.out.write(f"{title} {files} file(s), {size(sum(r['bytes'] for r in rows.values()))}:\n")
    for folder, row in rows.items():
        io.out.write(f"  {folder + '/':<18} {row['files']:>6} file(s) {size(row['bytes']):>11}\n")
        for item in sorted(items, key=lambda f: f.path) if verbose else ():
            if item.folder == folder:
                io.out.write(f"      {printable(item.path)}  {size(item.size)}  {printable(item.reason)}\n")


def _kept(io: Io, kept: tuple[Found, ...]) -> None:
    if kept:
        io.out.write(f"kept ({len(kept)}), each with the reason:\n")
    for item in kept:
        io.out.write(f"  {printable(item.path)}: {printable(item.reason)}\n")


def _header(io: Io, plan: Plan, root: object) -> None:
    before = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(plan.cutoff_ms / 1000))
    io.out.write(
        f"gc {printable(str(root))}: history past {plan.days:g} day(s) (last touched before {before}), "
        "and what removed entries left\n"
    )


def cmd_gc(args: argparse.Namespace, io: Io) -> int:
    """``pi-matrix gc [--older-than DAYS] [--confirm yes-gc] [--verbose] [--json]``."""
    from ..retention import plan as survey
    from ..retention import sweep

    store = store_of(args)
    plan = survey(store, days=args.older_than)
    items = plan.items
    days = int(plan.days) if plan.days.is_integer() else plan.days
    body: dict[str, object] = {
        "stateDir": str(store.root),
        "olderThanDays": days,
        "cutoff": plan.cutoff_ms,
        "remove": [_json(i) for i in items],
        "totals": totals(items),
        "kept": [_json(i) for i in plan.kept],
    }
    what = f"{sum(i.files for i in items)} file(s), {size(sum(i.size for i in items))}"
    if items and not confirmed(args, io, what, verb="gc: remove", word=GC_WORD):
        if args.json:
            io.out.write(_dumps({**body, "removed": None}))
        else:
            _header(io, plan, store.root)
            _table(io, "would remove", items, verbose=args.verbose)
            _kept(io, plan.kept)
            io.out.write(f"preview only: run again with --confirm {GC_WORD} to remove them\n")
        return EXIT_USAGE
    if items:
        require_matrix("gc")
        report = sweep(store, plan)
        removed, kept = report.removed, report.kept
    else:
        removed, kept = (), plan.kept
    if args.json:
        io.out.write(
            _dumps({**body, "removed": [_json(i) for i in removed], "kept": [_json(i) for i in kept]})
        )
        return EXIT_OK
    _header(io, plan, store.root)
    if removed:
        _table(io, "removed", removed, verbose=args.verbose)
    else:
        io.out.write("nothing to remove\n")
    _kept(io, kept)
    return EXIT_OK


def _dumps(value: object) -> str:
    return json.dumps(value, indent=2) + "\n"
