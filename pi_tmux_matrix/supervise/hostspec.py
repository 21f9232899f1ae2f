"""What a host is told before it starts: its :class:`HostSpec` (the agent, its identity and
contract, how it runs)."""

from __future__ import annotations

import attrs

from ..identity import AgentIdentityContract, Mode, ProcessIdentity, Role
from ..launch_contract import LaunchContract

__all__ = ["HostSpec"]


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
