"""The one resolver of the names a person types: entry keys, job ids, agent ids, and prefixes of
them, as git and docker take a short id.

Keys are ``worker-<sessionId>`` (43 characters with a generated session id) and job ids
``job-<time>-<hex>``: nobody types them whole. Every verb that takes a key or a job id resolves
its word here, so every verb matches the same way: the exact name first, then a unique prefix (of
the name, or of the session id inside a key), then an agent id naming exactly one entry. More
than one candidate is refused with the candidates listed (exit 2); none is ``not found`` (exit 3).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable

import attrs

from ..errors import Ambiguous, ContractError, JobNotFound, NotFound, RunNotFound
from ..identity import ID_PATTERN, parse_key, validate_id
from ..matrix.statedir import is_key
from ..matrix.store import MatrixStore
from .render import ELLIPSIS

__all__ = ["Kind", "Named", "candidates", "resolve", "resolve_job", "resolve_key"]


class Kind(enum.Enum):
    ENTRY = "entry"
    JOB = "job"
    RUN = "run"


@attrs.frozen
class Named:
    """What a typed word resolved to: an entry key or a job id."""

    kind: Kind
    name: str


def _job_ids(store: MatrixStore) -> list[str]:
    from ..dispatch.jobs import JobStore

    return JobStore(store).jobs.names()


def _run_ids(store: MatrixStore) -> list[str]:
    from ..fork import RunStore

    return RunStore(store).records.names()


def candidates(store: MatrixStore, kinds: Iterable[Kind]) -> list[str]:
    """Every name of ``kinds`` in the state dir, sorted (what shell completion offers)."""
    found: list[str] = []
    for kind in kinds:
        if kind is Kind.ENTRY:
            found += store.keys()
        else:
            found += _job_ids(store) if kind is Kind.JOB else _run_ids(store)
    return sorted(found)


def _prefixed(word: str, name: str, kind: Kind) -> bool:
    if name.startswith(word):
        return True
    # A key's session id alone (`show 7b31`) names it too: the role is seldom in doubt.
    return kind is Kind.ENTRY and parse_key(name)[1].startswith(word)


def resolve(store: MatrixStore, word: str, kinds: tuple[Kind, ...], field: str) -> Named:
    """The one thing ``word`` names among ``kinds``: exact name, else unique prefix, else (for
    entries) the one entry whose agent id it is. :class:`Ambiguous` (exit 2) for several,
    ``not found`` (exit 3) for none, an invalid-id error (exit 2) when it could name nothing."""
    # A name as a table shows it (its unique prefix and an ellipsis), pasted back, is that prefix.
    word = word.removesuffix(ELLIPSIS)
    if not word:
        raise ContractError(field, "empty", "name an entry key, a job id, or a unique prefix of one")
    names = {kind: candidates(store, (kind,)) for kind in kinds}
    for kind in kinds:
        if word in names[kind]:
            return Named(kind, word)
    if Kind.JOB in kinds:
        launched = _launch_key_job(word)
        if launched is not None and launched in names[Kind.JOB]:
            return Named(Kind.JOB, launched)
    matches = [Named(kind, name) for kind in kinds for name in names[kind] if _prefixed(word, name, kind)]
    if not matches and Kind.ENTRY in kinds:
        matches = [
            Named(Kind.ENTRY, entry.key) for entry in store.list().entries if entry.identity.agent_id == word
        ]
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise Ambiguous(field, word, [m.name for m in matches])
    return _not_found(word, kinds, field)


def _launch_key_job(word: str) -> str | None:
    from ..dispatch.request import launch_job_id

    try:
        return launch_job_id(word)
    except ContractError:
        return None


def _not_found(word: str, kinds: tuple[Kind, ...], field: str) -> Named:
    if kinds == (Kind.RUN,):
        validate_id(word, field)
        raise RunNotFound(word)
    if Kind.ENTRY in kinds and (is_key(word) or Kind.JOB not in kinds):
        if not is_key(word) and ID_PATTERN.fullmatch(word) is None:
            parse_key(word)  # the allowlist's own error: exit 2, naming the fix
        raise NotFound(word)
    if ID_PATTERN.fullmatch(word) is None and _launch_key_job(word) is None:
        raise ContractError(
            field, f"{word[:90]!r} is not a job id", "give a job id ('pi-matrix jobs' lists them)"
        )
    raise JobNotFound(word)


def resolve_key(store: MatrixStore, word: str, field: str = "KEY") -> str:
    """The entry key ``word`` names (see :func:`resolve`)."""
    return resolve(store, word, (Kind.ENTRY,), field).name


def resolve_job(store: MatrixStore, word: str, field: str = "ID") -> str:
    """The job id ``word`` names (see :func:`resolve`)."""
    return resolve(store, word, (Kind.JOB,), field).name
