// The bridge's one truncation (common.ts truncate), its one usage sum (usage.ts addUsage) and its
// debug line (common.ts debug, on with PI_MATRIX_BRIDGE_DEBUG).
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
import { TRUNCATED, truncate } from "../../pi_tmux_matrix/bridge/common.ts";
import { addUsage, emptyUsage } from "../../pi_tmux_matrix/bridge/usage.ts";

test("truncate: whole up to the limit, else the start and the mark, the limit in all", () => {
  assert.equal(truncate("abc", 3), "abc");
  assert.equal(truncate("abcdef", 5), "ab...");
  const long = "x".repeat(7000);
  const cut = truncate(long, 6000, TRUNCATED);
  assert.equal(cut.length, 6000);
  assert.ok(cut.endsWith("\n…[truncated: 7000 characters]"));
  assert.equal(truncate("abcdef", 2), "..."); // a mark longer than the limit: the mark alone
});

test("addUsage: every assistant message's usage, counts whole and never negative", () => {
  const sum = emptyUsage();
  const messages = [
    { role: "user", usage: { input: 1000 } },
    { role: "assistant", usage: { input: 10, output: 5, totalTokens: 15, cost: { input: 0.1, total: 0.25 } }, model: "m1", provider: "p" },
    { role: "assistant" },
    { role: "assistant", usage: { input: 2.6, output: -4, cacheRead: "7", totalTokens: Number.NaN, cost: 0.5 }, model: "m2" },
    null,
  ];
  assert.equal(addUsage(sum, messages), true);
  assert.deepEqual(sum.counts, { input: 13, output: 5, cacheRead: 0, cacheWrite: 0, totalTokens: 15 });
  assert.deepEqual(sum.costs, { input: 0.1, output: 0, cacheRead: 0, cacheWrite: 0, total: 0.75 });
  assert.equal(sum.model, "m2");
  assert.equal(sum.provider, "p");
  assert.equal(addUsage(emptyUsage(), [{ role: "assistant" }, { role: "user", usage: { input: 1 } }]), false);
});

test("debug writes one line per call to PI_MATRIX_BRIDGE_DEBUG's file, and nothing without it", () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "bridge-debug-"));
  try {
    const log = path.join(dir, "debug.log");
    const common = fileURLToPath(new URL("../../pi_tmux_matrix/bridge/common.ts", import.meta.url));
    const script = `const { debug } = await import(${JSON.stringify(common)}); debug("here", new Error("it broke\\nbadly")); debug("there");`;
    const run = (env: Record<string, string>) =>
      spawnSync(process.execPath, ["--input-type=module", "-e", script], { env: { ...process.env, ...env }, encoding: "utf8" });
    const quiet = run({ PI_MATRIX_BRIDGE_DEBUG: "" });
    assert.equal(quiet.status, 0, quiet.stderr);
    assert.equal(fs.existsSync(log), false);
    const loud = run({ PI_MATRIX_BRIDGE_DEBUG: log, PI_MATRIX_KEY: "worker-w1" });
    assert.equal(loud.status, 0, loud.stderr);
    assert.equal(loud.stdout + loud.stderr, "", "never on pi's terminal");
    const lines = fs.readFileSync(log, "utf8").split("\n");
    assert.equal(lines.length, 3);
    assert.match(lines[0], /^\S+Z pid \d+ worker-w1 here: it broke badly$/);
    assert.match(lines[1], /^\S+Z pid \d+ worker-w1 there$/);
    assert.equal(fs.statSync(log).mode & 0o777, 0o600);
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
