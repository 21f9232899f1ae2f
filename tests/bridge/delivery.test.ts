// Delivery into pi's conversation (delivery.ts): once each, in arrival order, one new turn at a
// time, acknowledged only after pi's conversation has the message. pi here is a small stand-in
// conversation: `send` records the call, `seen` is pi's message_end.
import assert from "node:assert/strict";
import { test } from "node:test";
import { Delivery, type Item, type Mode, RESEND_MS } from "../../pi_tmux_matrix/bridge/delivery.ts";

type Log = { sends: Array<[string, Mode]>; taken: string[] };

function item(log: Log, id: string, kind = "prompt", refuse = { times: 0 }): Item {
  return {
    id,
    kind,
    send(mode: Mode): void {
      if (refuse.times > 0) {
        refuse.times -= 1;
        throw new Error("Agent is already processing a prompt");
      }
      log.sends.push([id, mode]);
    },
    matches: (message: any) => message?.id === id,
    taken: () => log.taken.push(id),
  };
}

const tick = () => new Promise((resolve) => setTimeout(resolve, 5));
const newLog = (): Log => ({ sends: [], taken: [] });

test("idle pi: one new turn at a time, the next once pi's conversation has the first", async () => {
  const log = newLog();
  let idle = true;
  const delivery = new Delivery(() => idle);
  delivery.add(item(log, "a"));
  delivery.add(item(log, "b"));
  assert.deepEqual(log.sends, [["a", "idle"]]);
  assert.ok(delivery.has("a") && delivery.has("b"));
  idle = false; // the turn started
  delivery.seen({ id: "a" });
  assert.deepEqual(log.taken, [], "acknowledged a tick after message_end, not during it");
  await tick();
  assert.deepEqual(log.taken, ["a"]);
  // pi is busy now: b goes into pi's own queue as a follow-up.
  assert.deepEqual(log.sends, [["a", "idle"], ["b", "followUp"]]);
  assert.ok(!delivery.has("a") && delivery.has("b"));
});

test("busy pi: everything into pi's queue at once, a steer as a steer, in arrival order", () => {
  const log = newLog();
  const delivery = new Delivery(() => false);
  delivery.add(item(log, "a"));
  delivery.add(item(log, "s", "steer"));
  delivery.add(item(log, "h", "handoff"));
  assert.deepEqual(log.sends, [["a", "followUp"], ["s", "steer"], ["h", "followUp"]]);
});

test("the same id twice is delivered once", () => {
  const log = newLog();
  const delivery = new Delivery(() => false);
  delivery.add(item(log, "a"));
  delivery.add(item(log, "a"));
  assert.deepEqual(log.sends, [["a", "followUp"]]);
});

test("a message pi refuses stays first in line for the next pump", () => {
  const log = newLog();
  const delivery = new Delivery(() => false);
  delivery.add(item(log, "a", "prompt", { times: 2 }));
  assert.deepEqual(log.sends, []);
  delivery.add(item(log, "b")); // its pump meets a's second refusal: b waits behind a
  assert.deepEqual(log.sends, []);
  delivery.pump();
  assert.deepEqual(log.sends, [["a", "followUp"], ["b", "followUp"]]);
});

test("a stale ctx (isIdle throws) sends nothing and takes nothing down", () => {
  const log = newLog();
  const delivery = new Delivery(() => {
    throw new Error("stale ctx");
  });
  delivery.add(item(log, "a"));
  assert.deepEqual(log.sends, []);
  assert.ok(delivery.has("a"));
});

test("a message that is not a sent one is ignored; an acknowledgement that throws is not fatal", async () => {
  const log = newLog();
  const delivery = new Delivery(() => false);
  const broken = { ...item(log, "a"), taken: () => { throw new Error("post failed"); } };
  delivery.add(broken);
  delivery.seen({ id: "zzz" });
  delivery.seen(undefined);
  assert.ok(delivery.has("a"));
  delivery.seen({ id: "a" });
  await tick();
  assert.ok(!delivery.has("a"));
});

test("after close nothing more is sent", () => {
  const log = newLog();
  const delivery = new Delivery(() => false);
  delivery.close();
  delivery.add(item(log, "a"));
  delivery.pump();
  assert.deepEqual(log.sends, []);
});

test("dropped unseen: sent again after pi stayed idle; kept by pi (an abort, an error), or idle while compacting: never twice", async () => {
  const dropped = newLog();
  const kept = newLog();
  const compacting = newLog();
  let idle = false;
  const a = new Delivery(() => idle);
  const b = new Delivery(() => idle);
  const c = new Delivery(() => idle);
  a.add(item(dropped, "x"));
  b.add(item(kept, "y"));
  c.add(item(compacting, "z"));
  b.keptByPi();
  c.setCompacting(true);
  idle = true; // pi went idle without taking any (Escape cleared its queue; an abort; a compaction)
  for (const d of [a, b, c]) d.pump();
  await new Promise((resolve) => setTimeout(resolve, RESEND_MS + 150));
  for (const d of [a, b, c]) d.pump();
  assert.deepEqual(dropped.sends, [["x", "followUp"], ["x", "idle"]]);
  assert.deepEqual(kept.sends, [["y", "followUp"]]);
  assert.deepEqual(compacting.sends, [["z", "followUp"]]);
});
