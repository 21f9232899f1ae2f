"""What tmux reports and what we pass it, without running it: the :class:`Pane`, the row format,
pane tag names, and the checks and escapes every word we hand tmux goes through.

The pure half of tmux, kept apart from the I/O half: :mod:`pi_tmux_matrix.dispatch.tmux` runs the
commands (and is the only module that does); this module only knows tmux's words, so a launch
plan (:mod:`.plan`), a record held against panes (:mod:`.reconcile_tmux`) or a session name
checked by the CLI uses them without the runner, and they are tested without a tmux. tmux
re-reads its argv, and three of its rules would otherwise change what we pass:

- a word that ends in ``;`` ends the tmux command (the rest of the words would run as another tmux
  command): :func:`word` escapes a final ``;`` as ``\\;``, which tmux turns back into ``;``;
- ``-n`` (window name), ``-c`` (start directory) and the ``pipe-pane`` command are format-expanded:
  :func:`literal` doubles ``#`` there, so ``#{...}`` arrives literally;
- a single-word pane command runs through ``sh -c``: :func:`check_argv` requires >= 2 words.

Pane tags are tmux user options named ``@pi_matrix_<name>`` set on the pane (``set-option -p``).
``TmuxServer.launch`` takes tag names with or without the ``@``; :attr:`Pane.tags` always spells
them with it, exactly as tmux does (``#{@pi_matrix_key}``). The names a launch set are also listed
in the pane option :data:`TAG_INDEX`, which :data:`FORMAT` reads with every row, so
``TmuxServer.panes`` reads every pane's tags in two ``list-panes`` calls whatever their number.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import Final

import attrs

from ..errors import ContractError, DispatchError

__all__ = [
    "AGENT_TAG",
    "ENV_NAME",
    "FORMAT",
    "JOB_TAG",
    "KEY_TAG",
    "TAG_INDEX",
    "TAG_PREFIX",
    "THEN",
    "Pane",
    "Then",
    "TmuxResult",
    "check_argv",
    "check_cwd",
    "check_pane_id",
    "check_session",
    "check_tags",
    "check_window_name",
    "env_args",
    "literal",
    "made",
    "option_args",
    "parse_row",
    "plain_window_name",
    "socket_file",
    "word",
]

TAG_PREFIX: Final = "@pi_matrix_"
# The tags that say whose a pane is: the dispatcher sets them on every agent's pane, a record lost
# before its pane was written is rebuilt from them, and a pane is closed only while they name it.
KEY_TAG: Final = "@pi_matrix_key"
JOB_TAG: Final = "@pi_matrix_job"
# A workspace pane's agent id, shown on its border (programs in the pane cannot change it).
AGENT_TAG: Final = "@pi_matrix_agent"
# Lists the tag names a launch set (space separated, each with its "@"); not itself a tag.
TAG_INDEX: Final = "@pi_matrix_tags"
_TAG_NAME: Final = re.compile(r"@pi_matrix_[A-Za-z0-9_]{1,64}")
_SESSION: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}")
_PANE_ID: Final = re.compile(r"%[0-9]+")
ENV_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f]")
_MAX_TAG_VALUE: Final = 1024

# Tab-separated; tmux escapes tabs and newlines in session and window names, and the window name
# goes last so nothing it holds can shift the fields before it.
_FIELDS: Final = (
    "#{pane_id}",
    "#{pane_pid}",
    "#{window_id}",
    "#{pane_dead}",
    "#{session_name}",
    f"#{{{TAG_INDEX}}}",
    "#{window_name}",
)
FORMAT: Final = "\t".join(_FIELDS)


@attrs.frozen
class Pane:
    """One tmux pane as the server reported it.

    ``pane_id`` (``%3``) is the machine target: unique for the server's lifetime. ``tags`` holds the
    pane's ``@pi_matrix_*`` options as ``(name with "@", value)`` pairs sorted by name.
    """

    pane_id: str
    pane_pid: int
    window_id: str
    session: str
    window_name: str
    dead: bool
    tags: tuple[tuple[str, str], ...] = ()

    @property
    def target(self) -> str:
        """For humans: ``session:window (pane id)``; give tmux :attr:`pane_id` itself."""
        return f"{self.session}:{self.window_name} ({self.pane_id})"

    def tag(self, name: str) -> str | None:
        """The value of tag ``name`` (``"@pi_matrix_key"`` or ``"pi_matrix_key"``), or None."""
        wanted = name if name.startswith("@") else f"@{name}"
        return dict(self.tags).get(wanted)


def word(value: str) -> str:
    """Escape a final ``;`` so tmux keeps the word instead of ending its command there."""
    return value[:-1] + "\\;" if value.endswith(";") else value


def literal(value: str) -> str:
    """A value tmux format-expands, made to expand to itself."""
    return value.replace("#", "##")


class Then:
    """The ``;`` between two tmux commands of one call (a plain ``";"`` word is escaped)."""


THEN: Final = Then()
# A window name a target holds as it is (``=session:=name``): no '.' or ':' splits it.
_PLAIN_NAME: Final = re.compile(r"[A-Za-z0-9_-]+")


def plain_window_name(name: str) -> bool:
    return _PLAIN_NAME.fullmatch(name) is not None


def option_args(
    window: str, pane: str, tags: tuple[tuple[str, str], ...], *, window_options: bool = True
) -> list[str | Then]:
    """``; set-option …`` for remain-on-exit off on ``window`` (with ``window_options``: a tmux.conf
    may turn it on), the index of the tags and each tag on ``pane``."""
    args: list[str | Then] = []
    if window_options:
        args += [THEN, "set-option", "-w", "-t", window, "remain-on-exit", "off"]
    if tags:
        args += [THEN, "set-option", "-p", "-t", pane, TAG_INDEX, " ".join(name for name, _ in tags)]
    for name, value in tags:
        args += [THEN, "set-option", "-p", "-t", pane, name, value]
    return args


def made(result: TmuxResult) -> bool:
    """Whether a call that makes a window or pane (``-P -F FORMAT``) made one: it printed the
    pane's row, even when a command after it in the same call failed."""
    return result.returncode == 0 or result.stdout.startswith("%")


