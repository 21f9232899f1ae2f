"""What ``top``'s keys a, c, r and s do: the question each asks, and the same code as its CLI verb.

Adopt and resume need a master to own the worker. Under a master (or with ``--parent-pid`` and
``--parent-session``) it is that one; elsewhere top offers the running masters of the matrix, as
``adopt KEY --parent-pid P --parent-session S`` accepts any of them, and says how to get one when
there is none.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import attrs

from .. import procs
from ..identity import ProcessIdentity, Role
from ..matrix.model import Entry, Status
from ..matrix.store import MatrixStore, now_ms

__all__ = ["Acts", "Asked"]

Asked = str | tuple[str, dict[str, Callable[[], str]]]  # a refusal, or a question and its answers
SENDER = "pi-matrix top"


@attrs.frozen
class Owner:
    process: ProcessIdentity
    session: str

    @property
    def key(self) -> str:
        return f"master-{self.session}"


class Acts:
    def __init__(self, store: MatrixStore, owner: tuple[ProcessIdentity, str] | None) -> None:
        self.store = store
        self.owner = Owner(*owner) if owner else None

    def masters(self) -> list[Owner]:
        """Who may own an adopted or resumed worker: the master top runs for, else every running
        master of the matrix that is alive."""
        if self.owner is not None:
            return [self.owner]
        return [
            Owner(e.process, e.identity.session_id)
            for e in self.store.list().entries
            if e.role is Role.MASTER
            and e.status is Status.RUNNING
            and e.process
            and procs.is_alive(e.process)
        ]

    def question(self, verb: str, entry: Entry, shown: Callable[[str], str]) -> Asked:
        key = shown(entry.key)
        who = f"{key} (lane {entry.identity.lane or '-'})"
        if verb == "c":
            return f"clean up {who} gracefully? y/N", {"y": lambda: self.cleanup(entry, key)}
        if verb == "s":
            if not procs.is_alive(entry.process):
                return f"{key}: its host is not running, so there is nothing to stop"
            return f"stop {who} (request, then SIGTERM, then SIGKILL)? y/N", {
                "y": lambda: self.stop(entry, key)
            }
        if verb == "a" and entry.status in (Status.TERMINAL, Status.CLOSED):
            return f"{key} is {entry.status.value}: only a live or resumable worker can be adopted"
        if verb == "r" and (procs.is_alive(entry.process) or entry.status is not Status.RESUMABLE):
            return f"{key}: only a dead resumable worker is resumed (adopt a live one with a)"
        word, act = ("adopt", self.adopt) if verb == "a" else ("resume", self.resume)
        masters = self.masters()
        if not masters:
            return (
                f"{word} needs a running master to own {key} and none is: start one with "
                f"'pi-matrix master', or start top under one or with --parent-pid PID --parent-session ID"
            )
        if len(masters) == 1:
            (master,) = masters
            text = f"{word} {who} into {shown(master.key)} (pid {master.process.pid})? y/N"
            return text, {"y": lambda: act(entry, master, key)}
        offered = masters[:9]
        choices = "  ".join(f"{n} {shown(m.key)} (pid {m.process.pid})" for n, m in enumerate(offered, 1))
        answers: dict[str, Callable[[], str]] = {
            str(n): functools.partial(act, entry, m, key) for n, m in enumerate(offered, 1)
        }
        return f"{word} {who} into which master? {choices}  (any other key cancels)", answers

    def adopt(self, entry: Entry, master: Owner, key: str) -> str:
        from ..matrix.owners import owning_master
        from ..supervise.master import grant

        # The CLI verb's own check of the master named: still alive, still a running master.
        owning_master(self.store, master.process.pid, master.session)
        # One grant wins: a refusal names the master whose grant did (shown as an error).
        grant(self.store, entry, master.process, master.session, SENDER)
        return f"adoption granted: {key} -> {master.key}"

    def resume(self, entry: Entry, master: Owner, key: str) -> str:
        from ..dispatch.model import Relaunch
        from ..dispatch.plugins import plugin_manager
        from ..matrix.owners import owning_master
        from .dispatch import default_socket

        owning_master(self.store, master.process.pid, master.session)
        request = Relaunch(
            entry=entry,
            parent=master.process,
            parent_session=master.session,
            state_dir=str(self.store.root),
            socket=default_socket(),
        )
        pid = plugin_manager().hook.relaunch(request=request)
        return f"resumed {key}: host pid {pid}"

    def cleanup(self, entry: Entry, key: str) -> str:
        from ..matrix import lifecycle
        from ..supervise.master import handshake

        session = self.owner.session if self.owner else None
        handshake(self.store, entry, lambda e: lifecycle.request_cleanup(e, session, now_ms()), SENDER)
        return f"cleanup requested: {key}"

    def stop(self, entry: Entry, key: str) -> str:
        from ..matrix.mailbox import Inbox

        Inbox(self.store, entry.key).post("stop", sender=SENDER, to=entry.registration)
        return f"stop requested: {key}"
