"""The matrix as the dispatcher's default plugin.

On every launch it injects the env contract (``PI_PARENT_PID``, ``PI_PARENT_SESSION``,
``PI_ORCHESTRATION_AGENT_ID``, ``PI_TASK_REF``, ``PI_WORKER_ALLOWED_PATHS`` and, on a lane,
``PI_WORKTREE_LANE``) from the compiled, immutable launch
(docs/decisions.md#one-contract-between-launcher-and-agent); and it provides the exact-session
relaunch of a dead worker (:func:`pi_tmux_matrix.recovery.relaunch`). With
``processMatrix.enabled: false`` it is simply not registered.
"""

from __future__ import annotations

from .contract import ENV_PROJECT_TRUST
from .dispatch.hookspecs import hookimpl
from .dispatch.model import AgentLaunch, Relaunch
from .launch_contract import LaunchContract

__all__ = ["MatrixPlugin", "matrix_plugin"]


class MatrixPlugin:
    """Hook implementations of the matrix (registered as ``matrix``)."""

    @hookimpl
    def launch_env(self, launch: AgentLaunch) -> dict[str, str]:
        contract = LaunchContract(
            parent_pid=launch.parent.pid,
            parent_start=launch.parent.start_ticks,
            parent_session=launch.parent_session,
            agent_id=launch.agent_id,
            task_ref=launch.task_ref,
            allowed_paths=launch.allowed_paths,
            worktree_lane=launch.lane,
        )
        env = contract.to_env()
        if getattr(launch.profile, "provider", None) == "pi":
            # A worker never trusts the project's .pi/ (see dispatch/providers.py): the bridge
            # answers pi's project_trust event "no" where the --no-approve flag could not be given.
            env[ENV_PROJECT_TRUST] = "no"
        return env

    @hookimpl
    def launch_argv(self, launch: AgentLaunch) -> list[str] | None:
        """Every pi agent loads the bridge: pi's real session identity, mailbox notices, result
        artifacts and a graceful SIGTERM (the stand-in accepts and ignores ``-e``)."""
        if getattr(launch.profile, "provider", None) != "pi":
            return None
        from .bridge import bridge_path

        return ["-e", str(bridge_path())]

    @hookimpl
    def relaunch(self, request: Relaunch) -> int:
        from .recovery import relaunch

        return relaunch(request)


# What the ``matrix`` entry point names (pyproject.toml): the dispatcher registers it like any other
# plugin, so dispatch/ never imports this layer above it.
matrix_plugin = MatrixPlugin()
