"""``top`` on a terminal: a full-screen view on the alternate screen, like htop or k9s.

The screen redraws from the last snapshot on every key, and reads the matrix again when the state
dir changes (inotify) or once a second (CPU figures). Every byte the terminal sends is read and
split into keys, so ``kkk`` moves three rows and a held key repeats. A question (adopt, clean up,
resume, stop) is the bottom line and takes one key, y or anything else: the view keeps redrawing
while it waits. ``Enter`` opens the detail of the selected entry; ``/`` filters the rows.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import shutil
import signal
import sys
import termios
import textwrap
import tty
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Final

import attrs
from rich.text import Text

from .. import procs
from ..errors import EXIT_OK, PiMatrixError
from ..identity import ProcessIdentity, Role
from ..inotify import Watches
from ..matrix.model import Entry
from ..matrix.store import MatrixStore
from ..settings import resolve_state_dir
from .base import add_verb
from .render import Layout, console_for, fit, lines, print_table, shorten, table_width
from .top import COLUMNS, Item, Snapshot, Usage, collect, detail_lines, pack
from .top_acts import Acts

if TYPE_CHECKING:
    from ..dispatch.tmux import TmuxServer
    from .base import Io, Verbs

__all__ = ["run_screen", "split_keys"]

_NAMED: Final = {
    "\x1b[A": "up",
    "\x1b[B": "down",
    "\x1bOA": "up",
    "\x1bOB": "down",
    "\x1b[5~": "pgup",
    "\x1b[6~": "pgdn",
    "\x1b[H": "home",
    "\x1b[F": "end",
    "\x1bOH": "home",
    "\x1bOF": "end",
    "\x1b[1~": "home",
    "\x1b[4~": "end",
    "\r": "enter",
    "\n": "enter",
    "\x7f": "backspace",
    "\x08": "backspace",
    "\x1b": "esc",
    "\x03": "ctrl-c",
}
HELP: Final = "j/k move  Enter detail  / filter  t attach  a adopt  c clean up  r resume  s stop  q quit"
REFRESH_S: Final = 1.0
ESC_WAIT_S: Final = 0.05


def split_keys(data: str) -> tuple[list[str], str]:
    """Every key in ``data`` (a named one for an escape sequence), and what may be the start of
    a sequence still arriving. A burst such as ``kkk`` is three keys, never one unknown."""
    keys: list[str] = []
    i = 0
    while i < len(data):
        char = data[i]
        if char != "\x1b":
            keys.append(_NAMED.get(char, char))
            i += 1
            continue
        if i + 1 == len(data):
            return keys, data[i:]  # a lone ESC, or the first byte of an arrow: wait a moment
        if data[i + 1] not in "[O":
            keys.append("esc")
            i += 1
            continue
        end = i + 2
        if data[i + 1] == "[":  # CSI: parameters and intermediates, then a final byte @..~
            while end < len(data) and not "@" <= data[end] <= "~":
                end += 1
        if end >= len(data):
            return keys, data[i:]
        sequence = data[i : end + 1]
        keys.append(_NAMED.get(sequence, sequence))
        i = end + 1
    return keys, ""


@attrs.frozen
class Question:
    """An act waiting for its answer: ``answers`` maps a key to what it does; any other key
    cancels."""

    text: str
    answers: dict[str, Callable[[], str]]


class Screen:
    def __init__(self, store: MatrixStore, owner: tuple[ProcessIdentity, str] | None) -> None:
        self.store = store
        self.acts = Acts(store, owner)
        self.usage = Usage(REFRESH_S)
        self.snapshot: Snapshot = collect(store, self.usage)
        self.selected: str | None = None  # the selected entry's key: rows move, the selection stays
        self.last_at = 0
        self.filter = ""
        self.typing_filter = False
        self.detail: list[str] | None = None
        self.scroll = 0
        self.question: Question | None = None
        self.message: tuple[str, str] = ("", "")  # text, style
        self.floor: Layout | None = None
        self.floor_width = 0
        self.quit = False
        self.attach_after: tuple[TmuxServer, str] | None = None  # t outside tmux: after the screen

    # --- the rows ------------------------------------------------------------------------------
    def visible(self) -> list[Item]:
        if not self.filter:
            return list(self.snapshot.items)
        needle = self.filter.lower()
        return [i for i in self.snapshot.items if i.entry and any(needle in c.lower() for c in i.row.cells)]

    def index(self, items: list[Item]) -> int:
        """The selected row: the selected entry's, else (it went away or was filtered out) the
        entry row nearest to where the selection was; -1 with no entry row."""
        keys = [i.entry.key if i.entry is not None else None for i in items]
        if self.selected is not None and self.selected in keys:
            at = keys.index(self.selected)
        else:
            rows = [n for n, key in enumerate(keys) if key is not None]
            if not rows:
                return -1
            at = min(rows, key=lambda n: abs(n - self.last_at))
            self.selected = keys[at]
        self.last_at = at
        return at

    def move(self, step: int) -> None:
        items = self.visible()
        selectable = [n for n, i in enumerate(items) if i.entry is not None]
        if not selectable:
            return
        at = selectable.index(self.index(items))
        target = items[selectable[max(0, min(len(selectable) - 1, at + step))]]
        assert target.entry is not None
        self.selected = target.entry.key

    def current(self) -> Entry | None:
        items = self.visible()
        at = self.index(items)
        return items[at].entry if at >= 0 else None

    def shown_key(self, key: str) -> str:
        """A key as the table shows it, so a question names what the person sees."""
        return shorten(key, self.floor.abbrev if self.floor else None)

    # --- keys ----------------------------------------------------------------------------------
    def key(self, key: str) -> None:
        if self.question is not None:
            self.answer(key)
            return
        if self.typing_filter:
            self.filter_key(key)
            return
        self.message = ("", "")  # any key clears the last message: no stale line stays
        if self.detail is not None:
            self.detail_key(key)
            return
        if key in ("q", "ctrl-c"):
            self.quit = True
        elif key in ("j", "down"):
            self.move(1)
        elif key in ("k", "up"):
            self.move(-1)
        elif key in ("pgdn", "pgup"):
            self.move(10 if key == "pgdn" else -10)
        elif key in ("home", "g"):
            self.move(-(10**6))
        elif key in ("end", "G"):
            self.move(10**6)
        elif key == "/":
            self.typing_filter = True
        elif key == "esc" and self.filter:
            self.filter = ""
        elif key == "enter":
            self.open_detail()
        elif key in ("a", "c", "r", "s"):
            self.ask(key)
        elif key == "t":
            self.attach()

    def attach(self) -> None:
        """Into the selected agent's pane: inside tmux the client goes there and top stays;
        outside, top ends and its terminal becomes the agent's client (``pi-matrix attach``)."""
        from .attach import pane_of, show_inside

        entry = self.current()
        if entry is None:
            self.message = ("select an agent first", "yellow")
            return
        try:
            server, pane_id = pane_of(self.store, entry.key)
            if server.pane(pane_id) is None:
                self.message = (f"{self.shown_key(entry.key)}: its pane {pane_id} is gone", "yellow")
            elif os.environ.get("TMUX"):
                self.message = (show_inside(server, pane_id, self.shown_key(entry.key)), "green")
            else:
                self.attach_after, self.quit = (server, pane_id), True
        except PiMatrixError as exc:
            self.message = (f"error: {exc}", "red")

    def answer(self, key: str) -> None:
        question, self.question = self.question, None
        act = question.answers.get(key.lower()) if question else None
        if act is None:
            self.message = ("cancelled", "dim")
            return
        try:
            self.message = (act(), "green")
        except PiMatrixError as exc:
            self.message = (f"error: {exc}", "red")
        self.refresh()

    def filter_key(self, key: str) -> None:
        if key == "enter":
            self.typing_filter = False
        elif key in ("esc", "ctrl-c"):
            self.typing_filter, self.filter = False, ""
        elif key == "backspace":
            self.filter = self.filter[:-1]
        elif len(key) == 1 and key.isprintable():
            self.filter += key

    def detail_key(self, key: str) -> None:
        if key in ("esc", "q", "enter", "ctrl-c"):
            self.detail = None
        elif key in ("j", "down"):
            self.scroll += 1
        elif key in ("k", "up"):
            self.scroll = max(0, self.scroll - 1)
        elif key in ("pgdn", "pgup"):
            self.scroll = max(0, self.scroll + (10 if key == "pgdn" else -10))

    def open_detail(self) -> None:
        entry = self.current()
        if entry is None:
            self.message = ("select an entry first", "yellow")
            return
        self.scroll = 0
        self.detail = detail_lines(self.store, entry, self.snapshot.targets.get(entry.key))

    def ask(self, verb: str) -> None:
        entry = self.current()
        if entry is None or entry.role is not Role.WORKER:
            self.message = ("select a worker first", "yellow")
            return
        asked = self.acts.question(verb, entry, self.shown_key)
        if isinstance(asked, str):
            self.message = (asked, "yellow")
        else:
            text, answers = asked
            self.question = Question(text, answers)

    # --- drawing -------------------------------------------------------------------------------
    def refresh(self) -> None:
        self.snapshot = collect(self.store, self.usage)
        if self.detail is not None:
            entry = self.store.find(self.selected) if self.selected else None
            if entry is not None:
                self.detail = detail_lines(self.store, entry, self.snapshot.targets.get(entry.key))

    def frame(self, width: int, height: int) -> list[Text]:
        title = Text("pi-matrix top", "bold")
        if self.filter and not self.typing_filter:
            title.append(f"  filter /{self.filter}", "yellow")
        title.append(f"  {self.store.root}", "dim")
        if self.question is not None:
            bottom, style = self.question.text, "bold yellow"
        elif self.typing_filter:
            bottom, style = f"/{self.filter}▏  (Enter keeps it, Esc clears it)", "bold"
        else:
            bottom, style = self.message
        said = [
            Text(line, style or "")
            for line in textwrap.wrap(bottom, max(10, width), break_on_hyphens=False)[:3]
        ] or [Text("")]
        counts = pack(self.snapshot.summary, width)[:2]
        out = [title, *counts]
        body = max(1, height - 2 - len(counts) - len(said))
        if self.detail is not None:
            self.scroll = max(0, min(self.scroll, len(self.detail) - body + 1))
            header = Text(f"detail: {self.selected}", "reverse bold")
            header.pad_right(width - header.cell_len)
            shown = [Text(line) for line in self.detail[self.scroll : self.scroll + body - 1]]
            out += [header, *shown]
            help_line = "j/k scroll  Esc/Enter/q back to the table"
        else:
            out += self.table(width, body)
            help_line = HELP
        out += [Text("")] * (height - 1 - len(said) - len(out))
        return [*out, *said, Text(help_line, "dim")][:height]

    def table(self, width: int, body: int) -> list[Text]:
        items = self.visible()
        if width != self.floor_width:
            self.floor, self.floor_width = None, width  # a new size starts a new layout
        at = self.index(items)
        # The selected row in one highlight: reverse over each cell's colour reads as noise.
        rows = [i.row for i in items]
        if at >= 0:
            rows[at] = attrs.evolve(rows[at], styles=(), style="reverse")
        layout = fit(COLUMNS, rows, width, keys=self.snapshot.keys, floor=self.floor)
        self.floor = layout
        rendered = lines(COLUMNS, rows, layout, header_style="reverse bold")
        header, rendered = rendered[0], rendered[1:]
        header.pad_right(width - header.cell_len)
        if not items:
            empty = "no entries match the filter" if self.filter else "no entries yet"
            return [header, Text(f"  {empty}", "dim")]
        top = max(0, min(at - body + 2, len(items) - body + 1)) if at >= body - 1 else 0
        shown = rendered[top : top + body - 1]
        if 0 <= at - top < len(shown):
            shown[at - top].pad_right(width - shown[at - top].cell_len)
        return [header, *shown]