@attrs.frozen
class TmuxResult:
    """What one tmux call returned."""

    returncode: int
    stdout: str
    stderr: str

    @property
    def error(self) -> str:
        return self.stderr.strip() or f"exit status {self.returncode}"


def _tag_name(name: object) -> str:
    full = name if isinstance(name, str) and name.startswith("@") else f"@{name}"
    if not isinstance(name, str) or _TAG_NAME.fullmatch(full) is None or full == TAG_INDEX:
        raise ContractError(
            "tags",
            f"{name!r} is not a pane tag name",
            "use @pi_matrix_<letters, digits, _> (the '@' may be left out); @pi_matrix_tags is reserved",
        )
    return full


def check_pane_id(pane_id: object) -> str:
    if not isinstance(pane_id, str) or _PANE_ID.fullmatch(pane_id) is None:
        raise ContractError("pane", f"{pane_id!r} is not a tmux pane id", "pass an id like %3")
    return pane_id


def env_args(env: Mapping[str, str]) -> list[str]:
    """``-e K=V`` for each item (the value reaches the pane as is: tmux does not expand it)."""
    words: list[str] = []
    for key, value in env.items():
        if ENV_NAME.fullmatch(key) is None or "\0" in value:
            raise ContractError("env", f"{key!r} is not a settable variable", "use names like PI_X")
        words += ["-e", f"{key}={value}"]
    return words


