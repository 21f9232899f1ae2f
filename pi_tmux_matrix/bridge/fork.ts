// Fork children (PI_FORK=1, launched by `pi-matrix fork`): one run, then a result.json and exit.
//
// The child is an interactive pi in a tmux pane, which never exits by itself: after its first
// agent run this writes the run's result (final assistant text, stop reason, usage, model) to
// PI_FORK_RESULT_PATH and shuts pi down cleanly. The launch script prints the exit marker after
// pi exits, so the parent learns the end even if this file is never written.
import { durableWrite, env, lastAssistant, textOf } from "./common.ts";

const FORK_CHILD_SYSTEM_PROMPT = [
  "You are a fork: a copy of an earlier session, started to do one task and report back.",
  "Do the task in this one run, then end with a short, complete answer: it is returned to the parent session.",
  "Do not start other agents or forks.",
].join("\n");

/** The usage of the whole run: agent_end carries only this run's new messages, and every
 * assistant message (each tool-call round) was paid for, not only the last. */
function runUsage(event: any): any {
  const messages: any[] = (event && event.messages) || [];
  const keys = ["input", "output", "cacheRead", "cacheWrite", "totalTokens"];
  let seen = false;
  const total: any = { input: 0, output: 0, cacheRead: 0, cacheWrite: 0, totalTokens: 0, cost: { total: 0 } };
  for (const m of messages) {
    const usage = m && m.role === "assistant" ? m.usage : null;
    if (!usage || typeof usage !== "object") continue;
    seen = true;
    for (const key of keys) if (typeof usage[key] === "number") total[key] += usage[key];
    const cost = usage.cost && typeof usage.cost === "object" ? usage.cost.total : usage.cost;
    if (typeof cost === "number") total.cost.total += cost;
  }
  return seen ? total : null;
}

const MAX_ACTIVITY = 20; // lines: the run's last tool calls
const ACTIVITY_CHARS = 120;

/** One line per tool call of the run ("bash: npm test"), its last MAX_ACTIVITY: what the parent's
 * fork tool shows expanded. pisession.run_outcome reads the same from a session file. */
function runActivity(event: any): string[] {
  const lines: string[] = [];
  for (const m of (event && event.messages) || []) {
    if (!m || m.role !== "assistant" || !Array.isArray(m.content)) continue;
    for (const block of m.content) {
      if (!block || block.type !== "toolCall") continue;
      const args = block.arguments && typeof block.arguments === "object" ? block.arguments : {};
      const key = ["command", "path", "pattern", "query", "task"].find((k) => typeof args[k] === "string");
      const what = key ? String(args[key]) : JSON.stringify(args);
      lines.push(`${String(block.name || "?")}: ${what.replace(/\s+/g, " ").trim()}`.slice(0, ACTIVITY_CHARS));
    }
  }
  return lines.slice(-MAX_ACTIVITY);
}

export function installFork(pi: any): void {
  const resultPath = env.PI_FORK_RESULT_PATH || "";
  if (env.PI_FORK !== "1" || !resultPath) return;
  let done = false;

  pi.on("before_agent_start", async (event: any) => {
    return { systemPrompt: `${event.systemPrompt || ""}\n\n${FORK_CHILD_SYSTEM_PROMPT}` };
  });

  pi.on("agent_end", async (event: any, ctx: any) => {
    if (done) return;
    done = true;
    const last = lastAssistant(event);
    const result = {
      runId: env.PI_FORK_RUN_ID || null,
      at: Date.now(),
      text: textOf(last).slice(0, 64000),
      stopReason: last ? last.stopReason || null : null,
      errorMessage: last ? last.errorMessage || null : null,
      usage: runUsage(event),
      activity: runActivity(event),
      model: last ? last.model || null : null,
      provider: last ? last.provider || null : null,
      sessionId: ctx.sessionManager.getSessionId(),
      sessionFile: ctx.sessionManager.getSessionFile() || null,
    };
    try {
      durableWrite(resultPath, JSON.stringify(result));
    } catch {
      // No artifact: the parent builds a failure result from the exit marker.
    }
    // Let pi finish writing the session file, then leave through its shutdown hooks.
    setTimeout(() => {
      try {
        ctx.shutdown();
      } catch {
        process.exit(0);
      }
    }, 300);
  });

  pi.on("session_shutdown", async () => {
    // A fork that ends before its run finished has failed: the safety net
    // (docs/decisions.md#a-forks-end-is-always-recorded).
    if (!done) setTimeout(() => process.exit(1), 50);
  });

  process.on("SIGTERM", () => process.exit(143));
}
