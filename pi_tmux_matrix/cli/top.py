"""``pi-matrix top``: the live view of the matrix (masters → workers), with owner keys.

On a terminal it is a full-screen view redrawn as the state dir changes; not on a terminal (or
with ``--once``) it prints one snapshot through the table renderer, keys whole on a pipe (both in
``top_screen``, which holds the verb). This module reads the matrix into that snapshot: the
rows, the counts in the header, each agent's CPU and memory, and the detail of one entry.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from typing import TYPE_CHECKING

import attrs

from .. import procs
from ..dispatch.usage import UsageTotal
from ..errors import PiMatrixError
from ..identity import ProcessIdentity, Role
from ..matrix.model import Entry, Status
from ..matrix.store import MatrixStore, Problem, now_ms
from ..safetext import printable
from ..supervise.claim import unsupervised
from .base import age
from .render import STATUS_STYLES, Column, Row, status_cell, task_cell, tree_indent
from .usage import claimed_by_key, spend_cell

if TYPE_CHECKING:
    from rich.text import Text


__all__ = ["COLUMNS", "Item", "Snapshot", "Usage", "collect", "detail_lines", "pack"]

COLUMNS = (
    Column("KEY", 100, key=True),
    Column("NAME", 52, shrink=12, cut_first=True),
    Column("STATUS", 90, shrink=9),
    Column("ALIVE", 80, shrink=5),
    Column("CPU%", 75, right=True),
    Column("RSS", 70, right=True),
    Column("AGE", 60, right=True),
    Column("LANE", 55, shrink=8),
    Column("TASK", 50, shrink=10),
    Column("BEAT", 40, right=True),
    Column("HANDOFFS", 35, right=True),
    Column("SPEND", 33, right=True, cut_first=True),
    Column("TMUX", 30, shrink=10),
    Column("REASON", 20, shrink=8),
)


def _bytes(size: int) -> str:
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if size >= scale:
            value = size / scale
            return f"{value:.1f}{unit}" if value < 10 else f"{value:.0f}{unit}"
    return f"{size}B"


class Usage:
    """CPU % and resident memory of each entry's processes (its host and its agent), sampled
    without a pause: each sample is an instant read of CPU time, and the % is the CPU time used
    since the previous sample over the time between them (the first one: since the process
    started, as ``ps`` counts). Samples at most once per ``every`` seconds; reuses the last
    figures in between, so redraws on every keypress cost nothing."""

    def __init__(self, every: float = 1.0) -> None:
        self.every = every
        self._cpu: dict[ProcessIdentity, tuple[float, float]] = {}
        self._shown: dict[str, tuple[float, int]] = {}
        self._at = -float("inf")
        self._keys: set[str] = set()

    def sample(self, entries: list[Entry]) -> dict[str, tuple[float, int]]:
        now = time.monotonic()
        keys = {e.key for e in entries}
        if now - self._at < self.every and keys <= self._keys:  # a new entry is sampled at once
            return self._shown
        self._at, self._keys = now, keys
        cpu: dict[ProcessIdentity, tuple[float, float]] = {}
        shown: dict[str, tuple[float, int]] = {}
        for entry in entries:
            percent, rss, found = 0.0, 0, False
            for ident in {entry.process, entry.child_process} - {None}:
                assert ident is not None
                got = procs.usage(ident)
                if got is None:
                    continue
                seconds, resident, lived = got
                last = self._cpu.get(ident)
                if last is not None and now > last[1]:
                    percent += max(0.0, seconds - last[0]) / (now - last[1]) * 100
                elif lived > 0:
                    percent += seconds / lived * 100
                cpu[ident] = (seconds, now)
                rss += resident
                found = True
            if found:
                shown[entry.key] = (percent, rss)
        self._cpu, self._shown = cpu, shown
        return shown


@attrs.frozen
class Item:
    """One row of the view: an entry (None for a heading) and its cells."""

    entry: Entry | None
    row: Row


@attrs.frozen
class Snapshot:
    items: tuple[Item, ...]
    keys: tuple[str, ...]  # every key in the matrix: what a shortened key must tell apart
    summary: tuple[Text, ...]
    targets: dict[str, str]
    problems: tuple[Problem, ...] = ()


def _of_jobs(store: MatrixStore) -> tuple[dict[str, str], dict[str, UsageTotal]]:
    """From the job records, read once: each agent's tmux place, and what it claimed it spent."""
    targets: dict[str, str] = {}
    spent: dict[str, UsageTotal] = {}
    with contextlib.suppress(PiMatrixError, OSError):
        from ..dispatch.jobs import JobStore

        jobs = JobStore(store)
        listed = jobs.list_jobs()[0]
        for job in listed:
            for agent in job.agents:
                if agent.target and agent.pane_id:
                    targets[agent.key] = f"{agent.socket}:{agent.pane_id}"
        spent = claimed_by_key(jobs, listed)
    return targets, spent