class _Terminal:
    """cbreak (every key at once, no echo) on the alternate screen, restored however it ends."""

    def __init__(self, fd: int, write: Callable[[str], None]) -> None:
        self.fd = fd
        self.write = write

    @contextlib.contextmanager
    def raw(self) -> Iterator[None]:
        saved = termios.tcgetattr(self.fd)
        tty.setcbreak(self.fd)
        self.write("\x1b[?1049h\x1b[?25l")  # the alternate screen, the cursor hidden
        try:
            yield
        finally:
            self.write("\x1b[?25h\x1b[?1049l")
            termios.tcsetattr(self.fd, termios.TCSADRAIN, saved)

    def read_keys(self, pending: str) -> tuple[list[str], str]:
        data = pending + os.read(self.fd, 4096).decode(errors="replace")
        keys, rest = split_keys(data)
        while rest:  # an ESC alone is the Esc key unless the rest of a sequence follows at once
            ready, _, _ = select.select([self.fd], [], [], ESC_WAIT_S)
            if not ready:
                return [*keys, "esc", *(_NAMED.get(c, c) for c in rest[1:])], ""
            more, rest = split_keys(rest + os.read(self.fd, 4096).decode(errors="replace"))
            keys += more
        return keys, ""


def run_screen(store: MatrixStore, io: Io, owner: tuple[ProcessIdentity, str] | None) -> int:
    screen = Screen(store, owner)
    fd = sys.stdin.fileno()  # a terminal: cmd_top comes here only when stdin and stdout are one

    def write(text: str) -> None:
        io.out.write(text)
        io.out.flush()

    terminal = _Terminal(fd, write)
    # One inotify instance (refused: the once-a-second refresh is all there is).
    watch = Watches()
    if store.exists():
        watch.add(store.root, lambda _names: None)
    try:
        with terminal.raw(), procs.SignalWakeup((signal.SIGWINCH,)) as resized:
            _loop(screen, terminal, watch, resized, write)
    except KeyboardInterrupt:  # Ctrl-C quits like q: the terminal is already restored
        pass
    finally:
        watch.close()
    if screen.attach_after is not None:  # the terminal is restored: it becomes the agent's client
        server, pane_id = screen.attach_after
        server.attach(pane_id)
    return EXIT_OK


