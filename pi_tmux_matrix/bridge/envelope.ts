// The worker's envelope on stock pi: allowed paths, private roots and the tool ceiling
// (docs/decisions.md#a-workers-envelope-is-enforced-from-outside-pi).
//
// PI_WORKER_ALLOWED_PATHS is "compiled once into a worker session's structural filesystem
// envelope"; `[]` keeps full-machine scope; process tools stay a host-trust boundary.
// Stock pi has no envelope of its own, so the bridge enforces it from the outside: every call of a
// structural tool (read, write, edit, grep, find, ls) is checked in `tool_call`, before it runs,
// and blocked with a reason the model reads as the tool's result. `bash` is NOT covered: it runs
// with the host user's full rights, and the appended system prompt says so rather than pretending
// otherwise.
//
// Paths are judged the way the kernel will see them: pi's own argument expansion (`@`, `~`,
// unicode spaces, relative to the session cwd) and then a component-by-component walk that
// follows symlinks, so `<root>/link/../x` and a dangling link that points outside are caught.
// Containment is by path components, so `/p-evil` is not inside `/p`.
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { KEY, STATE, debug, env, post, role, truncate } from "./common.ts";
import type { ExtensionAPI, ExtensionContext } from "./pi-api.d.ts";

const ENV_ALLOWED = "PI_WORKER_ALLOWED_PATHS";
const MAX_BYTES = 64 * 1024; // the same limits as launch_contract.parse_allowed_paths
const MAX_ITEMS = 256;
const MAX_SHOWN = 300; // characters of a path in a reason or a report
const MAX_SYMLINKS = 40; // Linux's own limit before ELOOP

/** Tools whose path arguments the envelope checks. grep and find recurse; the others do not. */
const STRUCTURAL = new Set(["read", "write", "edit", "grep", "find", "ls"]);
const RECURSIVE = new Set(["grep", "find"]);
const READ_ONLY = new Set(["read", "grep", "find", "ls"]);
/** Tools that start other agents: never granted to a worker, whatever its profile says. */
export const AGENT_LAUNCHING_TOOLS = ["tmux_agent_manager", "fork", "subagent"];

type Root = { real: string; what: string };
export type Envelope = {
  allowed: string[]; // real paths; [] is full scope
  privateRoots: Root[];
  sessionsDirs: string[]; // real paths of pi's session folders (own file excepted for reading)
  agent?: string; // the real agent dir: private for writes, whole
};

function shown(text: string): string {
  return truncate(text, MAX_SHOWN);
}

/** Parse PI_WORKER_ALLOWED_PATHS like launch_contract.parse_allowed_paths: whole or not at all. */
export function parseAllowed(raw: string | undefined): string[] {
  if (raw === undefined || raw === "") return [];
  if (raw.includes("\0")) throw new Error("contains a NUL character");
  if (Buffer.byteLength(raw) > MAX_BYTES) throw new Error(`is over ${MAX_BYTES} bytes`);
  let value: unknown;
  try {
    value = JSON.parse(raw);
  } catch (error) {
    throw new Error(`is not JSON (${(error as Error).message})`);
  }
  if (!Array.isArray(value)) throw new Error(`is a JSON ${value === null ? "null" : typeof value}, not an array`);
  if (value.length > MAX_ITEMS) throw new Error(`has ${value.length} paths (limit ${MAX_ITEMS})`);
  return value.map((item: unknown, index: number) => {
    if (typeof item !== "string" || item === "") throw new Error(`item ${index} is not a non-empty string`);
    if (item.includes("\0")) throw new Error(`item ${index} contains a NUL character`);
    if (!item.startsWith("/")) throw new Error(`item ${index} (${JSON.stringify(shown(item))}) is relative`);
    const parts = item.replace(/\/+$/, "").split("/").slice(1);
    if (parts.some((p) => p === "" || p === "." || p === "..")) {
      throw new Error(`item ${index} (${JSON.stringify(shown(item))}) is not normalised (empty, '.' or '..' part)`);
    }
    return path.normalize(item);
  });
}

