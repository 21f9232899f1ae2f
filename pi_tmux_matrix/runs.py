"""Fork runs (seed 003): a child pi started from a snapshot of a session, in a pane beside the caller.

``pi-matrix fork --session FILE -- TASK`` copies the session file into the run's folder, starts
``pi --session <snapshot> <task>`` (plus the parent's inherited flags and the bridge) in a pane of
a 2x2 grid beside the caller, and either waits for the result (``--wait``) or leaves it running
(``--background``). The run's folder ``<state dir>/runs/<run id>/`` holds::

    session.jsonl   the snapshot the child appends to (the parent's file is never touched)
    fork.sh         the launch script: sets the child's env, waits for ``go``, runs pi, then
                    prints the exit marker
    go              written once the run recorded its pane and process: pi starts after it
    pane.log        the pane's output (tmux pipe-pane): where the exit marker is looked for
    exit.code       the child's exit code, also kept by the script (a child that ends before
                    the pipe is attached leaves no marker in the log)
    result.json     written by the bridge on the child's agent_end (text, stop reason, usage)
    finisher.log    the run's finisher's output (it records the end; for a waited run it also
                    watches the waiter)

and its record ``runs/<run id>.json`` (status running -> completed | failed) goes through the
record store: locked, durable, strict. The end of a run is learned from, in order: the bridge's
``result.json``; the ``__PI_FORK_EXIT_<run id>__:<code>`` marker in the pane log; the death of the
pane's process. With no result a synthetic failure is recorded, never nothing.

At most ``processMatrix.maxConcurrentForks`` (default 3) runs are running per working directory,
counted under a lock after reaping runs whose process is dead or that had no update for 30
minutes. A parent's shutdown stops its running forks and marks them failed.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shlex
import signal
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import nullcontext, suppress
from enum import Enum
from pathlib import Path
from typing import Any, Final

import attrs

from . import procs, strictjson
from .contract import ENV_AGENT_ID, ENV_ALLOWED_PATHS, ENV_PARENT_PID, ENV_PARENT_SESSION, ENV_TASK_REF
from .errors import ContractError, CorruptEntry, DispatchError, PiMatrixError
from .errors import RunNotFound as NotFound
from .identity import ProcessIdentity, validate_id
from .matrix.codec import DecodeError, converter, register_enum, structure
from .matrix.model import bounded
from .matrix.store import MatrixStore, Problem, RecordStore, durable_write, now_ms, read_bounded, read_tail
from .settings import MatrixSettings

__all__ = [
    "EXIT_MARKER",
    "FORCED_ENV",
    "PARENT_ABORTED",
    "ForkCapReached",
    "ForkRequest",
    "ForkRun",
    "ForkUsage",
    "RunMode",
    "RunStatus",
    "RunStore",
    "abort_runs",
    "child_env",
    "inherited_flags",
    "launch_script",
    "read_session_header",
    "start_fork",
    "usage_total",
    "wait_run",
]

RUN_SCHEMA_VERSION: Final = 1
STALE_MS: Final = 30 * 60 * 1000
HEARTBEAT_S: Final = 60.0
RESULT_GRACE_S: Final = 2.0  # seed 003: result.json is read "with retries (up to 2s)"
MAX_TASK_BYTES: Final = 32 * 1024
MAX_RESULT_BYTES: Final = 1024 * 1024
MAX_HEADER_BYTES: Final = 1024 * 1024
EXCERPT: Final = 4000
PARENT_ABORTED: Final = "Parent session shut down. Fork was aborted."
EXIT_MARKER: Final = "__PI_FORK_EXIT_{run_id}__:"
FORK_TAG: Final = "@pi_matrix_fork_run"  # the pane tag holding the run id

# Set last in every child, over the parent's env and processMatrix.forkEnvironment (seed 003).
FORCED_ENV: Final[Mapping[str, str]] = {
    "PI_FORK": "1",
    "PI_OFFLINE": "1",
    "PI_SUBAGENT_DISABLE_SCHEDULER": "1",
    "PI_OBSERVATIONAL_MEMORY_PASSIVE": "1",
}
# Never inherited: they would make the child speak for its parent (its host, its contract).
_NOT_INHERITED: Final = frozenset(
    {
        ENV_PARENT_PID, ENV_PARENT_SESSION, ENV_AGENT_ID, ENV_TASK_REF, ENV_ALLOWED_PATHS,
        "PI_WORKTREE_LANE", "PI_MATRIX_KEY", "PI_MATRIX_MAILBOX", "PI_MATRIX_HOST_PID",
        "PI_MATRIX_DONE_MARKER", "PI_MATRIX_BLOCKED_MARKER", "TMUX", "TMUX_PANE",
        "PI_FORK_RESULT_PATH", "PI_FORK_RUN_ID", "PI_FORK_TASK", "PI_MATRIX_PROFILE",
    }
)  # fmt: skip
# The parent's pi flags a child inherits (seed 003's runner-cli): flag -> canonical spelling.
_INHERITED: Final[Mapping[str, str]] = {
    "--extension": "--extension",
    "-e": "--extension",
    "--skill": "--skill",
    "--model": "--model",
    "--thinking": "--thinking",
    "--provider": "--provider",
}
GO_WAIT_S: Final = 10  # how long a fork pane waits for its launcher's go before giving up
LOG_TAIL_BYTES: Final = 64 * 1024  # the exit marker is the pane log's last line: read only the tail
# Left to the pane's own tmux (the caller's may describe another terminal).
_PANE_OWN: Final = frozenset({"TERM", "COLUMNS", "LINES"})
_ENV_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class ForkCapReached(PiMatrixError):
    """Too many forks are running in this working directory."""


class RunStatus(str, Enum):
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"


class RunMode(str, Enum):
    WAIT = "wait"
    BACKGROUND = "background"


register_enum(RunStatus)
register_enum(RunMode)


@attrs.frozen(kw_only=True)
class ForkUsage:
    """Token and cost totals of a run (pi's ``usage``, summed over the run's assistant messages)."""

    input: int = 0
    output: int = 0
    cache_read: int = 0
    cache_write: int = 0
    total_tokens: int = 0
    cost: float = 0.0

    def __add__(self, other: ForkUsage) -> ForkUsage:
        return ForkUsage(
            input=self.input + other.input,
            output=self.output + other.output,
            cache_read=self.cache_read + other.cache_read,
            cache_write=self.cache_write + other.cache_write,
            total_tokens=self.total_tokens + other.total_tokens,
            cost=round(self.cost + other.cost, 6),
        )


@attrs.frozen(kw_only=True)
class ForkRun:
    """One fork run's record (``runs/<id>.json``)."""

    schema_version: int = RUN_SCHEMA_VERSION
    id: str
    cwd: str
    task: str
    mode: RunMode
    status: RunStatus = RunStatus.RUNNING
    parent_session_file: str | None = None
    parent_key: str | None = None
    created_at_ms: int
    updated_at_ms: int
    ended_at_ms: int | None = None
    argv: tuple[str, ...] = ()
    socket: str | None = None
    socket_path: str | None = None
    pane_id: str | None = None
    window_id: str | None = None
    process: ProcessIdentity | None = None
    exit_code: int | None = None
    error: str | None = None
    text: str | None = None
    stop_reason: str | None = None
    model: str | None = None
    usage: ForkUsage | None = None

    def to_json(self) -> dict[str, Any]:
        value: dict[str, Any] = converter.unstructure(self)
        return value


