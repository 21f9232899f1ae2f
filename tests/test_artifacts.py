"""The bridge's result artifacts, read by one module for the watcher and the host alike (issue
29.7): a round's answer is found in any of the run's answers, in the newest runs, bounded."""

from __future__ import annotations

import json
from pathlib import Path

from pi_tmux_matrix.matrix.artifacts import RECENT_RUNS, final_text, marked_answer

MARKER = "DONE:0123abcd"


def run(folder: Path, n: int, text: str, answers: list[str] | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"run-{n:04d}.json"
    body: dict[str, object] = {"run": n, "text": text}
    if answers is not None:
        body["answers"] = answers
    path.write_text(json.dumps(body))
    return path


def test_a_marker_answered_before_the_runs_last_text_is_the_rounds_answer(tmp_path: Path) -> None:
    path = run(tmp_path, 1, "ok", [f"Done.\n{MARKER}", "Noted.", "ok"])
    found = marked_answer(tmp_path, MARKER)
    assert found is not None and found.text == f"Done.\n{MARKER}" and found.path == str(path)
    assert final_text(path) == "ok"


def test_an_older_bridges_artifact_is_read_by_its_final_text(tmp_path: Path) -> None:
    path = run(tmp_path, 3, f"All done.\n{MARKER}")
    found = marked_answer(tmp_path, MARKER)
    assert found is not None and found.path == str(path)


def test_the_marker_is_looked_for_in_the_newest_runs_newest_first(tmp_path: Path) -> None:
    run(tmp_path, 1, f"old {MARKER}")
    newer = run(tmp_path, 2, f"new {MARKER}")
    run(tmp_path, 3, "ok")
    found = marked_answer(tmp_path, MARKER)
    assert found is not None and found.path == str(newer) and found.text == f"new {MARKER}"
    for n in range(4, 4 + RECENT_RUNS):
        run(tmp_path, n, "ok")
    assert marked_answer(tmp_path, MARKER) is None  # beyond the newest runs: not this round's


def test_no_answer_without_the_marker_or_from_a_malformed_artifact(tmp_path: Path) -> None:
    run(tmp_path, 1, "ok", ["ok"])
    (tmp_path / "run-0002.json").write_text("{not json")
    (tmp_path / "run-0003.json").write_text(json.dumps(["a list", MARKER]))
    assert marked_answer(tmp_path, MARKER) is None
    assert marked_answer(tmp_path, "") is None
    assert marked_answer(tmp_path / "missing", MARKER) is None
    assert final_text(tmp_path / "run-0002.json") == ""
