"""One renderer for every human table (``ls``, ``tree``, ``jobs``, ``top``): rich, fitted to a width.

On a terminal a table fits the terminal: entry keys first shrink to their shortest common unique
prefix and an ellipsis (as git abbreviates hashes), then free text is cut with an ellipsis, then
the least needed columns are dropped. Never on a pipe: piped output keeps every key whole, so it
can be pasted and parsed. Colour only on a terminal, and never with ``NO_COLOR`` (rich honours
it). Ages have one format everywhere: :func:`pi_tmux_matrix.cli.base.age`.
"""

from __future__ import annotations

import itertools
import os
import shutil
from collections.abc import Sequence
from typing import IO, TYPE_CHECKING, Final

import attrs

from ..matrix.strays import shown_status
from ..safetext import printable

if TYPE_CHECKING:
    from rich.console import Console
    from rich.text import Text

    from ..matrix.model import Entry
    from .base import Io

__all__ = [
    "ELLIPSIS",
    "STATUS_STYLES",
    "Column",
    "Layout",
    "Row",
    "console_for",
    "fit",
    "lines",
    "print_table",
    "shorten",
    "status_cell",
    "status_style",
    "table_width",
    "tree_indent",
    "unique_prefix_length",
]

ELLIPSIS: Final = "…"
GAP: Final = 2
# Keys keep at least this many characters of their session id when shortened (git keeps 7 of a
# hash): short enough for 80 columns, long enough that a new entry rarely lengthens every key.
MIN_ID_CHARS: Final = 8

STATUS_STYLES: Final[dict[str, str]] = {
    "running": "green",
    "launching": "cyan",
    "adopted": "cyan",
    "winding_down": "yellow",
    "resumable": "yellow",
    "terminal": "magenta",
    "closed": "dim",
    "gone": "red",
}


def status_cell(entry: Entry, host_alive: bool, *, reason: bool = True) -> tuple[str, str]:
    """The status cell of ``ls``, ``tree`` and ``top`` alike: its words
    (:func:`~..matrix.strays.shown_status`) and their style."""
    text = shown_status(entry, host_alive, reason=reason)
    return text, status_style(entry.status.value, text)


def task_cell(entry: Entry) -> str:
    """What the agent was asked, as the views show it: the first line of its task summary, else
    its task ref (the goal, the same on every row of a team), else ``-``."""
    summary = entry.task_summary or (entry.resumable.task_summary if entry.resumable else "")
    first = summary.strip().split("\n", 1)[0].strip()
    return first or entry.task_ref or "-"


def status_style(status: str, text: str) -> str:
    """The style of a status cell showing ``text`` for a record in ``status``."""
    return STATUS_STYLES["gone" if text.startswith("gone") else status]


@attrs.frozen
class Column:
    """A column: ``priority`` orders what a narrow terminal drops (100 is never dropped);
    ``shrink`` is the narrowest free text may be cut to; ``key`` marks the entry-key column."""

    name: str
    priority: int = 50
    shrink: int | None = None
    key: bool = False
    right: bool = False
    # Cut to ``shrink`` (without one: dropped) before any key is shortened: an agent's name (the
    # key says who it is), its spend (``jobs`` and ``show`` have it whole).
    cut_first: bool = False


@attrs.frozen
class Row:
    """Cells in column order, a style per cell ('' for none), and a tree ``indent`` shown before
    the first cell (``├─ ``), counted in its width. ``style`` applies to the whole line."""

    cells: tuple[str, ...]
    styles: tuple[str, ...] = ()
    indent: str = ""
    style: str = ""
    label: bool = False  # a heading such as "(no master)": its first cell is no key


def tree_indent(last: bool) -> str:
    """The branch drawn before a child row: ``└─`` for the last child, ``├─`` before it."""
    return "└─ " if last else "├─ "


@attrs.frozen
class Layout:
    """Each column's width (None: dropped) and the key prefix length (None: keys whole)."""

    widths: tuple[int | None, ...]
    abbrev: int | None = None

    def total(self) -> int:
        shown = [w for w in self.widths if w is not None]
        return sum(shown) + GAP * max(0, len(shown) - 1)


def unique_prefix_length(keys: Sequence[str], minimum: int = 0) -> int:
    """The shortest length at which each key's prefix names that key alone among ``keys`` (all
    keys one length, as ``git log --abbrev`` does), at least ``minimum``."""
    ordered = sorted(set(keys))
    length = minimum
    for left, right in itertools.pairwise(ordered):
        pairs = zip(left, right, strict=False)
        same = next((i for i, (a, b) in enumerate(pairs) if a != b), min(len(left), len(right)))
        length = max(length, same + 1)
    return length


def _key_minimum(keys: Sequence[str]) -> int:
    role = max((key.index("-") + 1 for key in keys if "-" in key), default=0)
    return role + MIN_ID_CHARS


def shorten(key: str, abbrev: int | None) -> str:
    """``key`` cut to ``abbrev`` characters and an ellipsis, or whole when it is no longer."""
    if abbrev is None or len(key) <= abbrev:
        return key
    return key[:abbrev] + ELLIPSIS


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(0, width - 1)] + ELLIPSIS