@attrs.frozen(kw_only=True)
class ForkRequest:
    session_file: str
    task: str
    mode: RunMode = RunMode.WAIT
    # Flags for the child on top of (and after) the inherited ones, e.g. ["--model", "x/y"].
    flags: tuple[str, ...] = ()
    parent_argv: tuple[str, ...] | None = None  # None: found from the caller's host, if any
    socket: str | None = None  # no caller pane: a window on this tmux -L socket
    tmux_env: str | None = None  # the caller's $TMUX and $TMUX_PANE: split beside it
    tmux_pane: str | None = None


def new_run_id() -> str:
    return f"run-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{secrets.token_hex(3)}"


# --- pure parts ------------------------------------------------------------------------------------
def inherited_flags(argv: Sequence[str]) -> list[str]:
    """The parent's ``--extension/-e``, ``--skill``, ``--model``, ``--thinking``, ``--provider``
    (``--flag value`` or ``--flag=value``) in order, spelled canonically; the rest is dropped."""
    found: list[str] = []
    words = list(argv)
    index = 0
    while index < len(words):
        word = words[index]
        name, eq, value = word.partition("=")
        if name in _INHERITED and eq and name.startswith("--"):
            found += [_INHERITED[name], value]
        elif word in _INHERITED and index + 1 < len(words):
            found += [_INHERITED[word], words[index + 1]]
            index += 1
        index += 1
    return found


def merge_flags(inherited: Sequence[str], extra: Sequence[str]) -> list[str]:
    """``inherited`` then ``extra``; a single-valued flag given in ``extra`` replaces the
    inherited one, and the same extension is never loaded twice."""
    pairs = list(zip(inherited[::2], inherited[1::2], strict=False))
    extra_pairs = list(zip(extra[::2], extra[1::2], strict=False))
    overridden = {flag for flag, _ in extra_pairs if flag not in ("--extension", "--skill")}
    merged: list[tuple[str, str]] = []
    for flag, value in [*(p for p in pairs if p[0] not in overridden), *extra_pairs]:
        if (flag, value) not in merged:
            merged.append((flag, value))
    return [word for pair in merged for word in pair]


def child_env(
    parent: Mapping[str, str], overrides: Mapping[str, str], run: Mapping[str, str]
) -> dict[str, str]:
    """The child's environment: the parent's (minus what would make the child speak for the
    parent), then ``processMatrix.forkEnvironment``, then the run's, then :data:`FORCED_ENV`."""
    env = {k: v for k, v in parent.items() if k not in _NOT_INHERITED and "\0" not in v}
    env.update({k: v for k, v in overrides.items() if k not in _NOT_INHERITED})
    env.update(run)
    env.update(FORCED_ENV)
    return env


