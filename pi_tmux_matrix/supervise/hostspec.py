"""What a host is told before it starts: its :class:`HostSpec` (the agent, its identity and
contract, how it runs) and its :class:`HostHooks` (what the program above adds: a master's
activation and delivery, the rounds' wakes)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs

from ..contract import LaunchContract
from ..identity import AgentIdentityContract, Mode, ProcessIdentity, Role
from ..matrix.model import Entry

if TYPE_CHECKING:
    from .host import AgentHost

__all__ = ["HostHooks", "HostSpec"]


@attrs.frozen(kw_only=True)
class HostSpec:
    """Everything the host needs to know before it starts."""

    argv: tuple[str, ...]
    identity: AgentIdentityContract
    contract: LaunchContract
    mode: Mode = Mode.INTERACTIVE
    task_summary: str = ""
    deadline_s: float | None = None
    stop_grace_s: float = 3.0
    rpc_prompt: str | None = None
    role: Role | None = None  # None: worker iff the contract declares a valid parent
    # Rehosting: the live agent of a dead host, taken over instead of starting ``argv``, and the
    # generation of the launcher's claim on the entry (the registration is fenced by it).
    take_over: ProcessIdentity | None = None
    claim: str | None = None
    rounds_watched: bool = False  # a job's watcher reports the agent's marker rounds (supervise/rounds)


@attrs.define
class HostHooks:
    """Extension points the master uses (activation, delivery on every tick)."""

    on_registered: Callable[[AgentHost], None] | None = None
    on_tick: Callable[[AgentHost], None] | None = None
    on_switch: Callable[[AgentHost, str], None] | None = None
    # The agent's session shut down (its child ended): what depends on it is ended too, e.g. its
    # running fork runs (docs/decisions.md#a-fork-stops-with-its-parent-session); fork/ sits
    # above supervise/, so the program wires it in.
    on_agent_end: Callable[[AgentHost], None] | None = None
    # Sees the record the first registration replaces, under its lock; raising refuses it.
    may_register: Callable[[Entry | None], None] | None = None
    # After each look at the inbox (new mail, at once with inotify): e.g. a handoff pi took.
    on_wake: Callable[[AgentHost], None] | None = None
