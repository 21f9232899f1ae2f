// Master mode: the tmux_agent_manager tool and handoff injection: see issue 8.
export function installMaster(_pi: any): void {}
