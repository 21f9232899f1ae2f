// Delivery into pi's conversation (docs/decisions.md#a-message-reaches-pis-conversation-once):
// every message the host passes on (an owner's prompt or steer, a worker's handoff) reaches the
// conversation once, in arrival order, and is acknowledged only after pi's conversation has it.
//
//   * Busy pi: the message goes through pi's own queue (follow-up, or steer for a steer); any
//     number may be queued at once, pi drains them in order.
//   * Idle pi: one message at a time. It starts a turn, and nothing else is sent until pi's
//     message_end event shows it in the conversation: two new prompts in one tick would race
//     (pi rejects the second asynchronously, "Agent is already processing a prompt").
//   * Acknowledged on the message_end event of that very message, one tick later (pi persists
//     the message to the session file right after the extension handlers return).
//   * A message pi dropped unseen (the owner's Escape clears pi's queues) is sent again once pi
//     has stayed idle for RESEND_MS after it. One queued before a run that ended in an error, or
//     before an abort the host asked for, is left to pi: pi keeps its queue then and delivers it
//     with its next run (a second copy would arrive twice).
//   * Sends happen only in a fresh macrotask (the poll timer, or a timeout after an event): pi
//     hands events to extensions on a promise chain that can lag its agent loop, and a follow-up
//     queued between the loop's last look at its queue and its end would wait for the next run.

import { debug } from "./common.ts";

/** Sent again when pi stayed idle this long without taking it. */
export const RESEND_MS = 3000;

export type Mode = "idle" | "followUp" | "steer";

export interface Item {
  id: string;
  kind: string;
  /** Hand the message to pi: a new turn (idle) or pi's queue. */
  send(mode: Mode): void;
  /** True when this conversation message is this item. */
  matches(message: any): boolean;
  /** pi's conversation has it (called once, a tick after message_end). */
  taken(): void;
}

type Sent = { item: Item; mode: Mode; at: number; parked: boolean };

export class Delivery {
  private queue: Item[] = [];
  private sent: Sent[] = [];
  private idleSince: number | null = null;
  private compacting = false;
  private closed = false;
  // A plain field, not a parameter property: node's type stripping (tests/bridge/) takes only
  // TypeScript that can be erased (tsconfig.json's erasableSyntaxOnly).
  private readonly isIdle: () => boolean;

  constructor(isIdle: () => boolean) {
    this.isIdle = isIdle;
  }

  /** True when the id is waiting, or sent and not yet seen in the conversation. */
  has(id: string): boolean {
    return this.queue.some((i) => i.id === id) || this.sent.some((s) => s.item.id === id);
  }

  add(item: Item): void {
    if (this.has(item.id)) return;
    this.queue.push(item);
    this.pump();
  }

  /** pi's message_end: the first sent item it matches is in the conversation. */
  seen(message: any): void {
    const at = this.sent.findIndex((s) => s.item.matches(message));
    if (at < 0) return;
    const [done] = this.sent.splice(at, 1);
    setTimeout(() => {
      try {
        done.item.taken();
      } catch (error) {
        debug("delivery: an acknowledgement", error);
        // a lost acknowledgement: the host posts the message again and it is acknowledged then
      }
      this.pump();
    }, 0);
  }

  /** An abort, or a run that ended in an error, leaves pi's queue as it is: what is in it is
   * pi's to deliver, never sent twice. */
  keptByPi(): void {
    for (const s of this.sent) s.parked = true;
  }

  setCompacting(on: boolean): void {
    this.compacting = on;
    this.idleSince = null;
  }

  /** pi is shutting down: nothing more is sent (what was not seen is not acknowledged). */
  close(): void {
    this.closed = true;
  }

  /** Send what may be sent now; never throws (a bridge that fails never takes pi down). */
  pump(): void {
    if (this.closed) return;
    try {
      this.pumpNow();
    } catch (error) {
      debug("delivery: pump", error);
      // pi refused or its ctx went stale: what was not sent stays queued
    }
  }

  private pumpNow(): void {
    const now = Date.now();
    const idle = this.isIdle();
    this.idleSince = idle && !this.compacting ? (this.idleSince ?? now) : null;
    this.resendDropped(now);
    while (this.queue.length > 0) {
      // A new turn not yet seen: anything sent now could race it (or overtake it).
      if (this.sent.some((s) => s.mode === "idle")) return;
      const item = this.queue[0];
      const mode: Mode = this.isIdle() ? "idle" : item.kind === "steer" ? "steer" : "followUp";
      try {
        item.send(mode);
      } catch (error) {
        debug("delivery: pi refused a message (it stays first in line)", error);
        return; // pi refused it now: it stays first in line for the next pump
      }
      this.queue.shift();
      this.sent.push({ item, mode, at: Date.now(), parked: false });
    }
  }

  private resendDropped(now: number): void {
    const since = this.idleSince;
    if (since === null || now - since < RESEND_MS) return;
    const dropped = this.sent.filter((s) => !s.parked && s.at <= since);
    if (dropped.length === 0) return;
    this.sent = this.sent.filter((s) => !dropped.includes(s));
    this.queue = [...dropped.map((s) => s.item), ...this.queue];
  }
}