def check_session(name: object, field: str = "session") -> str:
    # tmux rewrites '.' and ':' in session names, and a target prefix-matches unless '='-anchored.
    if not isinstance(name, str) or _SESSION.fullmatch(name) is None:
        raise ContractError(
            field,
            f"{name!r} is not a tmux session name",
            "use 1-128 characters from A-Z a-z 0-9 _ - starting with a letter or digit",
        )
    return name


def check_window_name(window_name: object) -> str:
    if not isinstance(window_name, str) or not window_name or _CONTROL.search(window_name):
        raise ContractError(
            "window_name", f"{window_name!r} is not a window name", "use printable characters"
        )
    return window_name


def check_cwd(cwd: object) -> str:
    if not isinstance(cwd, str) or not os.path.isabs(cwd) or not os.path.isdir(cwd):
        # tmux would silently start the pane in $HOME instead.
        raise ContractError("cwd", f"{cwd!r} is not an existing absolute directory", "pass one")
    return cwd


def check_argv(argv: Sequence[str]) -> list[str]:
    words = list(argv) if not isinstance(argv, str) else []
    if len(words) < 2 or not all(isinstance(word, str) for word in words):
        raise ValueError(
            f"launch argv {argv!r}: give a list of at least 2 words "
            "(tmux runs a single-word command through sh -c)"
        )
    if any("\0" in word for word in words):
        raise ValueError(f"launch argv {argv!r}: a word contains NUL, which no argv can carry")
    return words


def check_tags(tags: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    items: dict[str, str] = {}
    for raw, value in tags.items():
        name = _tag_name(raw)
        if not isinstance(value, str) or len(value) > _MAX_TAG_VALUE or _CONTROL.search(value):
            raise ContractError(
                "tags",
                f"{name} value {value!r} is not a tag value",
                f"use up to {_MAX_TAG_VALUE} printable characters",
            )
        if name in items:
            raise ContractError("tags", f"{name} given twice", "give each tag once")
        items[name] = value
    return tuple(sorted(items.items()))


def parse_row(line: str) -> tuple[Pane, tuple[str, ...]]:
    """A pane row of :data:`FORMAT` and the tag names its index lists."""
    fields = line.split("\t", len(_FIELDS) - 1)
    if len(fields) != len(_FIELDS):
        raise DispatchError(f"tmux reported an unreadable pane row {line!r}; is tmux >= 3.0?")
    pane_id, pid, window_id, dead, session, index, window_name = fields
    try:
        pane_pid = int(pid)
    except ValueError:
        raise DispatchError(f"tmux reported pane {pane_id} with pid {pid!r}") from None
    names = tuple(name for name in index.split() if _TAG_NAME.fullmatch(name) and name != TAG_INDEX)
    pane = Pane(
        pane_id=pane_id,
        pane_pid=pane_pid,
        window_id=window_id,
        session=session,
        window_name=window_name,
        dead=dead == "1",
    )
    return pane, names


_STATUS_KEY: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")
MAX_NOTICE: Final = 1024


def status_option(key: str) -> str:
    """The session user option a status key names: ``@pi_<key>``."""
    if not isinstance(key, str) or not _STATUS_KEY.fullmatch(key):
        raise ContractError("KEY", f"{str(key)[:70]!r} is not a status key", "use 1-64 of A-Z a-z 0-9 _ -")
    return f"@pi_{key}"


def check_notice(text: str) -> str:
    """A one-line, printable text of at most 1 KiB (a notice or a status value)."""
    if not isinstance(text, str) or not text.strip() or len(text) > MAX_NOTICE or _CONTROL.search(text):
        raise ContractError(
            "TEXT", "empty, over 1024 characters, or holds control characters", "give one printable line"
        )
    return text


def socket_file(name: str, path: str | None = None) -> str:
    """Where the server of ``tmux -L name`` listens (``path``: a ``tmux -S`` socket as given)."""
    folder = os.path.join(os.environ.get("TMUX_TMPDIR") or "/tmp", f"tmux-{os.geteuid()}")
    return path or os.path.join(folder, name)