def launch_script(
    run_id: str,
    argv: Sequence[str],
    exit_file: str | None = None,
    *,
    env: Mapping[str, str] | None = None,
    go_file: str | None = None,
) -> str:
    """The pane's script: its environment, the wait for the launcher's go, pi, then the exit
    marker on a line of its own (and the code in ``exit_file``: a child that ends before the
    pane's pipe is attached leaves no marker in the log), then wait for Enter (a finished
    background fork stays on screen; the waiter closes a wait-mode pane itself).

    ``env`` is set here, not on tmux's command line, where any user's ``ps`` would show its
    values; the names a child must never inherit are unset (the caller's tmux server may hold
    them in its global environment). pi starts only once ``go_file`` exists: a launcher that
    died between making the pane and recording it leaves a pane that gives up after
    :data:`GO_WAIT_S` seconds, never an unrecorded pi."""
    marker = EXIT_MARKER.format(run_id=run_id)
    keep = f"printf '%s\\n' \"$code\" > {shlex.quote(exit_file)}\n" if exit_file else ""
    lines = ["#!/bin/sh", f"# pi-matrix fork run {run_id}"]
    if env is not None:
        lines += [f"unset {name}" for name in sorted(_NOT_INHERITED - {"TMUX", "TMUX_PANE"} - set(env))]
        lines += [
            f"export {name}={shlex.quote(value)}"
            for name, value in env.items()
            if name not in _PANE_OWN and _ENV_NAME.fullmatch(name) and "\0" not in value
        ]
    if go_file is not None:
        go = shlex.quote(go_file)
        lines += [
            "tries=0",
            f"while [ ! -e {go} ]; do",
            f'  tries=$((tries + 1)); if [ "$tries" -gt {GO_WAIT_S * 20} ]; then',
            "    echo '[pi-matrix] the fork was never confirmed by its launcher: nothing was started.'",
            "    exit 125",
            "  fi",
            "  sleep 0.05",
            "done",
        ]
    return (
        "\n".join(lines) + "\n"
        f"{shlex.join(argv)}\n"
        "code=$?\n"
        f"{keep}"
        f"printf '\\n%s%s\\n' {shlex.quote(marker)} \"$code\"\n"
        "printf '%s\\n' '[pi-matrix] fork finished; press Enter to close this pane.'\n"
        "read -r _ || true\n"
        'exit "$code"\n'
    )


def find_exit_code(log: str, run_id: str) -> int | None:
    """The code of the run's exit marker in ``log`` (a whole line; ANSI-free by construction of
    the marker line), or None."""
    marker = re.escape(EXIT_MARKER.format(run_id=run_id))
    found = re.findall(rf"(?m)^{marker}(-?[0-9]{{1,4}})\r?$", log)
    return int(found[-1]) if found else None


def _number(value: object) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


def parse_usage(raw: object) -> ForkUsage | None:
    """pi's usage object (``input``, ``output``, ``cacheRead``, ``cacheWrite``, ``totalTokens``,
    ``cost.total``); anything missing counts 0, anything else means no usage."""
    if not isinstance(raw, dict):
        return None
    cost = raw.get("cost")
    return ForkUsage(
        input=int(_number(raw.get("input"))),
        output=int(_number(raw.get("output"))),
        cache_read=int(_number(raw.get("cacheRead"))),
        cache_write=int(_number(raw.get("cacheWrite"))),
        total_tokens=int(_number(raw.get("totalTokens"))),
        cost=_number(cost.get("total")) if isinstance(cost, dict) else _number(cost),
    )


def usage_total(runs: Iterable[ForkRun]) -> ForkUsage:
    total = ForkUsage()
    for run in runs:
        if run.usage is not None:
            total = total + run.usage
    return total


def finished(run: ForkRun, result: Mapping[str, Any] | None, exit_code: int | None, now: int) -> ForkRun:
    """The run ended: completed from the bridge's result, else a synthetic failure."""
    if result is None:
        why = (
            f"fork exited with code {exit_code} without a result artifact"
            if exit_code is not None
            else "fork process ended without a result artifact or exit marker"
        )
        return attrs.evolve(
            run, status=RunStatus.FAILED, exit_code=exit_code, error=why, updated_at_ms=now, ended_at_ms=now
        )
    stop = result.get("stopReason")
    stop_reason = str(stop) if isinstance(stop, str) else None
    text = result.get("text")
    failed = stop_reason in ("error", "aborted")
    message = result.get("errorMessage")
    error = None
    if failed:
        error = bounded(
            str(message) if isinstance(message, str) and message else f"stop reason {stop_reason}", 400
        )
    elif not (isinstance(text, str) and text.strip()):
        # Nothing to hand back: the parent asked for an answer, and an empty one is no answer.
        failed = True
        error = "the fork ended without a final answer (no assistant text in its result)"
    model = result.get("model")
    return attrs.evolve(
        run,
        status=RunStatus.FAILED if failed else RunStatus.COMPLETED,
        exit_code=exit_code,
        error=error,
        text=bounded(text, EXCERPT) if isinstance(text, str) else None,
        stop_reason=stop_reason,
        model=str(model) if isinstance(model, str) else None,
        usage=parse_usage(result.get("usage")),
        updated_at_ms=now,
        ended_at_ms=now,
    )