def fit(
    columns: Sequence[Column],
    rows: Sequence[Row],
    width: int | None,
    *,
    keys: Sequence[str] = (),
    floor: Layout | None = None,
) -> Layout:
    """The widths that fit ``width`` (None: natural widths, nothing cut). ``keys`` are every key
    the prefixes must tell apart (default: the key column's cells); ``floor`` is the last layout
    at this width, so columns never narrow between two redraws while they still fit."""
    natural = []
    for i, column in enumerate(columns):
        cells = [len(r.indent if i == 0 else "") + len(r.cells[i]) for r in rows]
        natural.append(max([len(column.name), *cells]))
    if width is None:
        return Layout(tuple(natural))
    widths: list[int | None] = list(natural)
    abbrev: int | None = None
    if floor is not None and len(floor.widths) == len(widths):
        pairs = zip(widths, floor.widths, strict=True)
        widths = [w if f is None or w is None else max(w, f) for w, f in pairs]
        abbrev = floor.abbrev

    def total() -> int:
        return Layout(tuple(widths)).total()

    for i, column in enumerate(columns):
        least, current = column.shrink, widths[i]
        if not column.cut_first or current is None or total() <= width:
            continue
        # Cut to its least, or (a figure: nothing to cut) dropped, before any key is shortened.
        widths[i] = max(least, current - (total() - width)) if least is not None else None
    key_col = next((i for i, c in enumerate(columns) if c.key), None)
    if key_col is not None and (total() > width or abbrev is not None):
        pool = list(keys) or [r.cells[key_col] for r in rows if not r.label]
        abbrev = max(unique_prefix_length(pool, _key_minimum(pool)), abbrev or 0)
        shortened = [
            len(r.indent if key_col == 0 else "") + len(shorten(r.cells[key_col], abbrev))
            for r in rows
            if not r.label
        ]
        needed = max([len(columns[key_col].name), *shortened])
        kept = floor.widths[key_col] if floor is not None and floor.abbrev is not None else None
        widths[key_col] = max(needed, kept or 0)
    by_priority = sorted(range(len(columns)), key=lambda i: columns[i].priority)
    for i in by_priority:  # the least needed column first: cut its text, else drop it whole
        if total() <= width:
            break
        least, current = columns[i].shrink, widths[i]
        if least is not None and current is not None and current > least:
            widths[i] = max(least, current - (total() - width))
        if total() > width and columns[i].priority < 100:
            widths[i] = None
    for i in reversed(by_priority):  # and give what a dropped column freed back to cut text
        current = widths[i]
        if columns[i].shrink is not None and current is not None and current < natural[i] and total() < width:
            widths[i] = min(natural[i], current + width - total())
    if total() > width:  # one column left and still too wide: cut it, with an ellipsis
        widths[0] = max(1, (widths[0] or 0) - (total() - width))
    return Layout(tuple(widths), abbrev)


def lines(
    columns: Sequence[Column], rows: Sequence[Row], layout: Layout, header_style: str = "bold"
) -> list[Text]:
    """The header and each row as styled text, every line at most ``layout.total()`` wide."""
    from rich.text import Text  # rich only for a verb that prints a table: ~50 ms to import

    header = Row(tuple(c.name for c in columns), style=header_style)
    out = []
    for row in (header, *rows):
        line = Text(style=row.style)
        first = True
        for i, column in enumerate(columns):
            width = layout.widths[i]
            if width is None:
                continue
            if not first:
                line.append(" " * GAP)
            first = False
            text = printable(row.cells[i])
            if column.key and row is not header and not row.label:
                text = shorten(text, layout.abbrev)
            if i == 0 and row.indent:  # the tree's branches, dim, counted in the width
                text = _cut(row.indent + text, width)
                indent = min(len(row.indent), len(text))
                line.append(text[:indent], style="dim")
                text = text[indent:]
                width -= indent
            else:
                text = _cut(text, width)
            padded = text.rjust(width) if column.right else text.ljust(width)
            style = row.styles[i] if i < len(row.styles) else ""
            line.append(padded, style=style or None)
        line.rstrip()
        out.append(line)
    return out


def table_width(io: Io) -> int | None:
    """The width a table fits: the one injected (tests), the terminal's, or None on a pipe."""
    if io.width is not None:
        return io.width
    isatty = getattr(io.out, "isatty", None)
    if callable(isatty) and isatty():
        return shutil.get_terminal_size((80, 24)).columns
    return None


def console_for(stream: IO[str], width: int | None = None) -> Console:
    """The one rich console a human listing prints through: colour only on a terminal (rich
    checks ``isatty``), none with ``NO_COLOR``, no markup or highlighting of worker text."""
    from rich.console import Console

    return Console(
        file=stream,
        width=width or 10_000,
        no_color=bool(os.environ.get("NO_COLOR")) or None,
        highlight=False,
        markup=False,
        emoji=False,
        soft_wrap=True,
    )


def print_table(io: Io, columns: Sequence[Column], rows: Sequence[Row], *, keys: Sequence[str] = ()) -> None:
    """Fit, render and print a table to ``io.out``."""
    width = table_width(io)
    layout = fit(columns, rows, width, keys=keys)
    console = console_for(io.out, width)
    for line in lines(columns, rows, layout):
        console.print(line, crop=False, overflow="ignore")