/** Where a write of ``absolute`` lands and which folders it makes on the way, as the kernel acts
 * on it after the tool's `mkdir -p` of the parent: symlinks followed one component at a time
 * (dangling ones too), `..` taken physically (after a symlink it means the link target's parent),
 * and a missing component taken as the folder `mkdir -p` makes there. The walk goes on after a
 * missing component: a later `..` climbs back into what exists, and a symlink there is followed
 * (`<root>/new/../link/x` is `link`'s target, as the kernel opens it). */
export function walk(absolute: string): { real: string; made: string[] } {
  const queue = absolute.split("/").filter((p) => p !== "" && p !== ".");
  const made: string[] = [];
  let current = "/";
  let hops = 0;
  while (queue.length > 0) {
    const part = queue.shift() as string;
    if (part === "..") {
      current = path.dirname(current);
      continue;
    }
    const next = path.join(current, part);
    let stat: fs.Stats | null;
    try {
      stat = fs.lstatSync(next);
    } catch (error) {
      debug("envelope: walk (a missing component)", error);
      stat = null; // nothing there yet: the write's mkdir -p makes it a folder (unless it is the file)
    }
    if (stat !== null && stat.isSymbolicLink()) {
      hops += 1;
      if (hops > MAX_SYMLINKS) throw new Error("too many levels of symbolic links");
      const target = fs.readlinkSync(next);
      queue.unshift(...target.split("/").filter((p) => p !== "" && p !== "."));
      if (target.startsWith("/")) current = "/";
      continue; // a relative target is resolved from the link's own folder, `current`
    }
    if (stat === null && queue.length > 0 && !made.includes(next)) made.push(next);
    current = next;
  }
  return { real: current, made };
}

/** The absolute path the kernel will act on (see :func:`walk`). */
export function physical(absolute: string): string {
  return walk(absolute).real;
}

/** What no worker may write whatever its allowed paths: code and prompts pi or git would load with
 * full rights in the next session (any `.pi` folder: extensions, SYSTEM.md, settings, prompts,
 * skills), and pi's agent dir whole; and any `.git` entry
 * (docs/decisions.md#git-is-never-trusted-in-a-lane). A `.git` *file* is a pointer
 * (`gitdir: <folder>`): git takes its config (`core.fsmonitor`, hooks, filters) from wherever it
 * points, so writing the file is as bad as writing `.git/config`. Every path git reads as a repository's
 * config, hooks or gitdir pointer is reached through a `.git` entry (a bare-shaped folder is
 * refused by the product's git itself: `safe.bareRepository=explicit`, gitcmd.py). The name is
 * compared case-insensitively: on a case-insensitive filesystem `.GIT` is `.git`. */
function writePrivate(real: string, agent: string): string | undefined {
  const parts = real.split("/");
  if (agent !== "" && inside(real, agent)) return `pi's agent dir (${shown(agent)})`;
  if (parts.includes(".pi")) return "a .pi folder (extensions, prompts and settings the next pi loads)";
  if (parts.some((part) => part.toLowerCase() === ".git")) {
    return "a repository's .git (its config, hooks and gitdir pointer, which the next git command reads and runs)";
  }
  return undefined;
}

function inside(candidate: string, root: string): boolean {
  if (root === "/") return true;
  return candidate === root || candidate.startsWith(`${root}/`);
}

// pi's own argument handling (dist/core/tools/path-utils.js), so we judge the path pi will open.
const UNICODE_SPACES = /[\u00A0\u2000-\u200A\u202F\u205F\u3000]/g;

function expandLikePi(raw: string): string {
  const normalized = (raw.startsWith("@") ? raw.slice(1) : raw).replace(UNICODE_SPACES, " ");
  if (normalized === "~") return os.homedir();
  if (normalized.startsWith("~/")) return os.homedir() + normalized.slice(1);
  return normalized;
}

