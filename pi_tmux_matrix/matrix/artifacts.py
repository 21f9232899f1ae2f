"""The pi bridge's result artifacts (``<state dir>/artifacts/<key>/run-NNNN.json``), one reader.

The bridge writes one artifact per pi run (``agent_end``): the run's final assistant text
(``text``) and each of the run's assistant texts in order (``answers``). A
marker round's answer is not always a run's final text: a worker that takes its host's notices
as steers while it thinks (its master died, a new one adopted it) answers them after its marker,
in the same run. Both the job's watcher (is the run that printed the marker over?) and the host
(what did the worker answer?) ask this module, so they never disagree on which text is the
round's, and neither waits for an artifact that will never hold the marker
(docs/decisions.md#the-rounds-answer-is-the-one-that-holds-the-marker).

Everything here was written by the worker's pi process: it is read bounded, through the state
dir's reader (never a FIFO, a symlink or a huge file), and a malformed artifact is no answer.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

import attrs

from .. import strictjson
from ..errors import PiMatrixError
from .fsio import read_state_file

__all__ = ["ARTIFACT_BYTES", "RECENT_RUNS", "Answer", "final_text", "marked_answer", "read_artifact"]

# An artifact is read at most this far: the bridge keeps 16,000 characters of the final text and
# 16,000 of the run's answers together, which JSON escaping can grow up to six times.
ARTIFACT_BYTES: Final = 256 * 1024
# How many of the newest runs a marker is looked for in: the run that printed it, and the runs
# a few notices taken right after it started before anyone looked.
RECENT_RUNS: Final = 4


@attrs.frozen
class Answer:
    """The text of a run that holds a round's marker, and the artifact it was read from."""

    text: str
    path: str


def read_artifact(path: str | os.PathLike[str]) -> dict[str, object] | None:
    """One artifact as a JSON object, or None (missing, not a regular file, too big, malformed)."""
    try:
        data = read_state_file(path, max_bytes=ARTIFACT_BYTES)
        raw = strictjson.loads(data, max_bytes=ARTIFACT_BYTES)
    except (OSError, PiMatrixError, strictjson.StrictJSONError):
        return None
    return raw if isinstance(raw, dict) else None


def final_text(path: str | os.PathLike[str]) -> str:
    """The run's final assistant text ("" without one)."""
    artifact = read_artifact(path)
    text = artifact.get("text") if artifact is not None else None
    return text.strip() if isinstance(text, str) else ""


def _texts(artifact: dict[str, object]) -> list[str]:
    """The run's assistant texts, newest first (an artifact of an older bridge has only ``text``)."""
    answers = artifact.get("answers")
    found = [a for a in answers if isinstance(a, str)] if isinstance(answers, list) else []
    text = artifact.get("text")
    if isinstance(text, str):
        found.append(text)
    return [t.strip() for t in reversed(found)]


def _runs(folder: Path) -> list[Path]:
    try:
        names = sorted(n for n in os.listdir(folder) if n.startswith("run-") and n.endswith(".json"))
    except OSError:
        return []
    return [folder / n for n in reversed(names[-RECENT_RUNS:])]


def marked_answer(folder: str | os.PathLike[str], marker: str) -> Answer | None:
    """The newest answer holding ``marker`` among the agent's newest runs, or None: the run that
    printed the marker has not ended yet (or its artifact is lost)."""
    if not marker:
        return None
    for path in _runs(Path(folder)):
        artifact = read_artifact(path)
        if artifact is None:
            continue
        for text in _texts(artifact):
            if marker in text:
                return Answer(text, str(path))
    return None
