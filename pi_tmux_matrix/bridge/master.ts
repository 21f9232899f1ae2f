// Master mode: the master's own pi drives the dispatcher
// (docs/decisions.md#the-masters-pi-drives-the-dispatcher-through-the-cli).
//
//   * the `tmux_agent_manager` tool: each action runs the pi-matrix CLI with an argv list and
//     --json (never a shell string) and returns a bounded summary; a CLI error comes back as a
//     tool error carrying the CLI's one-line message in the tool's words (toolwords.ts: the
//     parameter, never the flag);
//   * launches carry this master's registration: the host's pid (PI_MATRIX_HOST_PID) and the
//     session id the host is registered under (pi's own session id), never a guess from the
//     process tree;
//   * terminal handoffs: the host posts each undelivered handoff as a "handoff" notice; it is
//     injected once as a custom message of type "pi-matrix-handoff" carrying the handoff's id
//     (a turn when idle, one at a time; pi's follow-up queue when busy: delivery.ts) and
//     acknowledged to the host only once pi's conversation has it. A handoff already in the
//     session (a restart after pi took it, before the host heard) is acknowledged, not injected
//     again. A handoff addressed to another session (after /new, /resume, /fork) is left for
//     that session;
//   * at session start in interactive pi, the foreign orphans are asked about in pi's own UI
//     (resume / adopt / clean up / leave) and the answer is carried out through the CLI; without
//     a UI (print, rpc) they are only reported
//     (docs/decisions.md#exact-orphans-are-recovered-without-asking).
import { Type } from "typebox";
import { type Cli, cliError, runCli, runCliAsync } from "./cli.ts";
import { TRUNCATED, debug, env, post, role, truncate } from "./common.ts";
import type { Delivery, Mode } from "./delivery.ts";
import type { ExtensionAPI, ExtensionContext, ToolResult } from "./pi-api.d.ts";
import { toolWords } from "./toolwords.ts";

const MAX_RESULT = 6000; // characters of CLI output returned to the model
const STOP_WORD = "yes-tmux-stop";
export const HANDOFF_TYPE = "pi-matrix-handoff"; // the custom message type of a worker's handoff
const ACTIONS = [
  "status",
  "setup_help",
  "guard",
  "list_profiles",
  "fire_task",
  "job_status",
  "list_jobs",
  "send_followup",
  "dismiss",
  "stop_job",
  "set_variable",
  "list_variables",
  "list_templates",
  "show_template",
  "stop_session",
  "notify",
  "set_status",
  "clear_status",
  "workspace_plan",
  "launch_workspace",
] as const;

function bounded(text: string, limit: number = MAX_RESULT): string {
  return truncate(text, limit, TRUNCATED);
}

function compact(out: string): string {
  try {
    return JSON.stringify(JSON.parse(out));
  } catch (error) {
    debug("master: the CLI's output is not JSON (shown as it is)", error);
    return out.trim();
  }
}

function text(value: string): ToolResult {
  return { content: [{ type: "text", text: bounded(value) }], details: {} };
}

/** A parameter by the origin's camelCase name, or today's snake_case alias. */
function pick(params: any, name: string, alias?: string): any {
  return params[name] !== undefined ? params[name] : alias ? params[alias] : undefined;
}

/** The first given of a parameter's names: ours, then the origin's (set_variable's variableName…). */
function pickAny(params: any, ...names: string[]): any {
  return names.map((name) => params[name]).find((value) => value !== undefined);
}

function needAny(params: any, ...names: string[]): string {
  const value = pickAny(params, ...names);
  if (typeof value !== "string" || value.trim() === "") {
    throw new Error(`tmux_agent_manager: ${params.action} needs "${names[0]}" (or ${names.slice(1).map((n) => `"${n}"`).join(", ")})`);
  }
  return value;
}

