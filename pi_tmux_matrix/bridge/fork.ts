// Fork children (PI_FORK=1, launched by `pi-matrix fork`): one run, then a result.json and exit.
//
// The child is an interactive pi in a tmux pane, which never exits by itself: after its first
// agent run this writes the run's result (final assistant text, stop reason, usage, model) to
// PI_FORK_RESULT_PATH and shuts pi down cleanly. The launch script prints the exit marker after
// pi exits, so the parent learns the end even if this file is never written.
import { debug, durableWrite, env, lastAssistant, textOf } from "./common.ts";
import type { ExtensionAPI } from "./pi-api.d.ts";
import { addUsage, emptyUsage } from "./usage.ts";

const FORK_CHILD_SYSTEM_PROMPT = [
  "You are a fork: a copy of an earlier session, started to do one task and report back.",
  "Do the task in this one run, then end with a short, complete answer: it is returned to the parent session.",
  "Do not start other agents or forks.",
].join("\n");

/** The usage of the whole run (usage.ts's one sum): agent_end carries only this run's new
 * messages, and every assistant message (each tool-call round) was paid for, not only the last. */
function runUsage(event: any): object | null {
  const sum = emptyUsage();
  if (!addUsage(sum, (event && event.messages) || [])) return null;
  return { ...sum.counts, cost: { total: sum.costs.total } };
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

export function installFork(pi: ExtensionAPI): void {
  const resultPath = env.PI_FORK_RESULT_PATH || "";
  if (env.PI_FORK !== "1" || !resultPath) return;
  let done = false;

  pi.on("before_agent_start", async (event) => {
    return { systemPrompt: `${event.systemPrompt || ""}\n\n${FORK_CHILD_SYSTEM_PROMPT}` };
  });

  pi.on("agent_end", async (event, ctx) => {
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
    } catch (error) {
      debug("fork: writing result.json", error);
      // No artifact: the parent builds a failure result from the exit marker.
    }
    // Let pi finish writing the session file, then leave through its shutdown hooks.
    setTimeout(() => {
      try {
        ctx.shutdown();
      } catch (error) {
        debug("fork: shutting down after the run", error);
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
