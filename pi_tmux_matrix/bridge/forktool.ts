// The `fork` tool: a pi session the product starts forks itself
// (docs/decisions.md#a-fork-runs-from-a-snapshot-beside-its-caller).
//
//   * Registered in every non-fork session under a host (a fork child, PI_FORK=1, never gets it;
//     a worker's envelope takes it away again: agent-launching tools are never a worker's).
//   * One implementation: the tool runs `pi-matrix fork --session <this session's file> --json`
//     with an argv list (cli.ts), the same command a person runs, so the run store, the cap, the
//     pane grid and the parent-shutdown clean-up are the CLI's. Waited, the run's answer is the
//     tool's result; in the background the tool returns the run id at once, and the run's
//     finisher sends the result to this session's host, which posts it as a "fork_result"
//     notice: injected once as a custom message (delivery.ts, as handoffs are), acknowledged to
//     the host once pi's conversation has it (the host then marks the run delivered, and posts a
//     result again until it is), and never again if the session already holds it
//     (docs/decisions.md#background-fork-results-are-delivered-once).
//   * The `forks +$…` footer: the cost of every fork result on the session's branch (the tool's
//     results and the delivered background results), on session_start, turn_end and
//     session_tree; off with "pi-fork": {"costFooter": false}; cleared on shutdown.
//   * A session that shuts down (quit, /new, /resume, /fork: not a reload) stops its running
//     forks: its waited ones through their waiters, the rest with `pi-matrix runs --abort`.
import type { ChildProcess } from "node:child_process";
import { Text } from "@mariozechner/pi-tui";
import { Type } from "typebox";
import { cliError, runCli, runCliAsync } from "./cli.ts";
import { TRUNCATED, debug, env, post, truncate } from "./common.ts";
import type { Delivery, Mode } from "./delivery.ts";
import type { ExtensionAPI, ExtensionContext, ToolResult } from "./pi-api.d.ts";

export const FORK_TOOL = "fork";
export const FORK_RESULT_TYPE = "pi-matrix-fork-result"; // the custom message of a background result
export const STATUS_KEY = "fork-cost";
const MAX_TEXT = 32000; // characters of a fork's answer returned to the model

type Usage = { input?: number; output?: number; totalTokens?: number; cost?: number };
type Details = {
  runId: string;
  mode: "wait" | "background";
  status: string;
  model?: string | null;
  error?: string | null;
  usage?: Usage | null;
  paneId?: string | null;
  activity?: string[];
};

function costOf(details: any): number {
  const cost = details?.usage?.cost;
  return typeof cost === "number" && Number.isFinite(cost) && cost > 0 ? cost : 0;
}

/** The cost of every fork result on the branch: the fork tool's results, the background results
 * delivered as custom messages. */
export function forkCost(entries: any[]): { cost: number; forks: number } {
  let cost = 0;
  let forks = 0;
  for (const entry of entries) {
    const message = entry?.type === "message" ? entry.message : null;
    const isTool = message?.role === "toolResult" && message.toolName === FORK_TOOL && message.details?.runId;
    const isDelivered = entry?.type === "custom_message" && entry.customType === FORK_RESULT_TYPE;
    if (isTool && message.details.mode === "background") continue; // its result comes on its own
    if (isTool) {
      forks += 1;
      cost += costOf(message.details);
    } else if (isDelivered) {
      forks += 1;
      cost += costOf(entry.details);
    }
  }
  return { cost, forks };
}

export function formatCost(cost: number): string {
  return `forks +$${cost.toFixed(cost > 0 && cost < 0.01 ? 4 : 2)}`;
}

function usageLine(details: Details | undefined): string {
  const usage = details?.usage;
  if (!usage) return "";
  const parts = [];
  if (typeof usage.totalTokens === "number") parts.push(`${usage.totalTokens} tok`);
  parts.push(`$${(usage.cost || 0).toFixed(4)}`);
  if (details?.model) parts.push(String(details.model));
  return parts.join(" · ");
}

/** The fork flags of a call: its own model and thinking, which win over the settings and the
 * parent's (docs/decisions.md#a-fork-inherits-its-parents-pi-not-its-authority). */
function flagsOf(params: any): string[] {
  const flags: string[] = [];
  for (const name of ["model", "thinking"] as const) {
    const value = params[name];
    if (value === undefined || value === null || value === "") continue;
    if (typeof value !== "string" || value.startsWith("-")) throw new Error(`fork: "${name}" must be a name like "provider/model" or "high"`);
    flags.push(`--${name}`, value);
  }
  return flags;
}

function parseRun(out: string): any {
  try {
    const run = JSON.parse(out);
    return run && typeof run === "object" ? run : null;
  } catch (error) {
    debug("forktool: the CLI's run record", error);
    return null;
  }
}