/** notify's one line: message (text), else the origin's "title: body". */
function noticeOf(params: any): string {
  const given = pickAny(params, "message", "text");
  if (given !== undefined || (params.title === undefined && params.body === undefined)) return needAny(params, "message", "text", "body");
  return `${params.title || "Pi"}: ${params.body || "Pi needs attention"}`;
}

const STATUS_KEY = "pi-agents"; // the origin's default statusKey

function need(params: any, name: string, alias?: string): string {
  const value = pick(params, name, alias);
  if (typeof value !== "string" || value.trim() === "") {
    throw new Error(`tmux_agent_manager: ${params.action} needs "${name}"`);
  }
  return value;
}

const MIN_DEADLINE_S = 5;
const MAX_DEADLINE_S = 86400; // request.MAX_DEADLINE_S

/** fire_task's argv (before "--"), every parameter checked here so a bad one names itself. */
function fireArgs(params: any): string[] {
  const args = ["fire"];
  const team = pick(params, "teamTemplate", "team");
  const agents = params.agents;
  if (agents !== undefined) {
    // Each entry goes to the CLI as one JSON word; the CLI checks it as it checks a profile.
    if (!Array.isArray(agents) || agents.length === 0 || agents.some((a: any) => !a || typeof a !== "object" || Array.isArray(a))) {
      throw new Error('tmux_agent_manager: agents must be a non-empty list of objects like {"provider": "pi", "name": "lead"}');
    }
    if (team || params.profile) {
      throw new Error("tmux_agent_manager: give agents, teamTemplate or profile, not several; agents name their own CLIs");
    }
    for (const agent of agents) args.push("--agent", JSON.stringify(agent));
  } else if (team) args.push("--team", String(team));
  else args.push("--profile", need(params, "profile"));
  if (params.lane) args.push("--lane", String(params.lane));
  const goal = pick(params, "goalId", "goal_id");
  if (goal) args.push("--goal-id", String(goal));
  const path = pick(params, "path", "cwd"); // the origin's name is cwd
  if (path) args.push("--path", String(path));
  const deadline = pick(params, "deadlineSeconds", "deadline");
  if (deadline !== undefined) {
    if (typeof deadline !== "number" || !Number.isFinite(deadline) || deadline < MIN_DEADLINE_S || deadline > MAX_DEADLINE_S) {
      throw new Error(
        `tmux_agent_manager: deadlineSeconds ${JSON.stringify(deadline)} is not a number of seconds from ` +
          `${MIN_DEADLINE_S} to ${MAX_DEADLINE_S}; give one, or leave it out for the profile's deadline`,
      );
    }
    args.push("--deadline", String(deadline));
  }
  const key = pick(params, "launchKey", "launch_key");
  if (key !== undefined) args.push("--launch-key", String(key));
  if (params.force === true) args.push("--force");
  const workspace = pick(params, "workspaceName", "workspace");
  if (workspace !== undefined) args.push("--workspace", String(workspace));
  if (pick(params, "dryRun", "dry_run") === true) args.push("--dry-run");
  return args;
}

const ID = /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/; // identity.ID_PATTERN
const SESSION_NAME = /^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$/; // tmux_model._SESSION

/** workspace_plan's and launch_workspace's argv (before "--"): a template's agents as the panes of
 * a fresh tmux session, interactive and unwatched; every parameter checked here names itself. */
