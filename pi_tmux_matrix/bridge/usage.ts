// A pi worker's usage claim for its job round, written by the bridge from pi's own records.
//
// The round's claim file is named in the prompt pi ran ("[pi-matrix] usage file <path>", the
// marker instruction of the first task and of every follow-up; PI_MATRIX_USAGE_FILE before any):
// at each agent_end the bridge adds the usage of the run's assistant messages (pi's `usage`
// record: input, output, cacheRead, cacheWrite, totalTokens, cost{...}) to the round's sum and
// writes it, with the last message's model and provider. A new file named starts a new sum.
// Only a file directly in <state>/results/ named *.usage.json is ever written.
import * as path from "node:path";
import { STATE, debug, durableWrite, env, textOf } from "./common.ts";

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

export type Count = (typeof COUNTS)[number];
export type Cost = (typeof COSTS)[number];
/** A sum of pi's usage records, with the model and provider of the last message that had one. */
export type UsageSum = {
  counts: Record<Count, number>;
  costs: Record<Cost, number>;
  model: string | null;
  provider: string | null;
};

export function emptyUsage(): UsageSum {
  return {
    counts: { input: 0, output: 0, cacheRead: 0, cacheWrite: 0, totalTokens: 0 },
    costs: { input: 0, output: 0, cacheRead: 0, cacheWrite: 0, total: 0 },
    model: null,
    provider: null,
  };
}

/** The bridge's one usage sum: each assistant message's usage record in ``messages`` added to
 * ``sum`` (every tool-call round of a run was paid for, not only the last). Counts are whole and
 * never negative, costs never negative: a number that is not one counts 0. A cost given as a
 * bare number is taken as its total. True when any message had a usage record. */
export function addUsage(sum: UsageSum, messages: any[]): boolean {
  let any = false;
  for (const message of messages) {
    const usage = message && message.role === "assistant" ? message.usage : null;
    if (!usage || typeof usage !== "object") continue;
    any = true;
    for (const name of COUNTS) sum.counts[name] += Math.round(amount(usage[name]));
    const cost = usage.cost && typeof usage.cost === "object" ? usage.cost : { total: usage.cost };
    for (const name of COSTS) sum.costs[name] += amount(cost[name]);
    if (typeof message.model === "string") sum.model = message.model.slice(0, 200);
    if (typeof message.provider === "string") sum.provider = message.provider.slice(0, 200);
  }
  return any;
}

export class UsageClaim {
  private file: string | null = env.PI_MATRIX_USAGE_FILE && allowed(env.PI_MATRIX_USAGE_FILE)
    ? env.PI_MATRIX_USAGE_FILE
    : null;
  private sum: UsageSum = emptyUsage();

  /** One run's end (pi's agent_end event): its usage added to the round's claim, written. */
  add(event: any): void {
    try {
      const messages: any[] = (event && event.messages) || [];
      const file = named(messages);
      if (file !== null && file !== this.file) {
        this.file = file;
        // A new round's sum; the model and provider last seen stay until a message names others.
        this.sum = { ...emptyUsage(), model: this.sum.model, provider: this.sum.provider };
      }
      if (this.file === null) return;
      if (!addUsage(this.sum, messages)) return;
      const claim: Record<string, unknown> = { ...this.sum.counts, cost: { ...this.sum.costs } };
      if (this.sum.model !== null) claim.model = this.sum.model;
      if (this.sum.provider !== null) claim.provider = this.sum.provider;
      durableWrite(this.file, JSON.stringify(claim));
    } catch (error) {
      debug("usage: the round's claim", error);
      // no claim: the round's result says nothing of usage (never made-up numbers)
    }
  }
}
