"""Where fork runs are kept: ``runs/<run id>.json`` records (locked, durable, strict, through the
matrix's record store) and each run's folder ``runs/<run id>/`` with its snapshot, script, pane
log, exit code and the bridge's result.

The folder's files are written and read here; what they mean for the run is decided elsewhere.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Final

from .. import pisession, strictjson
from ..errors import DispatchError, PiMatrixError
from ..errors import RunNotFound as NotFound
from ..identity import validate_id
from ..matrix.fsio import read_state_file
from ..matrix.records import Records
from ..matrix.store import MatrixStore, Problem, durable_write
from ..strictjson import JSONObject
from .model import RUN_SCHEMA_VERSION, ForkRun, RunStatus
from .script import find_exit_code

__all__ = ["RunStore"]

MAX_RESULT_BYTES: Final = 1024 * 1024
LOG_TAIL_BYTES: Final = 64 * 1024  # the exit marker is the pane log's last line: read only the tail


class RunStore:
    """Typed access to fork run records and their folders."""

    def __init__(self, store: MatrixStore) -> None:
        self.store = store
        self.records: Records[ForkRun] = Records(
            store,
            "runs",
            ForkRun,
            newest=RUN_SCHEMA_VERSION,
            own_name=lambda run: run.id,
            missing=NotFound,
            folders=True,
        )

    def folder(self, run_id: str) -> Path:
        return self.records.folder(run_id)

    def path(self, run_id: str, name: str) -> Path:
        return self.records.root / run_id / name

    def get(self, run_id: str) -> ForkRun:
        validate_id(run_id, "run id")
        return self.records.get(run_id)

    def put(self, run: ForkRun, *, exclusive: bool = False) -> None:
        if not self.records.put(run.id, run, exclusive=exclusive):
            raise DispatchError(f"run {run.id} already exists")

    def update(self, run_id: str, change: Callable[[ForkRun], ForkRun | None]) -> ForkRun:
        """Change the run under its lock; ``change`` returning None writes nothing."""
        return self.records.update(run_id, change)

    def list(self) -> tuple[list[ForkRun], list[Problem]]:
        runs, problems = self.records.list()
        runs.sort(key=lambda r: (r.created_at_ms, r.id))
        return runs, problems

    def cap_lock(self, cwd: str) -> AbstractContextManager[int]:
        """The per-working-directory lock under which runs are counted and created."""
        digest = hashlib.sha256(os.fsencode(cwd)).hexdigest()[:24]
        return self.records.locked(f"cap-{digest}")

    # -- reading a run's files ----------------------------------------------------------------------
    def read_text(
        self, run_id: str, name: str, max_bytes: int = MAX_RESULT_BYTES, *, tail: bool = False
    ) -> str | None:
        """The file's text (None if absent or unreadable); with ``tail`` its last ``max_bytes``
        whatever its size, else all of it if it is at most ``max_bytes``."""
        try:
            data = read_state_file(self.records.root / run_id / name, max_bytes=max_bytes, tail=tail)
        except (OSError, PiMatrixError):
            return None
        return data.decode("utf-8", "replace")

    def result(self, run_id: str) -> JSONObject | None:
        """The bridge's ``result.json`` (None if absent or not a JSON object)."""
        raw = self.read_text(run_id, "result.json")
        if raw is None:
            return None
        try:
            value = strictjson.loads(raw.encode(), max_bytes=MAX_RESULT_BYTES)
        except strictjson.StrictJSONError:
            return None
        return value if isinstance(value, dict) else None

    def session_result(self, run: ForkRun) -> JSONObject | None:
        """The run's outcome read back from the child's ``session.jsonl`` (its entries after the
        snapshot), in ``result.json``'s shape; None when it has none (or the record predates
        ``snapshot_bytes``). The fallback for a child that ended without its artifact
        (docs/decisions.md#a-forks-end-is-always-recorded)."""
        if run.snapshot_bytes is None:
            return None
        return pisession.run_outcome(self.path(run.id, "session.jsonl"), run.snapshot_bytes)

    def answer(self, run: ForkRun) -> str | None:
        """A completed run's whole final text (its record keeps an excerpt), from where its end
        came from: ``result.json`` or the session file; None for any other run."""
        if run.status is not RunStatus.COMPLETED:
            return None
        result = self.session_result(run) if run.result_from == "session.jsonl" else self.result(run.id)
        text = result.get("text") if result is not None else None
        return text if isinstance(text, str) else None

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
