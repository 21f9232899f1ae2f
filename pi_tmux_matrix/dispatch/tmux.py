"""The one place that runs tmux: launch an argv into a detached window, list, tag, pipe, capture.

Every call is ``tmux -L <socket> <command> <args...>`` run as an argv list (never a shell string,
never ``send-keys``), with a timeout, with ``tmux`` looked up on ``PATH`` at call time. Every word
goes through :mod:`pi_tmux_matrix.dispatch.tmux_model` first, which holds the rules tmux would
otherwise apply to it (a final ``;``, format expansion, single-word commands), the :class:`Pane`
and the row format.

Pane tags: see :mod:`.tmux_model`, the pure half (what tmux's words are); this is the I/O half.
Unreachable is not absent: when no server answers, every query raises :class:`TmuxUnavailable`
(which never proves an agent dead); ``[]`` and ``None`` mean the server answered.
libtmux is not used: its ``tmux_cmd`` has no timeout and cannot keep variables out of a server.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import stat
import subprocess
from collections.abc import Mapping, Sequence
from typing import Final, NoReturn

import attrs

from ..errors import ContractError, DispatchError, TmuxUnavailable
from ..identity import ID_PATTERN
from .tmux_model import (
    AGENT_TAG,
    ENV_NAME,
    FORMAT,
    TAG_PREFIX,
    THEN,
    Pane,
    Then,
    TmuxResult,
    check_argv,
    check_cwd,
    check_notice,
    check_pane_id,
    check_session,
    check_tags,
    check_window_name,
    env_args,
    literal,
    made,
    option_args,
    parse_row,
    plain_window_name,
    socket_file,
    status_option,
    word,
)

__all__ = ["TAG_PREFIX", "Pane", "TmuxServer"]

DEFAULT_TIMEOUT_S: Final = 10.0


class TmuxServer:
    """One tmux server, named by its socket (``tmux -L <socket>``).

    ``scrub_env`` names variables that must never reach a pane from the environment of whoever
    started the server (tmux copies its starter's environment into its global environment): they
    are kept out of every tmux process this object starts, and removed from a running server's
    global environment before each launch. A launch that passes one of them in ``env`` still sets it.
    """

    def __init__(
        self,
        socket: str,
        *,
        scrub_env: Sequence[str] = (),
        timeout: float = DEFAULT_TIMEOUT_S,
        socket_path: str | None = None,
    ) -> None:
        if socket_path is not None and (not isinstance(socket_path, str) or not os.path.isabs(socket_path)):
            raise ContractError("socket_path", f"{socket_path!r} is not an absolute path", "pass one")
        if not isinstance(socket, str) or ID_PATTERN.fullmatch(socket) is None:
            raise ContractError(
                "socket",
                f"{socket!r} is not a tmux socket name",
                "use 1-128 characters from A-Z a-z 0-9 . _ - starting with a letter or digit",
            )
        for name in scrub_env:
            if ENV_NAME.fullmatch(name) is None:
                raise ContractError("scrub_env", f"{name!r} is not a variable name", "pass names like PI_X")
        self.socket = socket
        # A server named by its socket file (``tmux -S``): the one a caller runs in ($TMUX).
        self.socket_path = socket_path
        self.scrub_env: tuple[str, ...] = tuple(scrub_env)
        self.timeout = timeout

    @classmethod
    def of_client(cls, tmux_env: str, *, timeout: float = DEFAULT_TIMEOUT_S) -> TmuxServer:
        """The server of a client whose ``$TMUX`` is ``tmux_env`` (``<socket path>,<pid>,<n>``)."""
        path = tmux_env.split(",", 1)[0] if isinstance(tmux_env, str) else ""
        if not path or not os.path.isabs(path):
            raise ContractError("TMUX", f"{tmux_env!r} does not name a tmux socket", "run inside tmux")
        name = os.path.basename(path)
        return cls(name if ID_PATTERN.fullmatch(name) else "client", socket_path=path, timeout=timeout)

    def __repr__(self) -> str:
        return f"TmuxServer({self.socket!r})"

    # --- running tmux -----------------------------------------------------------------------------
    def _run(self, *args: str | Then, what: str | None = None) -> TmuxResult:
        """``tmux -L socket args...``; raises :class:`TmuxUnavailable` only if tmux cannot run.
        ``what`` names the call in that error (default: its first command)."""
        env = {k: v for k, v in os.environ.items() if k not in self.scrub_env}
        # Resolved per call, so a PATH change (or a tmux installed later) takes effect at once.
        binary = shutil.which("tmux", path=env.get("PATH", os.defpath))
        if binary is None:
            raise TmuxUnavailable(self.socket, "tmux is not installed (not on PATH); install tmux")
        where = ["-S", self.socket_path] if self.socket_path else ["-L", self.socket]
        argv = [binary, *where, *(";" if arg is THEN else word(str(arg)) for arg in args)]
        try:
            done = subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                env=env,
                timeout=self.timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise TmuxUnavailable(
                self.socket, f"tmux {what or args[0]!s} did not answer within {self.timeout:g}s"
            ) from None
        except OSError as exc:
            raise TmuxUnavailable(self.socket, f"cannot run {binary}: {exc.strerror}") from None
        return TmuxResult(
            done.returncode,
            done.stdout.decode("utf-8", "replace"),
            done.stderr.decode("utf-8", "replace"),
        )

    def _failed(self, result: TmuxResult, what: str) -> TmuxUnavailable | DispatchError:
        """The error for a failed command: unreachable if no server answers now, else what tmux said.

        Asking again (instead of matching tmux's wording) keeps this right across tmux versions."""
        if not self.reachable():
            return TmuxUnavailable(self.socket, result.error)
        return DispatchError(f"tmux {what} on socket {self.socket!r} failed: {result.error}")

    # --- queries ----------------------------------------------------------------------------------
    def reachable(self) -> bool:
        """True if a tmux server answers on this socket (starts none)."""
        try:
            return self._run("list-sessions", "-F", "#{session_id}").returncode == 0
        except TmuxUnavailable:
            return False

    def has_session(self, name: str) -> bool:
        """True if a session named exactly ``name`` exists; :class:`TmuxUnavailable` if no server."""
        result = self._run("has-session", "-t", f"={check_session(name)}")
        if result.returncode == 0:
            return True
        if not self.reachable():
            raise TmuxUnavailable(self.socket, result.error)
        return False

    def panes(self) -> list[Pane]:
        """Every pane on the server with its tags; ``[]`` if it answers with none."""
        result = self._run("list-panes", "-a", "-F", FORMAT)
        if result.returncode != 0:
            failure = self._failed(result, "list-panes")
            # A server kept up without sessions has no "current target" for list-panes -a.
            if isinstance(failure, DispatchError) and not self._run("list-sessions").stdout.strip():
                return []
            raise failure
        rows = [parse_row(line) for line in result.stdout.splitlines() if line]
        names = sorted({name for _pane, index in rows for name in index})
        values = self._tag_values(names) if names else {}
        found: list[Pane] = []
        for pane, index in rows:
            # A pane that went away between the two calls keeps no tags (it is gone anyway).
            held = values.get(pane.pane_id, {})
            found.append(attrs.evolve(pane, tags=tuple((n, held[n]) for n in sorted(index) if n in held)))
        return found

    def _tag_values(self, names: Sequence[str]) -> dict[str, dict[str, str]]:
        """``{pane_id: {tag: value}}`` for the non-empty ``names`` of every pane."""
        fmt = "\t".join(["#{pane_id}", *(f"#{{{name}}}" for name in names)])
        result = self._run("list-panes", "-a", "-F", fmt)
        if result.returncode != 0:
            raise self._failed(result, "list-panes")
        found: dict[str, dict[str, str]] = {}
        for line in result.stdout.splitlines():
            pane_id, *values = line.split("\t")
            # A tag set by hand may hold a tab: keep what lines up rather than fail the whole listing.
            found[pane_id] = {n: v for n, v in zip(names, values, strict=False) if v}
        return found

    def pane(self, pane_id: str) -> Pane | None:
        """The pane ``pane_id``, or None if the server answers without it."""
        check_pane_id(pane_id)
        return next((pane for pane in self.panes() if pane.pane_id == pane_id), None)

    def capture(self, pane_id: str, *, history: bool = True) -> str:
        """The pane's text, wrapped lines joined (``-J``); with ``history`` from its first line."""
        args = ["capture-pane", "-p", "-J", "-t", check_pane_id(pane_id)]
        if history:
            args += ["-S", "-"]
        result = self._run(*args)
        if result.returncode != 0:
            raise self._failed(result, f"capture-pane of {pane_id}")
        return result.stdout

    # --- a person's terminal ----------------------------------------------------------------------
    def attach_argv(self, pane_id: str) -> list[str]:
        """The command a person runs to watch ``pane_id`` from outside tmux (paste-able)."""
        where = ["-S", self.socket_path] if self.socket_path else ["-L", self.socket]
        return ["tmux", *where, "attach-session", "-t", check_pane_id(pane_id)]

    def show(self, pane_id: str, *, switch: bool) -> None:
        """Bring ``pane_id`` to the front of its window and session; with ``switch``, also move
        the calling client there (the caller runs inside this server: ``$TMUX`` names it)."""
        pane = check_pane_id(pane_id)
        args: list[str | Then] = ["select-window", "-t", pane, THEN, "select-pane", "-t", pane]
        if switch:
            args += [THEN, "switch-client", "-t", pane]
        result = self._run(*args, what="select-pane")
        if result.returncode != 0:
            raise self._failed(result, f"select-pane of {pane}")

    def open_window(self, name: str, argv: Sequence[str]) -> None:
        """A new window in the calling client's session (this server is the caller's own) running
        ``argv`` (a person's view of another server's pane: tmux does not nest one server's client
        in another's pane unless told, so the inner one runs without ``$TMUX``)."""
        result = self._run("new-window", "-n", name, "--", "env", "-u", "TMUX", *argv, what="new-window")
        if result.returncode != 0:
            raise self._failed(result, "new-window")

    def same_as(self, other: TmuxServer) -> bool:
        """Whether the two name one server (one socket file)."""
        return socket_file(self.socket, self.socket_path) == socket_file(other.socket, other.socket_path)

    def attach(self, pane_id: str) -> NoReturn:
        """Become ``tmux attach`` to ``pane_id`` (outside tmux: this process's terminal is the
        client's). Only returns by raising."""
        self.show(pane_id, switch=False)
        argv = self.attach_argv(pane_id)
        binary = shutil.which("tmux")
        if binary is None:
            raise TmuxUnavailable(self.socket, "tmux is not installed (not on PATH); install tmux")
        env = {k: v for k, v in os.environ.items() if k not in self.scrub_env}
        try:
            os.execve(binary, [binary, *argv[1:]], env)
        except OSError as exc:
            raise TmuxUnavailable(self.socket, f"cannot run {binary}: {exc.strerror}") from None

    # --- changes ----------------------------------------------------------------------------------
    def launch(
        self,
        argv: Sequence[str],
        *,
        session: str,
        window_name: str,
        cwd: str,
        env: Mapping[str, str],
        tags: Mapping[str, str],
        fresh: bool = False,
    ) -> Pane:
        """Run ``argv`` as the command of a new detached window (the session is made if missing;
        with ``fresh`` it must be missing: a session already there is refused by tmux itself).

        The pane's process *is* ``argv`` (tmux execs it: no shell, nothing typed). Every ``env`` item
        is set with ``-e``; ``remain-on-exit`` is turned off for the window (a tmux.conf may turn it
        on), then the pane is tagged. Raises :class:`TmuxUnavailable` if tmux cannot run or start.
        """
        words = check_argv(argv)
        check_session(session)
        check_window_name(window_name)
        check_cwd(cwd)
        env_words = env_args(env)
        tag_items = check_tags(tags)

        spec = ["-d", "-n", literal(window_name), "-c", literal(cwd), *env_words, "-P", "-F", FORMAT]
        tail = ["--", *words]
        # One tmux call per launch: the scrub, the window, its options and tags. With -d the new
        # window is no current target, so the commands after it name it by its session and exact
        # name; a name not unique there (or holding '.' or ':') fails them, and the pane tmux
        # printed is then configured by its ids in a second call.
        here = f"={session}:={window_name}" if plain_window_name(window_name) else None
        window_tail = option_args(here, here, tag_items) if here is not None else []
        result, configured = None, bool(window_tail)
        if not fresh:
            scrub = self._scrub(env, session)
            new_window = ["new-window", "-t", f"={session}:", *spec, *tail, *window_tail]
            result = self._run(*scrub, *([THEN] if scrub else []), *new_window, what="new-window")
        if result is None or (not made(result) and not self._has_session_quiet(session)):
            # A fresh session's window names each pane's agent on its border (its AGENT_TAG).
            window = ["set-option", "-w", "-t", f"={session}:"]
            labels: list[str | Then] = (
                [
                    THEN,
                    *window,
                    "pane-border-status",
                    "top",
                    THEN,
                    *window,
                    "pane-border-format",
                    f" #{{{AGENT_TAG}}} ",
                ]
                if fresh
                else []
            )
            # A new session's one window is its current one: ``=session:`` names it.
            session_tail = option_args(f"={session}:", f"={session}:", tag_items)
            result = self._run("new-session", "-s", session, *spec, *tail, *labels, *session_tail)
            configured = True
            if not fresh and not made(result) and self._has_session_quiet(session):
                # Another launch made the session between our check and our new-session.
                result = self._run("new-window", "-t", f"={session}:", *spec, *tail, *window_tail)
                configured = bool(window_tail)
            if not made(result) and not self.reachable():
                raise TmuxUnavailable(self.socket, f"cannot start a tmux server: {result.error}")
            # A server this call started copied our (scrubbed) environment; a racing starter's
            # may not have, so scrub again for the next launch. new-session's -e items went into
            # the session's environment too: no later window or pane of it may inherit them.
            if scrub := self._scrub({}, session, forget=list(env) if made(result) else ()):
                self._run(*scrub)
        if not made(result):
            raise self._failed(result, f"new-window in session {session!r}")
        if result.returncode == 0 and configured:
            return self._new_pane(result.stdout, "a new window", tag_items, window=None)
        return self._new_pane(result.stdout, "a new window", tag_items, window=True)

    def split(
        self,
        target: str,
        argv: Sequence[str],
        *,
        vertical: bool,
        cwd: str,
        env: Mapping[str, str],
        tags: Mapping[str, str],
        tiled: bool = False,
    ) -> Pane:
        """Run ``argv`` in a new pane split off ``target`` (a pane id, or a session's name for its
        current pane; half of it, beside it or below it when ``vertical``), without selecting it;
        with ``tiled`` the window's panes are then laid out evenly. The window's options are left
        alone: it is usually the caller's own window."""
        words = check_argv(argv)
        check_cwd(cwd)
        env_words = env_args(env)
        tag_items = check_tags(tags)
        where = check_pane_id(target) if target.startswith("%") else f"={check_session(target)}:"
        spec = ["-d", "-v" if vertical else "-h", "-l", "50%", "-c", literal(cwd), *env_words]
        layout: list[str | Then] = [THEN, "select-layout", "-t", where, "tiled"] if tiled else []
        result = self._run("split-window", "-t", where, *spec, "-P", "-F", FORMAT, "--", *words, *layout)
        if result.returncode != 0:
            raise self._failed(result, f"split-window of {target}")
        return self._new_pane(result.stdout, "a new pane", tag_items, window=False)

    def adopt(self, pane_pid: int, *, tags: Mapping[str, str]) -> Pane | None:
        """The pane whose process is ``pane_pid``, tagged (a launch whose ``new-window`` timed out
        but that the server made later); None if no pane runs it."""
        tag_items = check_tags(tags)
        pane = next((p for p in self.panes() if p.pane_pid == pane_pid), None)
        if pane is None:
            return None
        self._configure(pane, tag_items, window=True)
        return attrs.evolve(pane, tags=tag_items)

    def _new_pane(
        self, stdout: str, what: str, tags: tuple[tuple[str, str], ...], *, window: bool | None
    ) -> Pane:
        """The one pane row tmux printed for a new window or pane, configured and tagged (with
        ``window`` None the call that made it did both)."""
        lines = [line for line in stdout.splitlines() if line]
        if len(lines) != 1:
            raise DispatchError(f"tmux on socket {self.socket!r} reported {stdout!r} for {what}")
        pane, _index = parse_row(lines[0])
        if window is not None:
            self._configure(pane, tags, window=window)
        return attrs.evolve(pane, tags=tags)

    def _configure(self, pane: Pane, tags: tuple[tuple[str, str], ...], *, window: bool = True) -> None:
        """remain-on-exit off (our own windows only) and the tags, in one tmux call (``;``
        separates the commands)."""
        args = option_args(pane.window_id, pane.pane_id, tags, window_options=window)[1:]
        if not args:
            return
        result = self._run(*args)
        if result.returncode == 0:
            return
        try:
            still_there = self.pane(pane.pane_id) is not None
        except TmuxUnavailable:
            # It was the server's last pane: an argv that already finished took the server along.
            return
        # An argv that already finished took its pane with it: nothing is left to configure.
        if still_there:
            raise self._failed(result, f"set-option on {pane.pane_id}")

    def _scrub(self, env: Mapping[str, str], session: str, forget: Sequence[str] = ()) -> list[str | Then]:
        """The commands that remove the scrubbed names from a running server's global and session
        environments (and ``forget`` from the session's), ``;``-separated.

        With no server yet they do nothing: the one the launch starts inherits our environment,
        which :meth:`_run` already scrubbed. The session's own unsets go last: when the session
        does not exist they fail, and tmux skips the rest of the call."""
        names = [name for name in self.scrub_env if name not in env]
        args: list[str | Then] = []
        for scope, unset in ((["-g"], names), (["-t", f"={session}"], [*names, *forget])):
            for name in unset:
                args += [*([THEN] if args else []), "set-environment", *scope, "-u", name]
        return args

    def _has_session_quiet(self, name: str) -> bool:
        try:
            return self.has_session(name)
        except TmuxUnavailable:
            return False

    def pipe_pane(self, pane_id: str, command: Sequence[str] | None) -> None:
        """Send the pane's output to ``command``'s stdin, replacing any previous pipe (None:
        close the pipe).

        tmux runs a pipe command through ``/bin/sh -c``: the words are quoted with
        :func:`shlex.join` (and ``#`` doubled, the command is format-expanded)."""
        words = [str(word) for word in command] if command is not None else None
        if words is not None and (not words or any("\0" in word for word in words)):
            raise ContractError("command", f"{command!r} is not a pipe command", "pass a non-empty argv")
        line = [literal(shlex.join(words))] if words is not None else []
        result = self._run("pipe-pane", "-O", "-t", check_pane_id(pane_id), *line)
        if result.returncode != 0:
            raise self._failed(result, f"pipe-pane of {pane_id}")

    # --- the origin's notices: a message to a session, a status user option --------------------
    def notify(self, session: str, text: str, *, duration_ms: int = 5000) -> None:
        """``display-message`` to the clients of ``session`` (none attached: shown to no one). The
        text is shown as written: tmux formats in it (``#{…}``, ``#(cmd)``) are escaped, never run."""
        check_session(session, "session")
        shown = check_notice(text).replace("#", "##")
        result = self._run("display-message", "-d", str(duration_ms), "-t", f"={session}:", "--", shown)
        if result.returncode != 0:
            raise self._failed(result, f"display-message to session {session!r}")

    def notify_pane(self, pane_id: str, text: str, *, duration_ms: int = 8000) -> bool:
        """``display-message`` on the status line of the clients showing ``pane_id``'s session, as
        written (formats escaped); False when tmux would not show it (no client, no such pane)."""
        pane = check_pane_id(pane_id)
        shown = check_notice(text).replace("#", "##")
        # With no client attached tmux drops the message without a word: a person sees nothing.
        attached = self._run("display-message", "-p", "-t", pane, "#{session_attached}")
        if attached.returncode != 0 or attached.stdout.strip() in ("", "0"):
            return False
        result = self._run("display-message", "-d", str(duration_ms), "-t", pane, "--", shown)
        return result.returncode == 0

    def set_status(self, session: str, key: str, value: str | None) -> None:
        """Set (or with None unset) the session's user option ``@pi_<key>`` for a status line."""
        check_session(session, "session")
        name = status_option(key)
        args = (
            ["set-option", "-u", "-t", f"={session}:", name]
            if value is None
            else ["set-option", "-t", f"={session}:", name, check_notice(value)]
        )
        result = self._run(*args)
        if result.returncode != 0:
            raise self._failed(result, f"set-option {name} on session {session!r}")

    def probe(self, pane_id: str | None = None) -> tuple[str | None, list[str] | None, str | None]:
        """For ``status`` (starts no server): ``tmux -V``, this server's sessions (None: none answers)
        and the session of ``pane_id`` (a caller's ``$TMUX_PANE``); None where not known."""

        def ask(*args: str) -> str | None:
            with contextlib.suppress(TmuxUnavailable):
                result = self._run(*args)
                return result.stdout if result.returncode == 0 else None
            return None

        sessions = ask("list-sessions", "-F", "#{session_name}")
        current = (
            ask("display-message", "-p", "-t", check_pane_id(pane_id), "#{session_name}") if pane_id else None
        )
        listed = None if sessions is None else sessions.splitlines()
        return (ask("-V") or "").strip() or None, listed, (current or "").strip() or None

    def kill_pane(self, pane_id: str) -> bool:
        """Kill the pane; True if it was there, False if the server answers without it."""
        result = self._run("kill-pane", "-t", check_pane_id(pane_id))
        if result.returncode == 0:
            return True
        if self.pane(pane_id) is None:  # raises TmuxUnavailable when no server answers
            return False
        raise DispatchError(f"tmux kill-pane {pane_id} on socket {self.socket!r} failed: {result.error}")

    def kill_server(self) -> None:
        """Kill this socket's server and every pane in it; nothing if none runs."""
        with contextlib.suppress(TmuxUnavailable):
            self._run("kill-server")
        self._remove_stale_socket()

    def server_present(self) -> bool:
        """Whether a server listens on the socket at all, answering or not (see :func:`listening`)."""
        return listening(socket_file(self.socket, self.socket_path))

    def _remove_stale_socket(self) -> None:
        # tmux leaves its socket file behind after kill-server; a dispatcher that starts a private
        # server per run (the demo, tests) would litter /tmp/tmux-UID/ with them.
        path = socket_file(self.socket, self.socket_path)
        try:
            info = os.lstat(path)
        except OSError:
            return
        if stat.S_ISSOCK(info.st_mode) and info.st_uid == os.geteuid() and not self.reachable():
            with contextlib.suppress(OSError):
                os.unlink(path)


def listening(path: str) -> bool:
    """Whether a server listens on the socket file at all, answering or not: False when the file is
    missing or nobody accepts on it (the server is gone), True for a server that is there but hung
    (its kernel backlog still takes the connection). Runs no tmux: a connect only."""
    # Imported here: a host imports this module for its pane's pipe and never asks this; socket
    # (with array) would be ~0.2 MiB of each host (docs/decisions.md#a-host-loads-only-what-it-uses).
    import socket

    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(path)
    except (FileNotFoundError, ConnectionRefusedError, NotADirectoryError):
        return False
    except OSError:
        return True  # a full backlog or a timeout: something is there, it does not answer
    finally:
        probe.close()
    return True
