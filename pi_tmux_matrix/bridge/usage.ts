// A pi worker's usage claim for its job round, written by the bridge from pi's own records.
//
// The round's claim file is named in the prompt pi ran ("[pi-matrix] usage file <path>", the
// marker instruction of the first task and of every follow-up; PI_MATRIX_USAGE_FILE before any):
// at each agent_end the bridge adds the usage of the run's assistant messages (pi's `usage`
// record: input, output, cacheRead, cacheWrite, totalTokens, cost{...}) to the round's sum and
// writes it, with the last message's model and provider. A new file named starts a new sum.
// Only a file directly in <state>/results/ named *.usage.json is ever written.
import * as path from "node:path";
import { STATE, durableWrite, env, textOf } from "./common.ts";

const LINE = "[pi-matrix] usage file ";
const NAME = /^[A-Za-z0-9][A-Za-z0-9._-]{0,250}\.usage\.json$/;
const COUNTS = ["input", "output", "cacheRead", "cacheWrite", "totalTokens"] as const;
const COSTS = ["input", "output", "cacheRead", "cacheWrite", "total"] as const;

function allowed(file: string): boolean {
  return (
    path.isAbsolute(file) &&
    path.dirname(file) === path.join(STATE, "results") &&
    NAME.test(path.basename(file))
  );
}

/** The last claim file named by the run's user messages (its prompt, a follow-up), if any. */
function named(messages: any[]): string | null {
  let found: string | null = null;
  for (const message of messages) {
    if (!message || message.role !== "user") continue;
    for (const line of textOf(message).split("\n")) {
      const at = line.indexOf(LINE);
      if (at < 0) continue;
      const file = line.slice(at + LINE.length).trim();
      if (allowed(file)) found = file;
    }
  }
  return found;
}

function amount(value: any): number {
  return typeof value === "number" && Number.isFinite(value) && value >= 0 ? value : 0;
}

export class UsageClaim {
  private file: string | null = env.PI_MATRIX_USAGE_FILE && allowed(env.PI_MATRIX_USAGE_FILE)
    ? env.PI_MATRIX_USAGE_FILE
    : null;
  private counts: Record<string, number> = {};
  private costs: Record<string, number> = {};
  private model: string | null = null;
  private provider: string | null = null;

  /** One run's end (pi's agent_end event): its usage added to the round's claim, written. */
  add(event: any): void {
    try {
      const messages: any[] = (event && event.messages) || [];
      const file = named(messages);
      if (file !== null && file !== this.file) {
        this.file = file;
        this.counts = {};
        this.costs = {};
      }
      if (this.file === null) return;
      let any = false;
      for (const message of messages) {
        const usage = message && message.role === "assistant" ? message.usage : null;
        if (!usage || typeof usage !== "object") continue;
        any = true;
        for (const name of COUNTS) this.counts[name] = (this.counts[name] || 0) + Math.round(amount(usage[name]));
        const cost = usage.cost && typeof usage.cost === "object" ? usage.cost : {};
        for (const name of COSTS) this.costs[name] = (this.costs[name] || 0) + amount(cost[name]);
        if (typeof message.model === "string") this.model = message.model.slice(0, 200);
        if (typeof message.provider === "string") this.provider = message.provider.slice(0, 200);
      }
      if (!any) return;
      const claim: Record<string, unknown> = { ...this.counts, cost: { ...this.costs } };
      if (this.model !== null) claim.model = this.model;
      if (this.provider !== null) claim.provider = this.provider;
      durableWrite(this.file, JSON.stringify(claim));
    } catch {
      // no claim: the round's result says nothing of usage (never made-up numbers)
    }
  }
}