def read_session_header(session_file: str) -> tuple[str, str]:
    """``(session id, cwd)`` from a pi session file's header line; a clear error otherwise."""
    fix = "pass an existing pi session file (.jsonl) whose first line is its session header"
    try:
        fd = os.open(session_file, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise ContractError("--session", f"{session_file}: {exc.strerror}", fix) from None
    try:
        first = os.read(fd, MAX_HEADER_BYTES).split(b"\n", 1)[0]
    except OSError as exc:
        raise ContractError("--session", f"{session_file}: {exc.strerror}", fix) from None
    finally:
        os.close(fd)
    try:
        header = strictjson.loads(first, max_bytes=MAX_HEADER_BYTES)
    except strictjson.StrictJSONError:
        header = None
    if not isinstance(header, dict) or header.get("type") != "session":
        raise ContractError("--session", f"{session_file}: the first line is not a pi session header", fix)
    session_id, cwd = header.get("id"), header.get("cwd")
    if (
        not isinstance(session_id, str)
        or not session_id
        or not isinstance(cwd, str)
        or not os.path.isabs(cwd)
    ):
        raise ContractError("--session", f"{session_file}: the header has no id or no absolute cwd", fix)
    return session_id, cwd


# --- the record store -------------------------------------------------------------------------------
class RunStore:
    """Typed access to fork run records and their folders."""

    def __init__(self, store: MatrixStore) -> None:
        self.store = store
        self.records = RecordStore(store, "runs", folders=True)

    def folder(self, run_id: str) -> Path:
        return self.records.folder(run_id)

    def path(self, run_id: str, name: str) -> Path:
        return self.records.root / run_id / name

    def _run(self, raw: dict[str, Any], name: str) -> ForkRun:
        where = str(self.records.root / f"{name}.json")
        version = raw.get("schemaVersion")
        if type(version) is int and version > RUN_SCHEMA_VERSION:
            raise CorruptEntry(
                where, f"written by a newer pi-matrix (schemaVersion {version}); upgrade to read it"
            )
        try:
            run = structure(raw, ForkRun)
        except DecodeError as exc:
            raise CorruptEntry(where, exc.reason) from None
        if run.id != name:
            raise CorruptEntry(where, f"inner id {run.id!r} differs from the name")
        return run

    def get(self, run_id: str) -> ForkRun:
        validate_id(run_id, "run id")
        raw = self.records.get(run_id)
        if raw is None:
            raise NotFound(run_id)
        return self._run(raw, run_id)

    def put(self, run: ForkRun, *, exclusive: bool = False) -> None:
        if not self.records.put(run.id, run.to_json(), exclusive=exclusive):
            raise DispatchError(f"run {run.id} already exists")

    def update(self, run_id: str, change: Callable[[ForkRun], ForkRun | None]) -> ForkRun:
        """Change the run under its lock; ``change`` returning None writes nothing."""
        holder: list[ForkRun] = []

        def apply(raw: dict[str, Any] | None) -> dict[str, Any] | None:
            if raw is None:
                raise NotFound(run_id)
            current = self._run(raw, run_id)
            changed = change(current)
            holder.append(changed or current)
            return None if changed is None else changed.to_json()

        self.records.update(run_id, apply)
        return holder[-1]

    def list(self) -> tuple[list[ForkRun], list[Problem]]:
        records, problems = self.records.list()
        runs: list[ForkRun] = []
        for name, raw in records:
            try:
                runs.append(self._run(raw, name))
            except CorruptEntry as exc:
                problems.append(Problem(exc.path or name, exc.reason, "corrupt"))
        runs.sort(key=lambda r: (r.created_at_ms, r.id))
        return runs, problems

    def cap_lock(self, cwd: str) -> Any:
        """The per-working-directory lock under which runs are counted and created."""
        digest = hashlib.sha256(os.fsencode(cwd)).hexdigest()[:24]
        return self.records.locked(f"cap-{digest}")

    # -- reading a run's files ----------------------------------------------------------------------
    def read_text(
        self, run_id: str, name: str, max_bytes: int = MAX_RESULT_BYTES, *, tail: bool = False
    ) -> str | None:
        """The file's text (None if absent or unreadable); with ``tail`` its last ``max_bytes``
        whatever its size, else all of it if it is at most ``max_bytes``."""
        folder = self.records.root / run_id
        try:
            fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            read = read_tail if tail else read_bounded
            data = read(fd, name, str(folder / name), max_bytes)
        except (OSError, PiMatrixError):
            return None
        finally:
            os.close(fd)
        return data.decode("utf-8", "replace")

    def result(self, run_id: str) -> dict[str, Any] | None:
        """The bridge's ``result.json`` (None if absent or not a JSON object)."""
        raw = self.read_text(run_id, "result.json")
        if raw is None:
            return None
        try:
            value = strictjson.loads(raw.encode(), max_bytes=MAX_RESULT_BYTES)
        except strictjson.StrictJSONError:
            return None
        return value if isinstance(value, dict) else None

    def exit_code(self, run_id: str) -> int | None:
        """The child's exit code: the script's exit file (a few bytes), else the marker in the
        last :data:`LOG_TAIL_BYTES` of the pane log (a long session's log is large; it is polled)."""
        kept = (self.read_text(run_id, "exit.code", max_bytes=64) or "").strip()
        if re.fullmatch(r"-?[0-9]{1,4}", kept):
            return int(kept)
        log = self.read_text(run_id, "pane.log", max_bytes=LOG_TAIL_BYTES, tail=True)
        return None if log is None else find_exit_code(log, run_id)

    def write_file(self, run_id: str, name: str, data: bytes) -> Path:
        """``name`` in the run's folder, written durably (0600; the launch script is run by
        ``/bin/sh``, never executed itself)."""
        folder = self.folder(run_id)
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            durable_write(fd, name, data, exclusive=False, path=str(folder / name))
        finally:
            os.close(fd)
        return folder / name


# --- I/O: tmux, processes ----------------------------------------------------------------------------
STALE_ERROR: Final = "no update for 30 minutes: reaped as stale"


def _server(run: ForkRun) -> Any:
    from .dispatch.tmux import TmuxServer

    if run.socket_path:
        return TmuxServer(run.socket or "client", socket_path=run.socket_path)
    return TmuxServer(run.socket or "pi-matrix")


def _run_pane(run: ForkRun) -> tuple[Any, Any]:
    """(server, the run's pane) — the pane only while it still is the run's: tagged with the
    run's id, with the recorded pane id and process once they are recorded. A tmux server that
    restarted reuses pane ids: an id alone would name somebody else's pane."""
    from .errors import TmuxUnavailable

    if not (run.socket or run.socket_path):
        return None, None
    server = _server(run)
    try:
        panes = server.panes()
    except (TmuxUnavailable, DispatchError, ContractError):
        return server, None
    for pane in panes:
        if pane.tag(FORK_TAG) != run.id:
            continue
        if run.pane_id is not None and pane.pane_id != run.pane_id:
            continue
        if run.process is not None and pane.pane_pid != run.process.pid:
            continue
        return server, pane
    return server, None


def _stop_pane(server: Any, pane: Any, leader: ProcessIdentity | None) -> None:
    """Stop everything the pane's script started, then close the pane. The processes go first:
    killing a pane only hangs up its terminal, which pi or a tool's child may ignore."""
    from .errors import TmuxUnavailable

    if leader is None and pane is not None:
        leader = procs.identify(pane.pane_pid)
    if leader is not None:
        procs.stop_group(leader)
    if pane is not None:
        with suppress(TmuxUnavailable, DispatchError, ContractError):
            server.kill_pane(pane.pane_id)


def stop_run_process(run: ForkRun) -> None:
    """Stop the run's processes (its pane's process group and their descendants: SIGTERM, then
    SIGKILL) and close its pane, if that pane is still the run's."""
    server, pane = _run_pane(run)
    _stop_pane(server, pane, run.process)


def _refresh(runs: RunStore, run: ForkRun, now: int, *, settle: bool) -> ForkRun | None:
    """A running run's next state if it ended (or went stale), else None. ``settle`` gives the
    bridge's result up to 2 s to appear after the exit marker and the exit up to 2 s to follow
    the result (a waiter); without it (a listing) a run with a result whose process still runs
    stays running: its exit code lands in a moment, and its waiter records it."""
    if run.status is not RunStatus.RUNNING:
        return None
    result = runs.result(run.id)
    code = runs.exit_code(run.id)
    alive = run.process is not None and procs.is_alive(run.process)
    if result is not None:
        if code is None and alive and not settle:
            return None
        # The bridge writes the result just before pi exits: a waiter gives the exit a moment.
        deadline = time.monotonic() + (RESULT_GRACE_S if settle else 0.0)
        while code is None and time.monotonic() < deadline:
            time.sleep(0.05)
            code = runs.exit_code(run.id)
        return finished(run, result, code, now)
    if code is not None or (run.process is not None and not alive):
        if settle:
            deadline = time.monotonic() + RESULT_GRACE_S
            while result is None and time.monotonic() < deadline:
                time.sleep(0.1)
                result = runs.result(run.id)
        return finished(run, result, code, now_ms())
    if now - run.updated_at_ms > STALE_MS:
        return attrs.evolve(
            run, status=RunStatus.FAILED, error=STALE_ERROR, updated_at_ms=now, ended_at_ms=now
        )
    return None


def refresh(runs: RunStore, run_id: str, *, settle: bool = False) -> ForkRun:
    """Record the run's end if it has ended (under its lock); the run as it now stands."""
    now = now_ms()
    return runs.update(run_id, lambda run: _refresh(runs, run, now, settle=settle))


def reap(runs: RunStore, cwd: str | None = None) -> list[ForkRun]:
    """Refresh every running run (of ``cwd``); every run (of ``cwd``) as it now stands. A run
    reaped as stale is stopped too: it no longer counts, so it must not keep running unseen."""
    listed, _problems = runs.list()
    found: list[ForkRun] = []
    for run in listed:
        if cwd is not None and run.cwd != cwd:
            continue
        current = run
        if run.status is RunStatus.RUNNING:
            with suppress(NotFound, CorruptEntry):
                current = refresh(runs, run.id)
            if current.status is RunStatus.FAILED and current.error == STALE_ERROR:
                stop_run_process(current)
        found.append(current)
    return found


def abort_run(runs: RunStore, run_id: str, reason: str) -> ForkRun:
    """Record a running run failed with ``reason``, then stop it; a run that already ended (or
    just did) keeps the end it had. The record goes first: a waiter that sees the process die
    must find the abort, not guess "ended without a result"."""
    run = refresh(runs, run_id)
    if run.status is not RunStatus.RUNNING:
        return run
    now = now_ms()
    ours: list[ForkRun] = []

    def fail(current: ForkRun) -> ForkRun | None:
        if current.status is not RunStatus.RUNNING:
            return None
        # The child may have finished just before it was stopped: its result still counts.
        result = runs.result(current.id)
        if result is not None:
            ended = finished(current, result, runs.exit_code(current.id), now)
        else:
            ended = attrs.evolve(
                current, status=RunStatus.FAILED, error=reason, updated_at_ms=now, ended_at_ms=now
            )
        ours.append(ended)
        return ended

    ended = runs.update(run_id, fail)
    if ours:
        stop_run_process(ended)
    return ended


def abort_runs(
    store: MatrixStore,
    *,
    parent_session_file: str | None = None,
    parent_key: str | None = None,
    reason: str = PARENT_ABORTED,
) -> list[ForkRun]:
    """Stop the running forks of a parent (by its session file or its matrix key) and mark them
    failed with ``reason``: what a parent's shutdown does."""
    if not store.exists():
        return []
    runs = RunStore(store)
    listed, _problems = runs.list()
    wanted = os.path.realpath(parent_session_file) if parent_session_file else None
    stopped: list[ForkRun] = []
    for run in listed:
        if run.status is not RunStatus.RUNNING:
            continue
        by_file = wanted is not None and run.parent_session_file == wanted
        by_key = parent_key is not None and run.parent_key == parent_key
        if by_file or by_key:
            with suppress(NotFound, CorruptEntry):
                stopped.append(abort_run(runs, run.id, reason))
    return stopped


def parent_argv_from_host(env: Mapping[str, str]) -> list[str] | None:
    """The argv the caller's pi-matrix host runs its agent with (the words after its ``--``).

    pi rewrites its own process title, so its flags are read from the host that started it:
    the one ``PI_MATRIX_HOST_PID`` names, trusted only if it is one of the caller's ancestors."""
    raw = env.get("PI_MATRIX_HOST_PID", "")
    if not raw.isdigit():
        return None
    for ancestor in procs.ancestors():
        if ancestor.pid != int(raw):
            continue
        words = procs.cmdline(ancestor)
        if not words or "--" not in words:
            return None
        return words[words.index("--") + 1 :]
    return None


_PANE_ID: Final = re.compile(r"%[0-9]{1,9}")


def _stale_pane(pane: str, where: str) -> ContractError:
    return ContractError(
        "TMUX_PANE",
        f"{pane} is not a pane of the tmux server in $TMUX ({where}): a value left from another tmux?",
        "run pi-matrix fork from a pane of that tmux server, or unset TMUX and TMUX_PANE to get a "
        "window on --socket instead",
    )


def _fork_server(request: ForkRequest) -> Any:
    """The tmux server the fork goes to, checked before anything is written: the caller's (its
    pane must be there) or, outside tmux, the ``--socket`` one."""
    from .dispatch.tmux import TmuxServer

    if request.tmux_env and request.tmux_pane:
        if _PANE_ID.fullmatch(request.tmux_pane) is None:
            raise ContractError("TMUX_PANE", f"{request.tmux_pane!r} is not a tmux pane id", "unset it")
        server = TmuxServer.of_client(request.tmux_env)
        if server.pane(request.tmux_pane) is None:
            raise _stale_pane(request.tmux_pane, server.socket_path or server.socket)
        return server
    return TmuxServer(request.socket or "pi-matrix", scrub_env=sorted(_NOT_INHERITED))


def _grid_slot(server: Any, caller: str) -> tuple[str, bool]:
    """Where the next fork pane goes in the caller's window: (pane to split, vertically?).

    A 2x2 grid with the caller top-left: the first fork takes the right half, the second the
    bottom of the right half, the third the bottom of the caller's half; more forks split the
    oldest fork pane again."""
    panes = server.panes()
    mine = next((p for p in panes if p.pane_id == caller), None)
    if mine is None:
        raise _stale_pane(caller, server.socket_path or server.socket)
    forks = [p for p in panes if p.window_id == mine.window_id and p.tag(FORK_TAG)]
    forks.sort(key=lambda p: int(p.pane_id[1:]))
    if not forks:
        return caller, False
    if len(forks) == 1:
        return forks[0].pane_id, True
    if len(forks) == 2:
        return caller, True
    return forks[0].pane_id, True


def _whole_lines(data: bytes) -> bytes:
    """The session up to its last complete line: the parent may be writing one right now."""
    cut = data.rfind(b"\n")
    return data[: cut + 1] if cut >= 0 else b""


def start_fork(
    store: MatrixStore,
    settings: MatrixSettings,
    request: ForkRequest,
    *,
    env: Mapping[str, str] | None = None,
    pi_argv: Sequence[str] = ("pi",),
    bridge: str | None = None,
    on_started: Callable[[ForkRun], None] | None = None,
) -> ForkRun:
    """Snapshot the session, check the cap, and start the child in its pane; the run (running,
    or failed if it was aborted while it was being launched).

    ``on_started`` runs once the run records its pane and process and before pi starts (the pane
    waits for the go): where the caller starts the run's finisher, so no pi ever runs unwatched."""
    source = dict(os.environ if env is None else env)
    if source.get("PI_FORK") == "1":
        raise ContractError(
            "PI_FORK", "this is a fork child; forks do not fork", "fork from the parent session"
        )
    if source.get(ENV_ALLOWED_PATHS):
        raise ContractError(
            ENV_ALLOWED_PATHS,
            "set: this is a worker confined to its allowed paths, and a fork would run outside them",
            "ask your master for another worker (tmux_agent_manager fire), or do the task yourself",
        )
    task = request.task
    if not task.strip():
        raise ContractError(
            "TASK", "missing", "give the task after --, e.g. pi-matrix fork --session F -- check X"
        )
    if len(task.encode()) > MAX_TASK_BYTES:
        raise ContractError("TASK", f"longer than {MAX_TASK_BYTES} bytes", "shorten it or point to a file")
    if task.lstrip().startswith("-"):
        raise ContractError("TASK", "starts with '-' (pi would read it as a flag)", "start it with a word")
    session_file = os.path.realpath(request.session_file)
    _session_id, cwd = read_session_header(session_file)
    if not os.path.isdir(cwd):
        raise ContractError(
            "--session", f"the session's folder {cwd} no longer exists", "restore it or fork another session"
        )
    server = _fork_server(request)
    if request.parent_argv is not None:
        parent_argv: list[str] = list(request.parent_argv)
    else:
        parent_argv = parent_argv_from_host(source) or []
    flags = merge_flags(inherited_flags(parent_argv), inherited_flags(request.flags))
    if bridge is not None:
        flags = merge_flags(flags, ["--extension", bridge])

    runs = RunStore(store)
    now = now_ms()
    run_id = new_run_id()
    with runs.cap_lock(cwd):
        running = [r for r in reap(runs, cwd) if r.status is RunStatus.RUNNING]
        cap = settings.max_concurrent_forks
        if len(running) >= cap:
            raise ForkCapReached(
                f"{len(running)} fork(s) already running in {cwd} (processMatrix.maxConcurrentForks={cap}): "
                "wait for one to finish ('pi-matrix runs'), abort one, or raise the setting"
            )
        folder = runs.folder(run_id)
        snapshot = folder / "session.jsonl"
        with open(session_file, "rb") as handle:
            runs.write_file(run_id, "session.jsonl", _whole_lines(handle.read()))
        argv = [*pi_argv, "--session", str(snapshot), *flags, task]
        run = ForkRun(
            id=run_id,
            cwd=cwd,
            task=bounded(task, 2000),
            mode=request.mode,
            parent_session_file=session_file,
            parent_key=source.get("PI_MATRIX_KEY") or None,
            created_at_ms=now,
            updated_at_ms=now,
            argv=tuple(argv),
            # Recorded before the pane exists: an abort during the launch finds it by its tag.
            socket=server.socket,
            socket_path=server.socket_path,
        )
        runs.put(run, exclusive=True)

    pane: Any = None
    try:
        child = child_env(
            source,
            settings.fork_environment,
            {
                "PI_FORK_RESULT_PATH": str(folder / "result.json"),
                "PI_FORK_RUN_ID": run_id,
                "PI_FORK_TASK": bounded(task, 2000),
            },
        )
        body = launch_script(run_id, argv, str(folder / "exit.code"), env=child, go_file=str(folder / "go"))
        script = runs.write_file(run_id, "fork.sh", body.encode())
        tags = {FORK_TAG: run_id}
        if request.tmux_env and request.tmux_pane:
            target, vertical = _grid_slot(server, request.tmux_pane)
            pane = server.split(
                target, ["/bin/sh", str(script)], vertical=vertical, cwd=cwd, env={}, tags=tags
            )
        else:
            pane = server.launch(
                ["/bin/sh", str(script)],
                session="pi-matrix",
                window_name=f"fork-{run_id[-6:]}",
                cwd=cwd,
                env={},
                tags=tags,
            )
        server.pipe_pane(pane.pane_id, ["tee", "-a", str(folder / "pane.log")])
        identity = procs.identify(pane.pane_pid)
        if identity is None:
            raise DispatchError(f"the fork's pane {pane.pane_id} ended as soon as it started")

        def attach(current: ForkRun) -> ForkRun | None:
            if current.status is not RunStatus.RUNNING:
                return None  # aborted while it was being launched: nothing to attach it to
            return attrs.evolve(
                current,
                pane_id=pane.pane_id,
                window_id=pane.window_id,
                process=identity,
                updated_at_ms=now_ms(),
            )

        run = runs.update(run_id, attach)
        if run.status is not RunStatus.RUNNING:
            _stop_pane(server, pane, identity)
            return run
        if on_started is not None:
            on_started(run)
        runs.write_file(run_id, "go", b"")
    except BaseException as exc:
        message = bounded(f"launch failed: {exc or type(exc).__name__}", 400)

        ended_elsewhere: list[ForkRun] = []

        def fail(current: ForkRun) -> ForkRun | None:
            if current.status is not RunStatus.RUNNING:
                ended_elsewhere.append(current)
                return None
            at = now_ms()
            return attrs.evolve(
                current, status=RunStatus.FAILED, error=message, updated_at_ms=at, ended_at_ms=at
            )

        with suppress(PiMatrixError):
            failed = runs.update(run_id, fail)
            if pane is not None:
                _stop_pane(server, pane, None)
            else:
                stop_run_process(failed)  # a pane made before the failure is found by its tag
        if ended_elsewhere and isinstance(exc, PiMatrixError):
            # Aborted while it was being launched (its pane went with the abort): that is the
            # run's end, and the failure it caused here is no news.
            return ended_elsewhere[0]
        raise
    return run


class StopSignals:
    """While active (main thread only), SIGTERM, SIGHUP and SIGINT are recorded in
    :attr:`caught` instead of ending the process: a waiter must stop its fork before it goes,
    and a launch must not be cut between making the pane and recording it."""

    SIGNALS: Final = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)

    def __init__(self) -> None:
        self.caught: list[int] = []
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        if _main_thread():
            for sig in self.SIGNALS:
                self._previous[sig] = signal.signal(sig, self._on_signal)
        return self

    def _on_signal(self, signum: int, _frame: object) -> None:
        self.caught.append(signum)

    def reason(self) -> str | None:
        """Why the fork must stop, or None: SIGTERM/SIGHUP mean the caller (the parent session)
        is going away, SIGINT a person."""
        if not self.caught:
            return None
        return "interrupted (Ctrl-C): fork aborted" if self.caught[0] == signal.SIGINT else PARENT_ABORTED

    def __exit__(self, *_exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def wait_run(
    store: MatrixStore,
    run_id: str,
    *,
    timeout_s: float | None = None,
    close_pane: bool = True,
    poll_s: float = 0.2,
    watch: ProcessIdentity | None = None,
    signals: StopSignals | None = None,
) -> ForkRun:
    """Wait until the run ends and record how; close its pane (``close_pane``) if this wait saw
    it end. A signal that ends the waiter (its parent shutting down) stops the fork and fails it
    with :data:`PARENT_ABORTED`, and so does the death of ``watch`` (the ``fork --wait`` process
    a finisher watches: pi's bash tool kills a tool's whole process group with SIGKILL, which no
    handler sees); a ``timeout_s`` that passes stops and fails it too."""
    runs = RunStore(store)
    started = time.monotonic()
    beat = started
    saw_running = False
    with StopSignals() if signals is None else nullcontext(signals) as stops:
        while True:
            why = stops.reason()
            if why is not None:
                return abort_run(runs, run_id, why)
            run = refresh(runs, run_id, settle=True)
            if run.status is not RunStatus.RUNNING:
                break
            saw_running = True
            if watch is not None and not procs.is_alive(watch):
                return abort_run(runs, run_id, PARENT_ABORTED)
            if timeout_s is not None and time.monotonic() - started > timeout_s:
                return abort_run(runs, run_id, f"timed out after {timeout_s:g}s")
            if time.monotonic() - beat > HEARTBEAT_S:
                beat = time.monotonic()
                runs.update(
                    run_id,
                    lambda r: (
                        attrs.evolve(r, updated_at_ms=now_ms()) if r.status is RunStatus.RUNNING else None
                    ),
                )
            time.sleep(poll_s)
    if close_pane and saw_running:
        stop_run_process(run)
    return run


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def finisher_argv(
    state_dir: Path,
    run_id: str,
    *,
    watch: ProcessIdentity | None = None,
    notify: bool = True,
    python: str = sys.executable,
) -> list[str]:
    """A run's finisher, in its own session: waits for the end and records it; for a background
    run it tells the parent, for a waited one it watches the waiter (``watch``) and stops the
    fork if the waiter dies first."""
    argv = [
        python, "-m", "pi_tmux_matrix", "--state-dir", str(state_dir),
        "runs", run_id, "--wait", "--keep-pane",
    ]  # fmt: skip
    if notify:
        argv.append("--notify")
    if watch is not None:
        argv += ["--watch", f"{watch.pid}:{watch.start_ticks}"]
    return argv


def summary(run: ForkRun) -> str:
    """A bounded, labelled report of a finished run for the parent session."""
    head = f"[pi-matrix fork {run.id}] {run.status.value}"
    if run.error:
        head += f": {run.error}"
    body = run.text or ""
    return bounded(f"{head}\n{body}".rstrip(), 2000)


def dumps(value: Any) -> str:
    return json.dumps(value, indent=2)