function workspaceArgs(params: any): string[] {
  const template = pickAny(params, "teamTemplate", "team", "templateName");
  if (typeof template !== "string" || template.trim() === "") {
    throw new Error(
      `tmux_agent_manager: ${params.action} needs "teamTemplate" (or "team", "templateName"): the team template ` +
        "whose agents get a pane each (list_templates lists them)",
    );
  }
  const name = pickAny(params, "workspaceName", "sessionName");
  if (typeof name !== "string" || name.trim() === "") {
    throw new Error(
      `tmux_agent_manager: ${params.action} needs "workspaceName" (or "sessionName"): the new tmux session to open`,
    );
  }
  if (!ID.test(template)) {
    throw new Error(
      `tmux_agent_manager: teamTemplate ${JSON.stringify(template.slice(0, 80))} is not a template name; ` +
        "give one list_templates lists (letters, digits, . _ -)",
    );
  }
  if (!SESSION_NAME.test(name)) {
    throw new Error(
      `tmux_agent_manager: workspaceName ${JSON.stringify(name.slice(0, 80))} is not a tmux session name; ` +
        "use 1-128 characters from A-Z a-z 0-9 _ - starting with a letter or digit",
    );
  }
  const args = ["workspace", template, "--name", name];
  if (params.lane) args.push("--lane", String(params.lane));
  const goal = pick(params, "goalId", "goal_id");
  if (goal) args.push("--goal-id", String(goal));
  const path = pick(params, "path", "cwd");
  if (path) args.push("--path", String(path));
  const key = pick(params, "launchKey", "launch_key");
  if (key !== undefined) args.push("--launch-key", String(key));
  if (params.force === true) args.push("--force");
  if (params.action === "workspace_plan" || pick(params, "dryRun", "dry_run") === true) args.push("--dry-run");
  return args;
}

/** A stop's preview: the CLI exits 2 saying "nothing was stopped" after printing what it would
 * stop. Any other failure (a bad name is exit 2 too) is the error it is, never an empty preview. */
function previewOf(result: Cli): string {
  const said = cliError(result).message;
  const previewed = result.code === 2 && said.startsWith("pi-matrix: error: nothing was stopped;");
  if (result.code !== 0 && !previewed) throw cliError(result);
  return result.out.trim();
}

/** `pi-matrix setup-help --json`: whether tmux is here, and what to do next (the tool's setup_help
 * and the /tmux-agents command say the same). */
function setupHelp(cwd?: string): { available: boolean; text: string } {
  const result = runCli(["setup-help", "--json"], cwd);
  if (result.code !== 0) throw cliError(result);
  const help = JSON.parse(result.out);
  return { available: Boolean(help.available), text: String(help.text) };
}

/** The handoff ids already in a session's conversation (a previous pi of it took them). */
function handoffsIn(ctx: ExtensionContext | null): Set<string> {
  const ids = new Set<string>();
  try {
    for (const entry of ctx?.sessionManager?.getEntries?.() || []) {
      const id = entry?.type === "custom_message" && entry.customType === HANDOFF_TYPE && entry.details?.id;
      if (typeof id === "string") ids.add(id);
    }
  } catch (error) {
    debug("master: the handoffs in the session", error);
    // an unreadable session: nothing is known to be there
  }
  return ids;
}