function resolveLikePi(raw: string, cwd: string): string {
  const expanded = expandLikePi(raw);
  // An absolute path goes to the kernel as written (its `..` taken physically); a relative one
  // is joined and normalised first, as pi's resolveToCwd does.
  return path.isAbsolute(expanded) ? expanded : path.resolve(cwd, expanded);
}

/** The read tool also tries macOS screenshot spellings of a missing file: judge the one it opens. */
function readTarget(raw: string, cwd: string): string {
  const resolved = resolveLikePi(raw, cwd);
  const exists = (p: string) => {
    try {
      fs.accessSync(p, fs.constants.F_OK);
      return true;
    } catch (error) {
      debug("envelope: readTarget (no such file)", error);
      return false;
    }
  };
  if (exists(resolved)) return resolved;
  const amPm = resolved.replace(/ (AM|PM)\./gi, "\u202F$1.");
  const nfd = resolved.normalize("NFD");
  const curly = resolved.replace(/'/g, "\u2019");
  const nfdCurly = nfd.replace(/'/g, "\u2019");
  for (const variant of [amPm, nfd, curly, nfdCurly]) {
    if (variant !== resolved && exists(variant)) return variant;
  }
  return resolved;
}

function agentDir(): string {
  const configured = env.PI_CODING_AGENT_DIR;
  if (configured) {
    // pi's getAgentDir expands a leading `~` (and nothing else).
    if (configured === "~") return os.homedir();
    return path.resolve(configured.startsWith("~/") ? os.homedir() + configured.slice(1) : configured);
  }
  return path.join(os.homedir(), ".pi", "agent");
}

/** Compile the envelope from the launch env once; throws (naming the problem) if it is malformed. */
export function compileEnvelope(cwd: string): Envelope {
  let allowedRaw: string[];
  try {
    allowedRaw = parseAllowed(env[ENV_ALLOWED]);
  } catch (error) {
    throw new Error(
      `${ENV_ALLOWED} ${(error as Error).message}; set it to a JSON array of absolute paths, e.g. ["/work/repo"], or [] for full scope`,
    );
  }
  const agent = agentDir();
  const privateRoots: Root[] = [
    { real: physical(path.join(agent, "auth.json")), what: "pi's auth.json" },
    { real: physical(path.join(agent, "settings.json")), what: "pi's settings.json" },
    { real: physical(path.join(agent, "models.json")), what: "pi's models.json" },
    // A profile decides a later worker's tools and scope: writing one would widen them.
    { real: physical(path.join(agent, "launch_profiles")), what: "the launch profiles" },
    // pi and pi-matrix both read the project's settings (extensions, processMatrix.enabled).
    { real: physical(path.join(cwd, ".pi", "settings.json")), what: "the project's .pi/settings.json" },
  ];
  if (STATE) {
    privateRoots.push({ real: physical(path.resolve(STATE)), what: "the pi-matrix state dir (entries, jobs, mailboxes)" });
  }
  const sessionsDirs = [physical(path.join(agent, "sessions"))];
  if (env.PI_CODING_AGENT_SESSION_DIR) sessionsDirs.push(physical(path.resolve(env.PI_CODING_AGENT_SESSION_DIR)));
  return { allowed: allowedRaw.map(physical), privateRoots, sessionsDirs, agent: physical(agent) };
}

/** Why ``tool`` may not touch ``raw`` (undefined: allowed). ``ownSession``: this session's file. */
export function judge(
  envelope: Envelope,
  tool: string,
  raw: string,
  cwd: string,
  ownSession: string | null,
): string | undefined {
  let real: string;
  let made: string[];
  try {
    ({ real, made } = walk(tool === "read" ? readTarget(raw, cwd) : resolveLikePi(raw, cwd)));
  } catch (error) {
    return `pi-matrix envelope: ${tool} of ${JSON.stringify(shown(raw))} is blocked: ${(error as Error).message}.`;
  }
  const where = real === raw ? JSON.stringify(shown(raw)) : `${JSON.stringify(shown(raw))} (really ${shown(real)})`;
  const own = ownSession ? physical(ownSession) : null;
  if (own !== null && real === own && READ_ONLY.has(tool)) return undefined; // its own transcript
  // A write also makes the missing folders on its way: each must be as allowed as the file.
  const touched = READ_ONLY.has(tool) ? [real] : [...made, real];
  for (const target of touched) {
    const reason = judgeOne(envelope, tool, target, where);
    if (reason !== undefined) return reason;
  }
  return READ_ONLY.has(tool) ? undefined : hardLinked(tool, real, where);
}

/** The envelope judges paths, not inodes (docs/decisions.md#the-envelope-judges-paths-not-inodes).
 * pi's write and edit open the path and truncate it in place (fs.writeFile), so a hard link
 * already present in an allowed path would carry the write to every other name of that file,
 * wherever it is. A worker's tools cannot make a hard link (only `bash`, the host-trust boundary,
 * can), so refusing a write to a regular file with more than one link closes the write side; a
 * read through one still reaches its content. */
function hardLinked(tool: string, real: string, where: string): string | undefined {
  let links: number;
  try {
    const stat = fs.lstatSync(real);
    if (!stat.isFile()) return undefined;
    links = stat.nlink;
  } catch (error) {
    debug("envelope: hardLinked (a new file)", error);
    return undefined; // a new file: it gets a fresh inode of its own
  }
  if (links <= 1) return undefined;
  return (
    `pi-matrix envelope: ${tool} of ${where} is blocked: the file has ${links} hard links, so a write ` +
    "would also change the same file under its other names, which may lie outside this worker's allowed paths. " +
    "Report that it needs changing; a person can break the link (copy the file over itself) first."
  );
}

function judgeOne(envelope: Envelope, tool: string, real: string, where: string): string | undefined {
  // A search of a folder that holds a private root is not blocked: what the search returns from
  // inside that root is taken out of its result (see hiddenFrom and the tool_result handler).
  for (const root of envelope.privateRoots) {
    if (inside(real, root.real)) {
      return (
        `pi-matrix envelope: ${tool} of ${where} is blocked: it is inside ` +
        `${root.what} (${shown(root.real)}), which no worker may touch whatever its allowed paths.`
      );
    }
  }
  for (const sessions of envelope.sessionsDirs) {
    if (inside(real, sessions)) {
      return (
        `pi-matrix envelope: ${tool} of ${where} is blocked: pi's session files (${shown(sessions)}) belong to ` +
        "other sessions; only this session's own file may be read."
      );
    }
  }
  if (!READ_ONLY.has(tool)) {
    const what = writePrivate(real, envelope.agent ?? "");
    if (what !== undefined) {
      return `pi-matrix envelope: ${tool} of ${where} is blocked: it writes into ${what}, which no worker may change whatever its allowed paths.`;
    }
  }
  if (envelope.allowed.length === 0 || envelope.allowed.some((root) => inside(real, root))) return undefined;
  const roots = envelope.allowed.slice(0, 8).map(shown).join(", ") + (envelope.allowed.length > 8 ? ", ..." : "");
  return (
    `pi-matrix envelope: ${tool} of ${where} is blocked: it is outside this worker's allowed paths (${roots}). ` +
    "Work inside them, or report that the task needs more."
  );
}

function exists(p: string): boolean {
  try {
    fs.lstatSync(p);
    return true;
  } catch (error) {
    debug("envelope: exists (no)", error);
    return false;
  }
}

/** The private roots and other sessions' folders that exist inside ``searched`` (a real path): a
 * recursive search there runs, and whatever it returns from inside them is taken out. */
export function hiddenFrom(envelope: Envelope, searched: string): string[] {
  const roots = [...envelope.privateRoots.map((r) => r.real), ...envelope.sessionsDirs];
  return roots.filter((root) => root !== searched && inside(root, searched) && exists(root));
}

// How pi 0.73.1 prints a search (dist/core/tools/grep.js, find.js): grep one `path:N: text` line
// per match and `path-N- text` per context line, find one path per line (a folder may end in
// `/`), both relative to the searched folder, then optionally a blank line and one `[...]` notice
// built from the sentences below. Nothing in that text marks where a path ends: a file name may
// hold a newline (pi names a session folder after a cwd that holds one), `:5: `, or start with
// `[`. So every line must name a file that exists, exactly, or the whole result is withheld.
const SEPARATOR = /([:-])(\d+)\1 /g;
const NOTICE_SENTENCE =
  String.raw`(?:\d+ (?:matches|results) limit reached(?:\. Use limit=\d+ for more, or refine pattern)?` +
  String.raw`|\d+(?:\.\d+)?(?:B|KB|MB) limit reached` +
  String.raw`|Some lines truncated to \d+ chars\. Use read tool to see full lines)`;
const NOTICE = new RegExp(String.raw`^\[${NOTICE_SENTENCE}(?:\. ${NOTICE_SENTENCE})*\]$`);
/** What splits a line: pi's grep output on `\n`; its find reads fd's output by line (`\r` too). */
const LINE_BREAK = /[\n\r]/;
/** pi's whole text when nothing matched. */
const NOTHING = new Set(["No matches found", "No files found matching pattern"]);

export type Filtered = { text: string; removed: number; withheld?: string };

/** Where ``name`` (a path pi printed relative to ``searched``) physically is, or null when it is
 * not one existing entry of the searched tree (``file``: a grep match names a file, never a folder). */
function entryOf(name: string, searched: string, file: boolean): string | null {
  if (name === "" || name.startsWith("/")) return null;
  if (name.split("/").some((part) => part === "..")) return null; // pi prints none: not its own
  const full = path.join(searched, name);
  let stat: fs.Stats;
  try {
    stat = fs.lstatSync(full);
  } catch (error) {
    debug("envelope: a search line's entry", error);
    return null; // half of a name split by a newline, or a file gone since: not attributable
  }
  if (file && stat.isDirectory()) return null;
  try {
    return physical(full); // a symlink into a private root is judged where it leads
  } catch (error) {
    debug("envelope: a search line's entry (a symlink loop)", error);
    // A symlink loop: the search did not follow it, so the entry is where it stands.
    try {
      return path.join(physical(path.dirname(full)), path.basename(full));
    } catch (error) {
      debug("envelope: a search line's entry's folder", error);
      return null;
    }
  }
}

/** A grep or find result with every line from inside ``hidden`` removed, or ``withheld`` (why)
 * when some line cannot be attributed to exactly one existing entry of the searched tree: then
 * nothing of the result may reach the model (fail closed:
 * docs/decisions.md#search-results-are-attributed-or-withheld). */
export function withoutHidden(tool: string, text: string, searched: string, hidden: string[]): Filtered {
  if (NOTHING.has(text)) return { text, removed: 0 };
  const broken = (why: string): Filtered => ({ text: "", removed: 0, withheld: why });
  if (hidden.some((root) => LINE_BREAK.test(root))) return broken("a private folder's own path holds a line break");
  // pi's grep prints a bare file name for a path relative to the search that starts with `..`
  // (it takes it for one outside): a private folder there would lose its prefix.
  if (tool === "grep" && hidden.some((root) => path.relative(searched, root).startsWith(".."))) {
    return broken("a private folder's name starts with '..', which pi's grep prints as a bare file name");
  }
  // A split line's first half may itself name an entry inside a private folder (`--w--` beside
  // `--w--\nd--`); its folder then holds the name with the line break, which is looked for.
  const listed = new Map<string, boolean>();
  const splitBeside = (real: string): boolean => {
    const folder = path.dirname(real);
    let found = listed.get(folder);
    if (found === undefined) {
      try {
        found = fs.readdirSync(folder).some((name) => LINE_BREAK.test(name));
      } catch (error) {
        debug("envelope: listing a private folder (taken as holding a line break)", error);
        found = true; // cannot look: take the worst
      }
      listed.set(folder, found);
    }
    return found;
  };
  let lines = text.split("\n");
  let notice: string[] = [];
  const last = lines.length - 1;
  if (last >= 2 && lines[last - 1] === "" && NOTICE.test(lines[last])) {
    notice = lines.slice(last - 1);
    lines = lines.slice(0, last - 1);
  }
  let removed = 0;
  const kept: string[] = [];
  for (const [index, line] of lines.entries()) {
    const names =
      tool === "grep"
        ? [...line.matchAll(SEPARATOR)].filter((m) => (m.index ?? 0) > 0).map((m) => line.slice(0, m.index))
        : [line.endsWith("/") ? line.slice(0, -1) : line];
    // Where the text after `:N: ` holds another `:M: `, a longer prefix may name a file too:
    // every prefix that does is judged, and any one inside a private folder hides the line.
    const entries = names.map((name) => entryOf(name, searched, tool === "grep")).filter((e) => e !== null);
    if (entries.length === 0) {
      return broken(
        `its line ${index + 1} names no file of the searched folder (a name holding a line break, or a file changed meanwhile)`,
      );
    }
    const inPrivate = entries.filter((real) => hidden.some((root) => inside(real as string, root))) as string[];
    if (inPrivate.some(splitBeside)) {
      return broken(`its line ${index + 1} is from a private folder that holds a name with a line break`);
    }
    if (inPrivate.length > 0) removed += 1;
    else kept.push(line);
  }
  return { text: [...kept, ...notice].join("\n"), removed };
}

/** What the tool_result handler returns for a grep or find whose searched folder holds the
 * private folders ``hidden`` (undefined: the result goes to the model unchanged). Whatever goes
 * wrong here withholds the result: pi passes a result on unchanged when a handler throws. */
export function filterSearch(tool: string, event: any, searched: string, hidden: string[]): any {
  const where = hidden.map(shown).join(", ");
  const withhold = (why: string) => ({
    content: [
      {
        type: "text",
        text:
          `pi-matrix envelope: this ${tool} result was withheld: ${why}, and the search covers private ` +
          `folders (${where}) whose contents no worker may see. Search a folder that holds none of them.`,
      },
    ],
    details: {},
    isError: true,
    withheld: why,
  });
  try {
    const parts: any[] = Array.isArray(event && event.content) ? event.content : [];
    if (event && event.isError) {
      // ripgrep's own messages name the files it could not read, private ones included (by
      // absolute path: pi hands it one); a message naming no path at all goes on.
      const said = parts.map((p) => (p && typeof p.text === "string" ? p.text : "")).join("\n");
      if (!said.includes("/")) return undefined;
      return withhold("its error message may name files inside them");
    }
    let removed = 0;
    const content: any[] = [];
    for (const part of parts) {
      if (!part || part.type !== "text" || typeof part.text !== "string") {
        return withhold("it holds a part that is not text");
      }
      const filtered = withoutHidden(tool, part.text, searched, hidden);
      if (filtered.withheld !== undefined) return withhold(filtered.withheld);
      removed += filtered.removed;
      content.push({ ...part, text: filtered.text });
    }
    if (removed === 0) return undefined;
    const note = `[pi-matrix envelope: ${removed} line(s) from private folders (${where}) were left out]`;
    // pi keeps a truncated result's whole text in details.truncation.content, and the session
    // file (which the worker may read) keeps details: only the counts go on.
    const details = event && typeof event.details === "object" && event.details ? event.details : {};
    const kept: Record<string, unknown> = { filtered: removed };
    for (const key of ["matchLimitReached", "resultLimitReached", "linesTruncated"]) {
      if (typeof details[key] === "number" || typeof details[key] === "boolean") kept[key] = details[key];
    }
    if (details.truncation && typeof details.truncation === "object") {
      kept.truncation = { truncated: true, maxBytes: details.truncation.maxBytes };
    }
    return { content: [...content, { type: "text", text: note }], details: kept, removed };
  } catch (error) {
    return withhold(`it could not be checked (${(error as Error).message})`);
  }
}

function sentence(text: string, limit = 400): string {
  return truncate(text, limit);
}

/** The appended system prompt: who the worker is, its scope, its lane, no spawning; bounded. */
export function workerPrompt(envelope: Envelope, cwd: string): string {
  const agent = env.PI_ORCHESTRATION_AGENT_ID || KEY;
  const profile = env.PI_MATRIX_PROFILE || "unnamed";
  const task = env.PI_TASK_REF ? `, working on task ${env.PI_TASK_REF}` : "";
  const roots = envelope.allowed.slice(0, 8).join(", ") + (envelope.allowed.length > 8 ? ", ..." : "");
  const scope =
    envelope.allowed.length === 0
      ? "Your file tools (read, write, edit, grep, find, ls) may reach any path except pi's auth, settings and models files, other sessions' files and the pi-matrix state dir, which are always blocked."
      : `Your file tools (read, write, edit, grep, find, ls) may only touch paths inside ${roots}; anything else, and always pi's auth, settings and models files, other sessions' files and the pi-matrix state dir, is blocked.`;
  const lane = env.PI_WORKTREE_LANE
    ? `Your lane is ${env.PI_WORKTREE_LANE}, with its own worktree at ${cwd}; keep your work there.`
    : `You have no worktree lane; your working directory is ${cwd}.`;
  return [
    "## pi-matrix worker",
    sentence(`You are pi-matrix worker ${agent} (launch profile ${profile}, entry ${KEY})${task}.`),
    sentence(scope, 900),
    "No worker may write into a .pi folder, any .git file or folder (a repository's config, hooks and gitdir pointer), or pi's agent dir: code and prompts there run in later sessions.",
    "The bash tool, where you have it, is not covered by this envelope: it runs with the full rights of the host user, so it is a trust boundary, not a sandbox; keep to the same scope there.",
    sentence(lane),
    "Do not start other agents, forks or pi sessions (by any tool or command); if the task needs more hands, say so in your answer.",
  ].join("\n");
}

export function installEnvelope(pi: ExtensionAPI): void {
  // A fork child is not a worker (no host, full scope: a confined worker may not fork at all),
  // but it gets the same private roots and never-writable folders.
  const forkChild = env.PI_FORK === "1" && Boolean(env.PI_FORK_RESULT_PATH);
  if (role() !== "worker" && !forkChild) return;
  let envelope: Envelope | null = null;
  let refused: string | null = null;
  let cwd = process.cwd();

  function sessionCwd(ctx: ExtensionContext | null): string {
    const fromCtx = ctx && typeof ctx.cwd === "string" && ctx.cwd ? ctx.cwd : null;
    let fromHeader: string | null = null;
    try {
      const header = ctx && ctx.sessionManager && ctx.sessionManager.getHeader && ctx.sessionManager.getHeader();
      fromHeader = header && typeof header.cwd === "string" ? header.cwd : null;
    } catch (error) {
      debug("envelope: the session header's cwd", error);
      fromHeader = null;
    }
    return fromCtx || fromHeader || process.cwd();
  }

  function compile(ctx: ExtensionContext | null): void {
    cwd = sessionCwd(ctx);
    try {
      envelope = compileEnvelope(cwd);
      refused = null;
    } catch (error) {
      envelope = null;
      refused = `pi-matrix envelope: this worker session refuses to run: ${(error as Error).message}`;
    }
  }

  pi.on("session_start", async (_event, ctx) => {
    compile(ctx);
    if (refused !== null) {
      // Never a session without its envelope: no input reaches the model, every tool is blocked,
      // and pi leaves through its shutdown hooks with a failing exit status.
      post("bridge", JSON.stringify({ event: "envelope_refused", reason: refused }));
      process.stderr.write(`${refused}\n`);
      process.on("exit", () => {
        process.exitCode = 1;
      });
      try {
        pi.setActiveTools([]);
      } catch (error) {
        debug("envelope: clearing the tools of a refused session", error);
        // the tool_call block below still holds
      }
      try {
        ctx.shutdown();
      } catch (error) {
        debug("envelope: shutting a refused session down", error);
        process.exit(1);
      }
      return;
    }
    try {
      // The ceiling: agent-launching tools are never active in a worker, even if registered.
      const active: string[] = pi.getActiveTools();
      const kept = active.filter((name) => !AGENT_LAUNCHING_TOOLS.includes(name));
      if (kept.length !== active.length) pi.setActiveTools(kept);
    } catch (error) {
      debug("envelope: the tool ceiling", error);
      // the tool_call block below still holds
    }
  });

  pi.on("input", async () => (refused !== null ? { action: "handled" } : undefined));

  pi.on("before_agent_start", async (event) => {
    if (envelope === null || forkChild) return undefined; // a fork has its own system prompt
    return { systemPrompt: `${event.systemPrompt || ""}\n\n${workerPrompt(envelope, cwd)}` };
  });

  function block(tool: string, shownPath: string | null, reason: string) {
    post("bridge", JSON.stringify({ event: "tool_blocked", tool, path: shownPath === null ? null : shown(shownPath), reason }));
    return { block: true, reason };
  }

  pi.on("tool_result", async (event, ctx) => {
    const tool = String((event && event.toolName) || "");
    if (envelope === null || !RECURSIVE.has(tool)) return undefined;
    const input = (event && event.input) || {};
    const raw = typeof input.path === "string" ? input.path : ".";
    let searched: string;
    let hidden: string[];
    try {
      searched = physical(resolveLikePi(raw, sessionCwd(ctx)));
      hidden = hiddenFrom(envelope, searched);
    } catch (error) {
      debug("envelope: a search's folder (its call was blocked)", error);
      return undefined; // the call itself was blocked (judge walks the same path)
    }
    if (hidden.length === 0) return undefined;
    const result = filterSearch(tool, event, searched, hidden);
    if (result === undefined) return undefined;
    const { withheld, removed, ...changed } = result;
    if (withheld !== undefined) post("bridge", JSON.stringify({ event: "search_withheld", tool, reason: withheld }));
    else post("bridge", JSON.stringify({ event: "search_filtered", tool, removed }));
    return changed;
  });

  pi.on("tool_call", async (event, ctx) => {
    const tool = String((event && event.toolName) || "");
    if (envelope === null && refused === null) compile(ctx); // a call before session_start: fail safe
    if (refused !== null || envelope === null) return block(tool, null, refused || "pi-matrix envelope: not compiled");
    if (AGENT_LAUNCHING_TOOLS.includes(tool)) {
      return block(tool, null, `pi-matrix envelope: ${tool} starts other agents, which a worker may never do; report back instead.`);
    }
    if (!STRUCTURAL.has(tool)) return undefined; // bash and the rest: the host-trust boundary
    const input = (event && event.input) || {};
    const raws: string[] = [];
    for (const name of ["path", "file_path"]) {
      const value = input[name];
      if (value === undefined || value === null) continue;
      if (typeof value !== "string") {
        return block(tool, null, `pi-matrix envelope: ${tool}'s ${name} argument is not a string.`);
      }
      raws.push(value);
    }
    // grep, find and ls default to the session's cwd when no path is given.
    if (raws.length === 0) raws.push(".");
    let own: string | null = null;
    try {
      own = ctx.sessionManager.getSessionFile() || null;
    } catch (error) {
      debug("envelope: this session's file", error);
      own = null;
    }
    const here = sessionCwd(ctx);
    for (const raw of raws) {
      const reason = judge(envelope, tool, raw, here, own);
      if (reason !== undefined) return block(tool, raw, reason);
    }
    return undefined;
  });
}
