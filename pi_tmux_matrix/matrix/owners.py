"""Which master an owner command acts for: the nearest registered ancestor, or the one named.

Below supervise/ and dispatch/ alike: both the dispatcher (``fire``'s parent) and the owner verbs
(``adopt``, ``resume``, ``top``) resolve the owning master the same way.
"""

from __future__ import annotations

from .. import procs
from ..errors import ContractError
from ..identity import ProcessIdentity, Role, validate_id
from .model import Status
from .store import MatrixStore

__all__ = ["calling_master", "owning_master", "require_master"]


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
    store: MatrixStore, parent_pid: int | None, parent_session: str | None
) -> tuple[ProcessIdentity, str] | None:
    """The master an owner command acts for: ``--parent-pid``/``--parent-session`` when given
    (both, a live pid; when that pid is a registered master, the session must be its own), else
    the calling master; None when there is none."""
    if parent_pid is None and parent_session is None:
        return calling_master(store)
    if parent_pid is None or parent_session is None:
        raise ContractError("--parent-pid/--parent-session", "only one was given", "give both, or neither")
    master = procs.identify(parent_pid)
    if master is None:
        raise ContractError("--parent-pid", f"no live process {parent_pid}", "name the live master process")
    session = validate_id(parent_session, "--parent-session")
    registered = _registered_sessions(store, master)
    if registered and session not in registered:
        # A worker recorded under a session its parent does not have is nobody's: no master of
        # that session is there to take its handoff, recover it, or see it in its tree.
        names = ", ".join(registered)
        raise ContractError(
            "--parent-session", f"{session!r} is not the session of the master at pid {parent_pid} ({names})",
            f"pass --parent-session {registered[0]}, or the pid of the master of {session!r}",
        )  # fmt: skip
    return master, session


def _registered_sessions(store: MatrixStore, master: ProcessIdentity) -> list[str]:
    """The session ids this live process is registered as a master of (more than one only
    between a session switch's two writes)."""
    return sorted(
        e.identity.session_id
        for e in store.list().entries
        if e.role is Role.MASTER
        and (e.pid, e.proc_start) == (master.pid, master.start_ticks)
        and e.status not in (Status.TERMINAL, Status.CLOSED)
    )


def require_master(found: tuple[ProcessIdentity, str] | None) -> tuple[ProcessIdentity, str]:
    """``found``, or the error that says how to get a master."""
    if found is None:
        raise ContractError(
            "parent", "no calling master found",
            "run it under 'pi-matrix master', or pass --parent-pid and --parent-session",
        )  # fmt: skip
    return found
