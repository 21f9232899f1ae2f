"""What a raw-tmux baseline needs in place before its clock starts, shared by bench_fire and
bench_fleet."""

from __future__ import annotations

import shutil
from pathlib import Path

from pi_tmux_matrix.matrix.store import MatrixStore


def with_ours_jobs(ours_root: Path, store: MatrixStore) -> None:
    """The job records ours wrote, copied into the baseline's state dir (and its ``results/``):
    each host reads its own job record and waits for it
    (docs/decisions.md#a-fire-fsyncs-only-what-a-crash-needs), so both sides' hosts then do the
    same work, their round threads included."""
    shutil.copytree(ours_root / "jobs", store.root / "jobs")
    store.side_dir("results")