def _summary(
    entries: list[Entry], alive: dict[str, bool], usage: dict[str, tuple[float, int]]
) -> tuple[Text, ...]:
    """The header's counts, as parts a narrow screen wraps between (never inside one)."""
    from rich.text import Text

    roles = Counter(e.role for e in entries)
    total = Text(f"{len(entries)} agent{'s' * (len(entries) != 1)}: ")
    total.append(f"{roles[Role.MASTER]} master{'s' * (roles[Role.MASTER] != 1)}", "bold")
    total.append(", ")
    total.append(f"{roles[Role.WORKER]} worker{'s' * (roles[Role.WORKER] != 1)}", "bold")
    statuses = Counter(e.status for e in entries)
    parts = [total]
    parts += [Text(f"{s.value} {statuses[s]}", STATUS_STYLES.get(s.value, "")) for s in Status if statuses[s]]
    cpu = sum(p for p, _ in usage.values())
    rss = sum(r for _, r in usage.values())
    parts += [Text(f"alive {sum(alive.values())}"), Text(f"CPU {cpu:.0f}%"), Text(f"RSS {_bytes(rss)}")]
    return tuple(parts)


def pack(parts: tuple[Text, ...], width: int | None) -> list[Text]:
    """``parts`` joined by two spaces, on as few lines of ``width`` as they fit."""
    from rich.text import Text

    lines = [Text()]
    for part in parts:
        line = lines[-1]
        if line.cell_len and width is not None and line.cell_len + 2 + part.cell_len > width:
            lines.append(Text())
            line = lines[-1]
        if line.cell_len:
            line.append("  ")
        line.append_text(part)
    return lines


def collect(store: MatrixStore, usage: Usage) -> Snapshot:
    """The matrix as the view shows it: each master then its workers, then workers with no
    registered master under a heading."""
    listing = store.list()
    entries = list(listing.entries)
    now = now_ms()
    targets, spent = _of_jobs(store)
    # A master's spend: what its workers claimed (advisory), shown on its own row.
    for master in (e for e in entries if e.role is Role.MASTER):
        session = master.identity.session_id
        mine = [spent[w.key] for w in entries if w.parent_session_id == session and w.key in spent]
        spent[master.key] = sum(mine, UsageTotal())
    alive = {e.key: procs.is_alive(e.process) for e in entries}
    used = usage.sample(entries)

    def item(entry: Entry, indent: str) -> Item:
        live = alive[entry.key]
        cpu, rss = used.get(entry.key, (None, None))
        shown, style = status_cell(entry, live, reason=False)  # the REASON column has it
        cells = (
            entry.key,
            entry.identity.agent_id,
            shown,
            "yes" if live else (unsupervised(entry) or "no"),
            "-" if cpu is None else f"{cpu:.1f}",
            "-" if rss is None else _bytes(rss),
            age(entry.created_at, now),
            entry.identity.lane or "-",
            task_cell(entry),
            age(entry.heartbeat_at, now),
            str(len(entry.undelivered)),
            spend_cell(spent.get(entry.key)),
            targets.get(entry.key, "-"),
            entry.reason or "-",
        )
        styles = (
            "bold" if entry.role is Role.MASTER else "",
            "",
            style,
            "green" if live else "red",
        )
        return Item(entry, Row(cells, styles, indent))

    masters = [e for e in entries if e.role is Role.MASTER]
    sessions = {m.identity.session_id for m in masters}
    items: list[Item] = []
    for master in masters:
        items.append(item(master, ""))
        workers = [
            e for e in entries if e.role is Role.WORKER and e.parent_session_id == master.identity.session_id
        ]
        items.extend(item(w, tree_indent(i == len(workers) - 1)) for i, w in enumerate(workers))
    orphans = [e for e in entries if e.role is Role.WORKER and e.parent_session_id not in sessions]
    if orphans:
        heading = Row(("(no master)", *[""] * (len(COLUMNS) - 1)), ("dim",), label=True)
        items.append(Item(None, heading))
        items.extend(item(w, tree_indent(i == len(orphans) - 1)) for i, w in enumerate(orphans))
    summary = _summary(entries, alive, used)
    return Snapshot(tuple(items), tuple(e.key for e in entries), summary, targets, listing.problems)


EVENTS_SHOWN = 12


def detail_lines(store: MatrixStore, entry: Entry, target: str | None) -> list[str]:
    """The detail pane: ``show``'s view of the entry, its session file and tmux target, and its
    last events (each line safe for a terminal)."""
    from ..matrix.mailbox import EventLog
    from .listing import describe, tool_blocks

    blocked, start_failure = tool_blocks(store, entry.key)
    lines = describe(entry, procs.is_alive(entry.process), blocked, start_failure)
    lines.insert(1, f"  session file {entry.identity.session_file or '-'}")
    lines.insert(2, f"  tmux target  {target or '-'}")
    if not blocked:
        lines.append("  blocked      none (the envelope blocked no tool call)")
    lines.append(f"  last events  (events/{entry.key}.jsonl)")
    now = now_ms()
    events = EventLog(store, entry.key).tail(EVENTS_SHOWN)
    for event in events:
        at = event.get("at")
        when = age(at, now) if isinstance(at, int) else "-"
        rest = " ".join(f"{k}={v}" for k, v in event.items() if k not in ("at", "event"))
        lines.append(printable(f"    {when:>4} ago  {event.get('event', '?')}  {rest}"))
    if not events:
        lines.append("    none yet")
    return lines