def _loop(
    screen: Screen,
    terminal: _Terminal,
    watch: Watches,
    resized: procs.SignalWakeup,
    write: Callable[[str], None],
) -> None:
    import time

    next_refresh = time.monotonic() + REFRESH_S
    while not screen.quit:
        try:  # the terminal's own size: COLUMNS/LINES in the environment go stale on a resize
            size = os.get_terminal_size(terminal.fd)
        except OSError:
            size = shutil.get_terminal_size((80, 24))
        console = console_for(_Capture(), size.columns)  # type: ignore[arg-type]
        with console.capture() as capture:
            for line in screen.frame(size.columns, size.lines):
                console.print(line, crop=True, no_wrap=True, overflow="crop")
        painted = capture.get().rstrip("\n").split("\n")
        write("\x1b[H" + "\x1b[K\r\n".join(painted) + "\x1b[K\x1b[J")
        fds = [terminal.fd, resized.read_fd] + ([watch.fd] if watch.fd is not None else [])
        ready, _, _ = select.select(fds, [], [], max(0.0, next_refresh - time.monotonic()))
        if resized.read_fd in ready:
            resized.drain()
        changed = False
        if watch.fd is not None and watch.fd in ready:
            watch.dispatch()  # what changed does not matter: the whole matrix is read again
            changed = True
        if terminal.fd in ready:
            keys, _ = terminal.read_keys("")
            for key in keys:
                screen.key(key)
                if screen.quit:
                    return
        if changed or time.monotonic() >= next_refresh:
            screen.refresh()
            next_refresh = time.monotonic() + REFRESH_S


