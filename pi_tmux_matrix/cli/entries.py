"""``ls``, ``show`` and ``repair``: reading the matrix and repairing it explicitly.

This module is what ``pi-matrix ls`` imports to build its parser; the work is in
:mod:`.listing`, loaded only when there is something to read, so a listing of an empty state dir
(the first thing a new user types) starts like a small tool.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from ..errors import EXIT_OK
from .base import add_verb

if TYPE_CHECKING:
    from .base import Io, Verbs

__all__ = ["register"]


def register(sub: Verbs, epilog: str) -> None:
    """Add the entry verbs to the top-level subparsers."""
    ls = add_verb(sub, "ls", epilog)
    shape = ls.add_mutually_exclusive_group()  # one output shape: both is a usage error (exit 2)
    shape.add_argument(
        "--json", action="store_true", help="print a JSON array of the stored entries plus 'alive'"
    )
    shape.add_argument("--ndjson", action="store_true", help="one JSON object per line (for streaming tools)")
    ls.set_defaults(handler=cmd_ls)

    show = add_verb(sub, "show", epilog)
    show.add_argument("key", metavar="KEY", help="the entry key, <role>-<sessionId>")
    show.add_argument(
        "--json", action="store_true", help="print the stored entry plus 'alive' and 'toolBlocks' as JSON"
    )
    show.set_defaults(handler=cmd_show)

    repair = add_verb(
        sub,
        "repair",
        epilog,
    )
    repair.add_argument("--dry-run", action="store_true", help="report what would be done; change nothing")
    repair.add_argument("--json", action="store_true", help="print the actions as JSON")
    repair.set_defaults(handler=cmd_repair)


def cmd_ls(args: argparse.Namespace, io: Io) -> int:
    """``pi-matrix ls [--json | --ndjson]``."""
    from ..matrix.layout import lists_nothing
    from ..paths import resolve_state_dir

    root = resolve_state_dir(args.state_dir)
    if lists_nothing(root):
        # What the full listing prints for no entries and no problems, without loading it.
        io.out.write("[]\n" if args.json else "" if args.ndjson else f"no entries in {root}\n")
        return EXIT_OK
    from .listing import cmd_ls as listing

    return listing(args, io)


def cmd_show(args: argparse.Namespace, io: Io) -> int:
    """``pi-matrix show KEY [--json]``."""
    from .listing import cmd_show as show

    return show(args, io)


def cmd_repair(args: argparse.Namespace, io: Io) -> int:
    """``pi-matrix repair [--dry-run] [--json]``."""
    from .listing import cmd_repair as repair

    return repair(args, io)
