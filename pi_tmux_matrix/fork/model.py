"""The fork run's records: a run, the request that starts one, its usage, and the pure step from
the bridge's result to the run's end (docs/decisions.md#a-fork-runs-from-a-snapshot-beside-its-caller).

No I/O here: the store keeps these records, the launcher and the waiter move them along.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping
from enum import Enum
from typing import Any, Final

import attrs

from ..errors import PiMatrixError
from ..identity import ProcessIdentity
from ..matrix.codec import conv, register_enum
from ..matrix.model import bounded
from ..strictjson import JSONObject

__all__ = [
    "INTERRUPTED",
    "PARENT_ABORTED",
    "ForkCapReached",
    "ForkRequest",
    "ForkRun",
    "ForkUsage",
    "RunMode",
    "RunStatus",
    "finished",
    "parse_usage",
    "summary",
    "usage_total",
]

RUN_SCHEMA_VERSION: Final = 1
EXCERPT: Final = 4000
PARENT_ABORTED: Final = "Parent session shut down. Fork was aborted."
INTERRUPTED: Final = "interrupted (Ctrl-C): fork aborted"


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
    # The snapshot's size: the child's own entries are the ones after it (the session fallback).
    snapshot_bytes: int | None = None
    # Where the run's end came from: "result.json" (the bridge's artifact) or "session.jsonl"
    # (no artifact: read back from the child's session file).
    result_from: str | None = None
    # The run's last tool calls, one line each ("bash: npm test"): the fork tool's expanded view.
    activity: tuple[str, ...] = ()
    # A background run's result is in its parent's session (the bridge acknowledged it).
    delivered_at_ms: int | None = None

    def to_json(self) -> JSONObject:
        value: dict[str, Any] = conv().unstructure(self)
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
    return f"run-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{os.urandom(3).hex()}"


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


def finished(run: ForkRun, result: Mapping[str, object] | None, exit_code: int | None, now: int) -> ForkRun:
    """The run ended: completed from the bridge's result (or the same read back from the child's
    session file: its ``source``), else a synthetic failure."""
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
    source = result.get("source")
    listed = result.get("activity")
    activity = (
        tuple(bounded(a, 200) for a in listed if isinstance(a, str))[-20:] if isinstance(listed, list) else ()
    )
    return attrs.evolve(
        run,
        result_from=source if isinstance(source, str) else "result.json",
        activity=activity,
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


def summary(run: ForkRun, answer: str | None = None, limit: int = 2000) -> str:
    """A bounded, labelled report of a finished run for the parent session: ``answer`` (the
    whole final text) if given, else the record's excerpt."""
    head = f"[pi-matrix fork {run.id}] {run.status.value}"
    if run.error:
        head += f": {run.error}"
    body = answer if answer is not None else run.text or ""
    return bounded(f"{head}\n{body}".rstrip(), limit)