function detailsOf(run: any, mode: "wait" | "background"): Details {
  const usage = run.usage
    ? { input: run.usage.input, output: run.usage.output, totalTokens: run.usage.totalTokens, cost: run.usage.cost }
    : null;
  const activity = Array.isArray(run.activity) ? run.activity.map(String) : [];
  return {
    runId: String(run.id),
    mode,
    status: String(run.status),
    model: run.model ?? null,
    error: run.error ?? null,
    usage,
    paneId: run.paneId ?? null,
    activity,
  };
}

/** The fork_result ids already in a session's conversation (a previous pi of it took them). */
function deliveredIn(ctx: ExtensionContext | null): Set<string> {
  const ids = new Set<string>();
  try {
    for (const entry of ctx?.sessionManager?.getEntries?.() || []) {
      const id = entry?.type === "custom_message" && entry.customType === FORK_RESULT_TYPE && entry.details?.runId;
      if (typeof id === "string") ids.add(id);
    }
  } catch (error) {
    debug("forktool: the fork results in the session", error);
    // an unreadable session: nothing is known to be there
  }
  return ids;
}

export function installForkTool(pi: ExtensionAPI, delivery: Delivery): void {
  if (env.PI_FORK === "1") return; // forks do not fork (docs/decisions.md#forks-do-not-fork)
  let ctxRef: ExtensionContext | null = null;
  let footer = true;
  let configured = false; // the footer shows only once "pi-fork".costFooter is known
  let forked = false; // this pi started a fork: its shutdown stops the running ones
  let delivered = new Set<string>();
  const waiters = new Set<ChildProcess>();

  function updateFooter(ctx: ExtensionContext | null): void {
    try {
      if (!ctx?.hasUI || !ctx.ui?.setStatus || !configured) return;
      if (!footer) {
        ctx.ui.setStatus(STATUS_KEY, undefined);
        return;
      }
      const { cost, forks } = forkCost(ctx.sessionManager.getBranch());
      ctx.ui.setStatus(STATUS_KEY, forks > 0 ? formatCost(cost) : undefined);
    } catch (error) {
      debug("forktool: the footer", error);
      // a stale ctx (shutting down): no footer
    }
  }

  /** "pi-fork".costFooter, from the one settings reader (`pi-matrix runs --fork-settings`). */
  async function loadConfig(ctx: ExtensionContext | null): Promise<void> {
    const shown = await runCliAsync(["runs", "--fork-settings", "--json"], ctx?.cwd);
    try {
      if (shown.code === 0) footer = JSON.parse(shown.out).costFooter !== false;
    } catch (error) {
      debug("forktool: pi-fork settings (the default: footer on)", error);
      // unreadable: the default (on)
    }
    configured = true;
    updateFooter(ctxRef);
  }

  async function execute(_id: string, params: any, signal: AbortSignal | undefined, _update: unknown, ctx: ExtensionContext | null): Promise<ToolResult<Details>> {
    ctxRef = ctx || ctxRef;
    const task = typeof params.task === "string" ? params.task : "";
    if (task.trim() === "") throw new Error('fork: needs "task", the one task the fork does and reports on');
    const file = ctx?.sessionManager?.getSessionFile?.();
    if (!file) throw new Error("fork: this session is not saved to a file (pi --no-session): there is nothing to fork");
    const background = params.background === true;
    const mode = background ? "background" : "wait";
    const args = ["fork", "--session", String(file), background ? "--background" : "--wait", "--json", ...flagsOf(params), "--", task];
    forked = true;
    const done = await runCliAsync(args, ctx?.cwd, signal, (child, running) => {
      if (running) waiters.add(child);
      else waiters.delete(child);
    });
    const run = parseRun(done.out);
    if (run === null) throw cliError(done);
    const details = detailsOf(run, mode);
    if (background) {
      const where = run.paneId ? ` in pane ${run.paneId}` : "";
      const body =
        run.status === "running"
          ? `Fork ${run.id} started in the background${where}. Its result arrives in this session as a message when it ends; carry on meanwhile.`
          : `Fork ${run.id} ${run.status}${run.error ? `: ${run.error}` : ""}.`;
      return { content: [{ type: "text", text: body }], details };
    }
    // The whole answer (the run record keeps only an excerpt in `text`).
    const whole = String(typeof run.answer === "string" ? run.answer : run.text || "");
    const answer = truncate(whole, MAX_TEXT, TRUNCATED);
    const body = run.status === "completed" ? answer : `Fork ${run.id} ${run.status}: ${run.error || "no answer"}${answer ? `\n${answer}` : ""}`;
    return { content: [{ type: "text", text: body }], details };
  }

  pi.registerTool({
    name: FORK_TOOL,
    label: "Fork",
    description:
      "Fork this session: a copy of it (same history, same model and tools) does one task in a pane beside you " +
      "and reports back, while this session's own history stays as it is. By default it waits and the fork's " +
      "final answer is this tool's result; with background: true it returns at once and the answer arrives " +
      "later in this session as a message. At most 3 forks run at a time per folder. Optional model " +
      '("provider/model") and thinking ("off" … "xhigh") for the fork.',
    promptSnippet: "Fork this session to do one task in parallel and report back",
    parameters: Type.Object({
      task: Type.String({ description: "the one task the fork does; its final answer is what comes back" }),
      background: Type.Optional(Type.Boolean({ description: "true: return at once, the result arrives as a message later" })),
      model: Type.Optional(Type.String({ description: "the fork's model (provider/model); default: this session's" })),
      thinking: Type.Optional(Type.String({ description: "the fork's thinking level" })),
    }),
    execute,
    renderCall(args: any, theme: any) {
      const task = String(args?.task || "").split("\n")[0].slice(0, 100);
      const how = args?.background ? theme.fg("muted", " (background)") : "";
      return new Text(theme.fg("toolTitle", theme.bold("fork ")) + theme.fg("muted", task) + how, 0, 0);
    },
    renderResult(result: any, options: any, theme: any) {
      const details = result?.details as Details | undefined;
      const first = result?.content?.[0];
      const body = first && first.type === "text" ? String(first.text || "") : "";
      if (!details) return new Text(body.split("\n")[0] || "", 0, 0);
      const ok = details.status === "completed" || details.status === "running";
      const mark = ok ? theme.fg("success", "✓") : theme.fg("error", "✗");
      const usage = usageLine(details);
      const head = `${mark} ${details.runId} ${details.status}${usage ? theme.fg("dim", ` · ${usage}`) : ""}`;
      if (!options?.expanded) return new Text(head, 0, 0);
      // Expanded: the fork's activity (its tool calls), then its answer.
      const activity = (details.activity || []).map((line) => theme.fg("dim", `  → ${line}`));
      return new Text([head, ...activity, body].join("\n"), 0, 0);
    },
  });

  /** A "fork_result" notice from the host: into the conversation once, then acknowledged. */
  function deliverResult(notice: any): void {
    let result: any;
    try {
      result = JSON.parse(String(notice.message || ""));
    } catch (error) {
      debug("forktool: a fork_result notice", error);
      return;
    }
    const runId = String(result?.runId || "");
    const noticeId = String(notice.id || runId);
    if (!runId || !ctxRef) return;
    const taken = () => post("bridge", JSON.stringify({ event: "notice_taken", id: noticeId, kind: "fork_result", runId }));
    if (delivered.has(runId)) {
      taken(); // in the conversation already
      return;
    }
    const content = String(result.text || "");
    const details = { runId, status: String(result.status || ""), usage: result.usage ?? null, model: result.model ?? null };
    delivery.add({
      id: `fork:${runId}`,
      kind: "fork_result",
      send(mode: Mode): void {
        const message = { customType: FORK_RESULT_TYPE, content, display: true, details };
        pi.sendMessage(message, mode === "idle" ? { triggerTurn: true } : { deliverAs: "followUp" });
      },
      matches: (m: any) => Boolean(m) && m.role === "custom" && m.customType === FORK_RESULT_TYPE && m.details?.runId === runId,
      taken(): void {
        delivered.add(runId);
        taken();
      },
    });
  }
  forkResultDelivery.deliver = deliverResult;

  pi.on("session_start", async (_event, ctx) => {
    ctxRef = ctx;
    delivered = deliveredIn(ctx);
    updateFooter(ctx);
    setTimeout(() => {
      loadConfig(ctx).catch((error) => debug("forktool: loading pi-fork settings", error));
    }, 0);
  });
  pi.on("turn_end", async (_event, ctx) => updateFooter(ctx || ctxRef));
  pi.on("session_tree", async (_event, ctx) => updateFooter(ctx || ctxRef));
  pi.on("message_end", async (event, ctx) => {
    // A delivered background result changes the sum without a turn of its own ending first.
    if (event?.message?.customType === FORK_RESULT_TYPE) setTimeout(() => updateFooter(ctx || ctxRef), 0);
  });

  pi.on("session_shutdown", async (event, ctx) => {
    try {
      ctx?.ui?.setStatus?.(STATUS_KEY, undefined);
    } catch (error) {
      debug("forktool: clearing the footer", error);
      // the UI is gone already
    }
    if (event?.reason === "reload") return; // the same session goes on
    for (const waiter of waiters) {
      try {
        waiter.kill("SIGTERM"); // its waiter fails the fork: "Parent session shut down. …"
      } catch (error) {
        debug("forktool: SIGTERM to a fork's waiter", error);
        // gone already
      }
    }
    if (!forked) return;
    let file = "";
    try {
      file = String(ctx?.sessionManager?.getSessionFile?.() || "");
    } catch (error) {
      debug("forktool: the session file at shutdown", error);
      file = "";
    }
    if (file) runCli(["runs", "--abort", "--parent-session", file], ctx?.cwd);
  });
}

/** Set by installForkTool: how bridge.ts hands a "fork_result" notice over. */
export const forkResultDelivery: { deliver: ((notice: any) => void) | null } = { deliver: null };