export function installMaster(pi: ExtensionAPI, delivery: Delivery): void {
  if (role() !== "master") return;
  const hostPid = env.PI_MATRIX_HOST_PID || "";
  let ctxRef: ExtensionContext | null = null;
  let taken = new Set<string>(); // handoff ids pi's conversation has

  function sessionId(): string {
    // The host follows pi's session id (a switch re-registers it), so this is its registration.
    return String(ctxRef?.sessionManager?.getSessionId?.() || env.PI_MATRIX_KEY?.slice("master-".length) || "");
  }

  function call(args: string[], cwd?: string): string {
    const result = runCli(args, cwd);
    if (result.code !== 0) throw cliError(result);
    return compact(result.out);
  }

  async function execute(id: string, params: any, signal: AbortSignal | undefined, update: unknown, ctx: ExtensionContext | null): Promise<ToolResult> {
    try {
      return await act(id, params, signal, update, ctx);
    } catch (error: any) {
      throw new Error(toolWords(String(params?.action || ""), String(error?.message || error)));
    }
  }

  async function act(_id: string, params: any, _signal: AbortSignal | undefined, _update: unknown, ctx: ExtensionContext | null): Promise<ToolResult> {
    ctxRef = ctx || ctxRef;
    const action = String(params.action || "");
    const cwd = ctx?.cwd;
    switch (action) {
      case "status":
        return text(call(["status", "--json"], cwd));
      case "setup_help":
        return text(setupHelp(cwd).text);
      case "guard": {
        // Diagnostic only: a closed route is an answer (exit 1), not a tool error.
        const result = runCli(["guard", "--json"], cwd);
        if (result.code !== 0 && result.code !== 1) throw cliError(result);
        const guard = JSON.parse(result.out);
        return text(`allowed: ${Boolean(guard.allowed)}\n${String(guard.text)}`);
      }
      case "list_profiles":
        return text(call(["profiles", "--json"], cwd));
      case "list_jobs":
        // usage: the totals workers claimed (advisory), per job and per master, instead of the jobs.
        return text(call(params.usage === true ? ["jobs", "--usage", "--json"] : ["jobs", "--json"], cwd));
      case "job_status":
        return text(call(["job", need(params, "jobId", "job_id"), "--json"], cwd));
      case "dismiss":
        return text(call(["dismiss", need(params, "jobId", "job_id"), "--json"], cwd));
      case "send_followup": {
        const args = ["followup", need(params, "jobId", "job_id"), "--json"];
        const agent = pickAny(params, "agent", "agentId");
        if (agent) args.push("--agent", String(agent));
        return text(call([...args, "--", needAny(params, "text", "task", "body")], cwd));
      }
      case "fire_task": {
        const args = fireArgs(params);
        args.push("--json", "--parent-pid", hostPid, "--parent-session", sessionId());
        // The task is one argv word after "--": it reaches the worker exactly as the model wrote it
        // ("body" is the origin's fallback name for it).
        const task = params.task !== undefined ? need(params, "task") : need(params, "body");
        return text(call([...args, "--", task], cwd));
      }
      case "workspace_plan":
      case "launch_workspace": {
        const args = [...workspaceArgs(params), "--json", "--parent-pid", hostPid, "--parent-session", sessionId()];
        // The task is optional: without one the agents start idle, waiting for you in their panes.
        const task = pickAny(params, "task", "body");
        if (task !== undefined && typeof task !== "string") throw new Error("tmux_agent_manager: task must be text; give it as a string, or leave it out for idle agents");
        return text(call(task && task.trim() ? [...args, "--", task] : args, cwd));
      }
      case "set_variable": {
        const name = needAny(params, "name", "variableName");
        const value = pickAny(params, "value", "variableValue", "body", "status");
        if (typeof value !== "string") throw new Error('tmux_agent_manager: set_variable needs "value" (a string)');
        return text(call(["var", need(params, "jobId", "job_id"), name, value, "--json"], cwd));
      }
      case "stop_session": {
        const name = need(params, "sessionName", "workspaceName");
        if (params.confirm !== STOP_WORD) {
          return text(
            `PREVIEW ONLY, nothing was stopped.\n${previewOf(runCli(["stop-session", name], cwd))}\n` +
              `To stop them, call stop_session again with confirm: "${STOP_WORD}".`,
          );
        }
        return text(call(["stop-session", name, "--confirm", STOP_WORD, "--json"], cwd));
      }
      case "notify":
        return text(call(["notify", need(params, "sessionName", "workspaceName"), "--", noticeOf(params)], cwd));
      case "set_status": {
        const key = String(pickAny(params, "key", "statusKey") ?? STATUS_KEY);
        const value = needAny(params, "value", "status", "body");
        return text(call(["set-status", need(params, "sessionName", "workspaceName"), key, value], cwd));
      }
      case "clear_status": {
        const key = String(pickAny(params, "key", "statusKey") ?? STATUS_KEY);
        return text(call(["set-status", need(params, "sessionName", "workspaceName"), key], cwd));
      }
      case "list_templates":
        return text(call(["templates", "--json"], cwd));
      case "show_template":
        return text(call(["templates", needAny(params, "templateName", "name", "teamTemplate", "title"), "--json"], cwd));
      case "list_variables":
        return text(call(["var", need(params, "jobId", "job_id"), "--json"], cwd));
      case "stop_job": {
        const job = need(params, "jobId", "job_id");
        if (params.confirm !== STOP_WORD) {
          return text(
            `PREVIEW ONLY, nothing was stopped.\n${previewOf(runCli(["stop", job], cwd))}\n` +
              `To stop it, call stop_job again with confirm: "${STOP_WORD}".`,
          );
        }
        return text(call(["stop", job, "--confirm", STOP_WORD, "--json"], cwd));
      }
      default:
        throw new Error(`tmux_agent_manager: unknown action "${action}"; use one of ${ACTIONS.join(", ")}`);
    }
  }

  pi.registerTool({
    name: "tmux_agent_manager",
    label: "Agent manager",
    description:
      "Launch and manage worker agents in tmux through pi-matrix. Actions: status (tmux here, its server, " +
      "your session, the matrix summary), setup_help, guard (diagnostic only), " +
      "list_profiles, fire_task (profile, teamTemplate or agents[], and task; optional lane, goalId, path, deadlineSeconds, " +
      "launchKey, force, workspaceName, dryRun), job_status (jobId), list_jobs (usage), send_followup (jobId, text, " +
      `optional agent), dismiss (jobId), stop_job (jobId; previews unless confirm is "${STOP_WORD}"), ` +
      "set_variable (jobId, name, value), list_variables (jobId), list_templates, " +
      `show_template (templateName), stop_session (sessionName; previews unless confirm is "${STOP_WORD}"), ` +
      "notify (sessionName, message), set_status (sessionName, key, value), clear_status (sessionName, key), " +
      "workspace_plan (teamTemplate, workspaceName; optional task, path, lane, goalId: shows the panes, starts nothing), " +
      "launch_workspace (the same: the template's agents as interactive panes of a new tmux session, unwatched). " +
      "snake_case names (job_id, goal_id, dry_run, team, deadline) are accepted too.",
    promptSnippet: "Launch and manage worker agents (pi-matrix dispatcher)",
    parameters: Type.Object({
      action: Type.String({ description: ACTIONS.join(" | ") }),
      profile: Type.Optional(Type.String({ description: "fire_task: a launch profile" })),
      teamTemplate: Type.Optional(
        Type.String({ description: "fire_task: a team template instead of a profile; workspace_plan, launch_workspace: the template" }),
      ),
      team: Type.Optional(Type.String({ description: "alias of teamTemplate" })),
      agents: Type.Optional(
        Type.Array(
          Type.Object({
            provider: Type.Optional(Type.String({ description: "pi | claude | codex | opencode | agy | custom (default custom)" })),
            name: Type.Optional(Type.String({ description: "the agent's name (its id suffix)" })),
            command: Type.Optional(
              Type.String({ description: "the CLI to start, as words (never run by a shell); default the provider's" }),
            ),
            path: Type.Optional(Type.String({ description: "its working directory (pi: its file tools stay in it)" })),
            cwd: Type.Optional(Type.String({ description: "its working directory, nothing narrowed (the origin's legacy)" })),
            tools: Type.Optional(Type.Array(Type.String(), { description: "pi only: its tools" })),
            resourceProfile: Type.Optional(Type.String({ description: "pi only: a resource profile id" })),
            thinkingLevel: Type.Optional(Type.String({ description: "pi only: off|minimal|low|medium|high|xhigh" })),
            worktreeLane: Type.Optional(Type.String({ description: "run in this git worktree lane (pi, custom)" })),
          }),
          { description: "fire_task: ad-hoc agents without a profile file, instead of profile or teamTemplate" },
        ),
      ),
      task: Type.Optional(
        Type.String({ description: "fire_task: the task text, passed verbatim; workspace_plan, launch_workspace: optional first prompt" }),
      ),
      body: Type.Optional(
        Type.String({ description: "fire_task: the task, when task is not given; send_followup: the text; notify: after title" }),
      ),
      lane: Type.Optional(Type.String({ description: "fire_task: a git worktree lane" })),
      goalId: Type.Optional(Type.String({ description: "fire_task: goal id (PI_TASK_REF)" })),
      goal_id: Type.Optional(Type.String({ description: "alias of goalId" })),
      path: Type.Optional(Type.String({ description: "fire_task: the agents' working directory" })),
      cwd: Type.Optional(Type.String({ description: "alias of path (the origin's name)" })),
      deadlineSeconds: Type.Optional(Type.Number({ description: "fire_task: seconds per agent (5 to 86400)" })),
      deadline: Type.Optional(Type.Number({ description: "alias of deadlineSeconds" })),
      launchKey: Type.Optional(Type.String({ description: "fire_task: a stable job id of your own (4-80 chars)" })),
      force: Type.Optional(Type.Boolean({ description: "fire_task: archive an earlier job of launchKey first" })),
      workspaceName: Type.Optional(
        Type.String({ description: "fire_task, workspace_plan, launch_workspace: a fresh tmux session for the agents" }),
      ),
      dryRun: Type.Optional(Type.Boolean({ description: "fire_task: show what would run" })),
      dry_run: Type.Optional(Type.Boolean({ description: "alias of dryRun" })),
      jobId: Type.Optional(Type.String({ description: "the job (job-…, or a launchKey)" })),
      job_id: Type.Optional(Type.String({ description: "alias of jobId" })),
      usage: Type.Optional(
        Type.Boolean({ description: "list_jobs: the usage workers claimed (advisory), totals per job and per master" }),
      ),
      agent: Type.Optional(Type.String({ description: "send_followup: only this agent" })),
      text: Type.Optional(Type.String({ description: "send_followup: the follow-up text" })),
      confirm: Type.Optional(Type.String({ description: `stop_job: "${STOP_WORD}" to really stop` })),
      name: Type.Optional(Type.String({ description: "set_variable: the variable (1-80 of A-Z a-z 0-9 _ . -)" })),
      value: Type.Optional(Type.String({ description: "set_variable: its value" })),
      templateName: Type.Optional(Type.String({ description: "show_template: the team template" })),
      sessionName: Type.Optional(Type.String({ description: "stop_session, notify, set_status: the tmux session" })),
      message: Type.Optional(Type.String({ description: "notify: one printable line" })),
      key: Type.Optional(Type.String({ description: "set_status, clear_status: the status key (@pi_<key>)" })),
      // The origin's names for the same parameters.
      agentId: Type.Optional(Type.String({ description: "alias of agent (send_followup)" })),
      variableName: Type.Optional(Type.String({ description: "alias of name (set_variable)" })),
      variableValue: Type.Optional(Type.String({ description: "alias of value (set_variable)" })),
      title: Type.Optional(Type.String({ description: "notify: shown as \"title: body\" when message is not given" })),
      statusKey: Type.Optional(Type.String({ description: "alias of key (set_status, clear_status; default pi-agents)" })),
      status: Type.Optional(Type.String({ description: "alias of value (set_status)" })),
    }),
    execute,
  });

  // The origin's /tmux-agents: is tmux here, and how to use it (or get it).
  pi.registerCommand("tmux-agents", {
    description: "Check tmux availability and show managed-agent guidance (pi-matrix setup-help)",
    handler: async (_args: string, ctx: ExtensionContext) => {
      try {
        const help = setupHelp(ctx?.cwd);
        ctx.ui.notify(help.text, help.available ? "info" : "warning");
      } catch (error: any) {
        ctx.ui.notify(String(error?.message || error), "error");
      }
    },
  });

  pi.on("session_start", async (_event, ctx) => {
    ctxRef = ctx;
    taken = handoffsIn(ctx);
    // Not awaited: the questions need pi's UI running, which starts after session_start.
    setTimeout(() => {
      askAboutOrphans(ctx).catch((error) => debug("master: asking about orphans", error));
    }, 300);
  });

  async function askAboutOrphans(ctx: ExtensionContext): Promise<void> {
    // Not blocking pi: a handoff the host posts as pi reports ready goes in (and is acknowledged)
    // while the scan runs, not half a second later
    // (docs/decisions.md#handoffs-go-in-when-pi-is-ready).
    const scan = await runCliAsync(["scan", "--json"], ctx?.cwd);
    if (scan.code !== 0) return;
    let rows: any[] = [];
    try {
      rows = JSON.parse(scan.out);
    } catch (error) {
      debug("master: the orphan scan's output", error);
      return;
    }
    const mine = sessionId();
    // Exact orphans (this session and task) were already recovered by the master without asking.
    const foreign = rows.filter((r) => r && r.parentSessionId !== mine);
    if (foreign.length === 0) return;
    // rpc mode has a UI sub-protocol, but its client (the host) answers no dialogs: report only.
    if (!ctx?.hasUI || !process.stdin.isTTY) {
      post("bridge", JSON.stringify({ event: "orphans_reported", keys: foreign.map((r) => String(r.key)) }));
      return;
    }
    for (const row of foreign) {
      const name = `worker ${row.agentId} (lane ${row.lane || "-"}, ${row.alive ? "alive" : "dead"})`;
      const options = row.alive
        ? ["adopt", "clean up", "leave"]
        : row.resumable
          ? ["resume", "leave"]
          : ["leave"];
      if (options.length === 1) continue;
      const choice = await ctx.ui.select(`pi-matrix: orphan ${name}`, options);
      const who = ["--parent-pid", hostPid, "--parent-session", mine];
      let result: Cli | null = null;
      if (choice === "adopt") result = runCli(["adopt", String(row.key), ...who], ctx.cwd);
      else if (choice === "clean up") result = runCli(["cleanup", String(row.key)], ctx.cwd);
      else if (choice === "resume") result = runCli(["resume", String(row.key), ...who], ctx.cwd);
      if (result !== null) {
        const ok = result.code === 0;
        ctx.ui.notify(ok ? `${choice}: ${row.key}` : cliError(result).message, ok ? "info" : "error");
      }
      post("bridge", JSON.stringify({ event: "orphan_answered", key: String(row.key), choice: choice || "leave" }));
    }
  }

  function accepted(id: string): void {
    post("bridge", JSON.stringify({ event: "handoff_accepted", id, sessionId: sessionId() }));
  }

  /** A "handoff" notice from the host: into the conversation once, then acknowledged. */
  function deliverHandoff(notice: any): void {
    let handoff: any;
    try {
      handoff = JSON.parse(String(notice.message || ""));
    } catch (error) {
      debug("master: a handoff notice", error);
      return;
    }
    const id = String(handoff?.id || "");
    if (!id || !ctxRef) return; // not ready: the host posts it again
    if (handoff.parentSessionId && handoff.parentSessionId !== sessionId()) return; // another session's
    if (taken.has(id)) {
      accepted(id); // in the conversation already: the host's acknowledgement was lost or late
      return;
    }
    const content = String(handoff.text || "");
    delivery.add({
      id,
      kind: "handoff",
      send(mode: Mode): void {
        const message = { customType: HANDOFF_TYPE, content, display: true, details: { id } };
        // Idle: a custom message starts its turn at once (no await before pi's agent takes it).
        pi.sendMessage(message, mode === "idle" ? { triggerTurn: true } : { deliverAs: "followUp" });
      },
      matches: (m: any) =>
        Boolean(m) && m.role === "custom" && m.customType === HANDOFF_TYPE && m.details?.id === id,
      taken(): void {
        taken.add(id);
        accepted(id);
      },
    });
  }

  handoffDelivery.deliver = deliverHandoff;
}

/** Set by installMaster: how bridge.ts hands a "handoff" notice over. */
export const handoffDelivery: { deliver: ((notice: any) => void) | null } = { deliver: null };
