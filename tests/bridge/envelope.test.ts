// The worker envelope's path logic (envelope.ts): allowed paths parsed whole or not at all, paths
// judged where the kernel will act (pi's own expansion, then symlinks followed component by
// component), containment by components. On a real temporary tree with real symlinks.
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { after, test } from "node:test";
import {
  type Envelope,
  hiddenFrom,
  judge,
  parseAllowed,
  physical,
  walk,
  withoutHidden,
} from "../../pi_tmux_matrix/bridge/envelope.ts";

const base = fs.realpathSync(fs.mkdtempSync(path.join(os.tmpdir(), "bridge-envelope-")));
after(() => fs.rmSync(base, { recursive: true, force: true }));

function tree(...dirs: string[]): void {
  for (const dir of dirs) fs.mkdirSync(path.join(base, dir), { recursive: true });
}
tree("p/src", "p-evil", "outside", "agent/sessions/other", "p/.git", "state");
fs.writeFileSync(path.join(base, "p/src/a.ts"), "x");
fs.writeFileSync(path.join(base, "outside/secret"), "s");
fs.writeFileSync(path.join(base, "agent/sessions/other/s.jsonl"), "{}");
fs.writeFileSync(path.join(base, "agent/auth.json"), "{}");
fs.symlinkSync(path.join(base, "outside"), path.join(base, "p/out")); // a link out of the root
fs.symlinkSync("../outside/new", path.join(base, "p/dangling")); // relative, pointing out, dangling
fs.symlinkSync("loop-b", path.join(base, "p/loop-a"));
fs.symlinkSync("loop-a", path.join(base, "p/loop-b"));

const P = path.join(base, "p");
const envelope: Envelope = {
  allowed: [P],
  privateRoots: [
    { real: path.join(base, "agent/auth.json"), what: "pi's auth.json" },
    { real: path.join(base, "state"), what: "the pi-matrix state dir" },
  ],
  sessionsDirs: [path.join(base, "agent/sessions")],
  agent: path.join(base, "agent"),
};
const own = path.join(base, "agent/sessions/other/s.jsonl");

test("PI_WORKER_ALLOWED_PATHS: unset or empty is full scope; a good list is normalised", () => {
  assert.deepEqual(parseAllowed(undefined), []);
  assert.deepEqual(parseAllowed(""), []);
  assert.deepEqual(parseAllowed("[]"), []);
  assert.deepEqual(parseAllowed('["/work/repo/", "/srv"]'), ["/work/repo/", "/srv"].map(path.normalize));
});

test("PI_WORKER_ALLOWED_PATHS: anything malformed is refused whole, naming the problem", () => {
  const refused: Array<[string, RegExp]> = [
    ["{", /is not JSON/],
    ['{"a": 1}', /is a JSON object, not an array/],
    ["null", /is a JSON null/],
    ['["relative/x"]', /item 0 .* is relative/],
    ['["/a", "/b/../c"]', /item 1 .* is not normalised/],
    ['["/a//b"]', /is not normalised/],
    ['["/a", ""]', /item 1 is not a non-empty string/],
    ['["/a", 3]', /item 1 is not a non-empty string/],
    ['["/a\\u0000"]', /item 0 contains a NUL/],
    [JSON.stringify(Array.from({ length: 257 }, (_, i) => `/p${i}`)), /has 257 paths \(limit 256\)/],
    [JSON.stringify(["/" + "x".repeat(70000)]), /is over 65536 bytes/],
  ];
  for (const [raw, why] of refused) assert.throws(() => parseAllowed(raw), why, raw.slice(0, 40));
});

test("walk follows symlinks component by component, `..` physically, and names what mkdir -p makes", () => {
  assert.deepEqual(walk(path.join(P, "src/a.ts")), { real: path.join(P, "src/a.ts"), made: [] });
  assert.equal(physical(path.join(P, "out/secret")), path.join(base, "outside/secret"));
  // `..` after a symlink is the link target's parent, as the kernel takes it.
  assert.equal(physical(`${P}/out/../p-evil`), path.join(base, "p-evil")); // (not path.join: it takes `..` by name)
  // A dangling relative link is followed from the link's own folder.
  assert.equal(physical(path.join(P, "dangling")), path.join(base, "outside/new"));
  assert.deepEqual(walk(path.join(P, "new/deeper/file")), {
    real: path.join(P, "new/deeper/file"),
    made: [path.join(P, "new"), path.join(P, "new/deeper")],
  });
  // A missing component then `..` back into what exists, then a link there: its target.
  assert.equal(physical(`${P}/new/../out/x`), path.join(base, "outside/x"));
  assert.throws(() => walk(path.join(P, "loop-a/x")), /too many levels of symbolic links/);
});