class _Capture:
    """A terminal-like sink for the console, so rich renders colour (it checks ``isatty``)."""

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return True


def register(sub: Verbs, epilog: str) -> None:
    top = add_verb(sub, "top", epilog)
    top.add_argument("--once", action="store_true", help="print one snapshot and exit")
    top.add_argument(
        "--parent-pid", type=int, metavar="PID", help="the adopting master (default: the caller's)"
    )
    top.add_argument("--parent-session", metavar="ID", help="the adopting master's session id")
    top.set_defaults(handler=cmd_top)


def cmd_top(args: argparse.Namespace, io: Io) -> int:
    store = MatrixStore(resolve_state_dir(args.state_dir))
    from ..matrix.owners import owning_master

    owner = owning_master(store, args.parent_pid, args.parent_session)
    interactive = not args.once and sys.stdin.isatty() and sys.stdout.isatty() and io.out is sys.stdout
    if interactive:
        return run_screen(store, io, owner)
    snapshot = collect(store, Usage())
    console = console_for(io.out)
    for line in pack(snapshot.summary, table_width(io)):
        console.print(line, crop=False)
    if snapshot.items:
        print_table(io, COLUMNS, [i.row for i in snapshot.items], keys=snapshot.keys)
    else:
        io.out.write("no entries\n")
    for problem in snapshot.problems:
        io.err.write(f"pi-matrix: warning: {problem.line()}\n")
    return EXIT_OK
