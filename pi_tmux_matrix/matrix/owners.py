"""Which master an owner command acts for: the nearest registered ancestor, or the one named.

Below supervise/ and dispatch/ alike: both the dispatcher (``fire``'s parent) and the owner verbs
(``adopt``, ``resume``, ``top``) resolve the owning master the same way.
"""

from __future__ import annotations

from collections.abc import Iterable

from .. import procs
from ..errors import ContractError, NoMaster, PiMatrixError
from ..identity import ProcessIdentity, Role, entry_key, validate_id
from .model import Entry, Status
from .store import MatrixStore

__all__ = ["calling_master", "master_entry", "masters_of", "owning_master", "require_master"]


def calling_master(store: MatrixStore) -> tuple[ProcessIdentity, str] | None:
    """The nearest ancestor process registered as a live master, with its session id."""
    masters = {
        (e.pid, e.proc_start): e.identity.session_id
        for e in store.list().entries
        if e.role is Role.MASTER and e.pid is not None and e.status not in (Status.TERMINAL, Status.CLOSED)
    }
    for ancestor in procs.ancestors():
        session = masters.get((ancestor.pid, ancestor.start_ticks))
        if session is not None:
            return ancestor, session
    return None


def owning_master(
    store: MatrixStore, parent_pid: int | None, parent_session: str | None, *, registered: bool = True
) -> tuple[ProcessIdentity, str] | None:
    """The master an owner command acts for: ``--parent-pid``/``--parent-session`` when given
    (both; a live process registered as a running master of that session), else the calling
    master; None when there is none.

    ``registered=False`` (a dry run, the matrix off) lets a live pid no master registered pass:
    nothing will be started under it. A pid that is a registered master must still be named with
    its own session."""
    if parent_pid is None and parent_session is None:
        return calling_master(store)
    if parent_pid is None or parent_session is None:
        raise ContractError("--parent-pid/--parent-session", "only one was given", "give both, or neither")
    master = procs.identify(parent_pid)
    if master is None:
        raise ContractError("--parent-pid", f"no live process {parent_pid}", "name the live master process")
    session = validate_id(parent_session, "--parent-session")
    sessions = _sessions_of(store, master, session)
    if not sessions and registered:
        # A worker counts a parent that is no running master lost at its first looks
        # (docs/decisions.md#a-parent-must-be-a-live-master): it would wind down as soon as it started.
        raise ContractError(
            "--parent-pid",
            f"process {parent_pid} is not a running master of this matrix",
            "name the pid of a live 'pi-matrix master' (pi-matrix ls shows them), or run this under one",
        )
    if sessions and session not in sessions:
        # A worker recorded under a session its parent does not have is nobody's: no master of
        # that session is there to take its handoff, recover it, or see it in its tree.
        raise ContractError(
            "--parent-session",
            f"{session!r} is not the session of the master at pid {parent_pid} ({', '.join(sessions)})",
            f"pass --parent-session {sessions[0]}, or the pid of the master of {session!r}",
        )
    return master, session


def masters_of(entries: Iterable[Entry], process: ProcessIdentity) -> list[Entry]:
    """The running master entries of exactly this process, by pid and start time (two only for
    the instant of a session switch, which re-keys a master under the same process)."""
    return [
        e
        for e in entries
        if e.role is Role.MASTER
        and e.status is Status.RUNNING
        and (e.pid, e.proc_start) == (process.pid, process.start_ticks)
    ]


def master_entry(store: MatrixStore, process: ProcessIdentity, session: str) -> Entry | None:
    """The running master entry of ``process`` under ``session``'s key, read alone (one file,
    where a listing reads every entry: a fire at 100 agents read the state dir three times);
    None if that key is not this process's running master, or cannot be read."""
    try:
        found = store.find(entry_key(Role.MASTER, session))
    except PiMatrixError:
        return None  # a corrupt or unsafe file: the listing decides, as it always did
    return found if found is not None and masters_of([found], process) else None


def _sessions_of(store: MatrixStore, master: ProcessIdentity, session: str) -> list[str]:
    """The sessions ``master`` runs as: the one named, read by its key, when it is; else every
    one (a listing), so a wrong session is still told which are right."""
    if master_entry(store, master, session) is not None:
        return [session]
    return sorted(e.identity.session_id for e in masters_of(store.list().entries, master))


def require_master(
    found: tuple[ProcessIdentity, str] | None, verb: str = "this command"
) -> tuple[ProcessIdentity, str]:
    """``found``, or the error that says how to get a master (exit 1 from every verb)."""
    if found is None:
        raise NoMaster(verb)
    return found