test("inside the allowed paths is allowed; a sibling with the same prefix is not", () => {
  assert.equal(judge(envelope, "read", path.join(P, "src/a.ts"), "/", null), undefined);
  assert.equal(judge(envelope, "write", path.join(P, "src/new/b.ts"), "/", null), undefined);
  const evil = judge(envelope, "read", path.join(base, "p-evil/x"), "/", null);
  assert.match(evil ?? "", /is blocked: it is outside this worker's allowed paths/);
});

test("paths are judged as pi expands them: relative to the cwd, @-prefixed, through symlinks", () => {
  assert.equal(judge(envelope, "read", "src/a.ts", P, null), undefined);
  assert.equal(judge(envelope, "read", `@${P}/src/a.ts`, "/", null), undefined);
  assert.match(judge(envelope, "read", "../outside/secret", P, null) ?? "", /outside this worker's allowed paths/);
  const through = judge(envelope, "read", "out/secret", P, null) ?? "";
  assert.match(through, /\(really .*outside\/secret\)/);
  assert.match(judge(envelope, "write", "dangling", P, null) ?? "", /outside this worker's allowed paths/);
  assert.match(judge(envelope, "ls", "loop-a/x", P, null) ?? "", /blocked: too many levels of symbolic links/);
});

test("private roots and other sessions are blocked whatever the allowed paths; its own session is readable", () => {
  const full: Envelope = { ...envelope, allowed: [] }; // full-machine scope
  assert.equal(judge(full, "read", path.join(base, "outside/secret"), "/", null), undefined);
  assert.match(judge(full, "read", path.join(base, "agent/auth.json"), "/", null) ?? "", /inside pi's auth\.json/);
  assert.match(judge(full, "write", path.join(base, "state/x"), "/", null) ?? "", /the pi-matrix state dir/);
  assert.match(judge(full, "read", path.join(base, "agent/sessions/other/s.jsonl"), "/", null) ?? "", /pi's session files/);
  assert.equal(judge(full, "read", own, "/", own), undefined);
  assert.match(judge(full, "write", own, "/", own) ?? "", /pi's session files/);
});

test("no write into a .git (any case), a .pi folder or pi's agent dir; reading them is judged as any read", () => {
  assert.match(judge(envelope, "write", path.join(P, ".git/config"), "/", null) ?? "", /a repository's \.git/);
  assert.match(judge(envelope, "edit", path.join(P, ".GIT/hooks/pre-commit"), "/", null) ?? "", /a repository's \.git/);
  assert.match(judge(envelope, "write", path.join(P, "sub/.pi/extensions/x.ts"), "/", null) ?? "", /a \.pi folder/);
  const full: Envelope = { ...envelope, allowed: [] };
  assert.match(judge(full, "write", path.join(base, "agent/prompts/x.md"), "/", null) ?? "", /pi's agent dir/);
  assert.equal(judge(envelope, "read", path.join(P, ".git/config"), "/", null), undefined);
});

test("a write to a file with another hard link is blocked; a read of it is not", () => {
  const file = path.join(P, "src/linked.txt");
  fs.writeFileSync(file, "l");
  fs.linkSync(file, path.join(base, "outside/linked.txt"));
  assert.match(judge(envelope, "write", file, "/", null) ?? "", /the file has 2 hard links/);
  assert.equal(judge(envelope, "read", file, "/", null), undefined);
});

test("a search of a folder holding a private root: that root's lines are taken out, or all withheld", () => {
  const full: Envelope = { ...envelope, allowed: [] };
  const searched = base;
  const hidden = hiddenFrom(full, searched);
  assert.deepEqual(hidden.sort(), [path.join(base, "agent/auth.json"), path.join(base, "agent/sessions"), path.join(base, "state")].sort());
  const grep = "p/src/a.ts:1: x\nagent/auth.json:1: {}\nagent/sessions/other/s.jsonl:1: {}";
  assert.deepEqual(withoutHidden("grep", grep, searched, hidden), { text: "p/src/a.ts:1: x", removed: 2 });
  const find = "p/src/a.ts\nagent/sessions/other/\nno/such/file";
  assert.match(withoutHidden("find", find, searched, hidden).withheld ?? "", /its line 3 names no file/);
  assert.deepEqual(withoutHidden("grep", "No matches found", searched, hidden), { text: "No matches found", removed: 0 });
});
