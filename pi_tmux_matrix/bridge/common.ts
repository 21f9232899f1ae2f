// Shared by the bridge's parts: the launch env, the state dir's one durable writer and one reader,
// the host's inbox, message text.
import * as fs from "node:fs";
import * as path from "node:path";

export const env = process.env;
export const KEY = env.PI_MATRIX_KEY || "";
export const STATE = env.PI_MATRIX_STATE_DIR || "";
export const MAILBOX = env.PI_MATRIX_MAILBOX || "";
/** A file the bridge appends its debug lines to (docs/bridge.md); unset: no debug lines. */
const DEBUG_FILE = env.PI_MATRIX_BRIDGE_DEBUG || "";
const KEY_PATTERN = /^(master|worker)-[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/;

/** The bridge's debug line: what it caught and went on without (`where`, and the error's message),
 * appended to the file PI_MATRIX_BRIDGE_DEBUG names; nothing at all when that is unset. Never on
 * stdout or stderr, which are pi's terminal. Every `catch` in the bridge that does not rethrow
 * calls this (tests/test_bridge_node.py checks it): nothing is swallowed unseen. */
export function debug(where: string, error?: unknown): void {
  if (DEBUG_FILE === "") return;
  const why = error === undefined ? "" : `: ${error instanceof Error ? error.message : String(error)}`;
  const line = `${new Date().toISOString()} pid ${process.pid} ${KEY || "-"} ${where}${why}`;
  try {
    fs.appendFileSync(DEBUG_FILE, `${line.replace(/[\r\n]+/g, " ")}\n`, { mode: 0o600 });
  } catch {
    // bridge-debug-sink: the debug file itself failed, and there is nowhere else to say so
  }
}

/** The bridge's one truncation: ``text`` whole when it has at most ``limit`` characters, else its
 * start and then ``mark`` (given the whole text's length), ``limit`` characters in all. */
export function truncate(text: string, limit: number, mark: (length: number) => string = () => "..."): string {
  if (text.length <= limit) return text;
  const tail = mark(text.length);
  return text.slice(0, Math.max(0, limit - tail.length)) + tail;
}

/** The mark of a long text cut for the model: how long it was. */
export const TRUNCATED = (length: number): string => `\n…[truncated: ${length} characters]`;

/** True when a pi-matrix host supervises this pi (its key and state dir are in the env). */
export function underHost(): boolean {
  return KEY_PATTERN.test(KEY) && STATE !== "";
}

/** The role of this session's entry: "master", "worker", or "" outside a host. */
export function role(): string {
  if (!underHost()) return "";
  return KEY.startsWith("master-") ? "master" : "worker";
}

const C = fs.constants;
// The flags of the Python side's fsio (docs/on-disk-format.md): a new file is exclusive, 0600 and
// never a symlink followed; a read never follows a symlink and never blocks on a FIFO or device.
const CREATE_FLAGS = C.O_WRONLY | C.O_CREAT | C.O_EXCL | C.O_NOFOLLOW;
const READ_FLAGS = C.O_RDONLY | C.O_NOFOLLOW | C.O_NONBLOCK;
const DIR_FLAGS = C.O_RDONLY | C.O_DIRECTORY | C.O_NOFOLLOW;

/** The bridge's one writer of state-dir files (inbox reports, result artifacts, usage claims, a
 * fork's result), durable like the host's own writes (fsio.durable_write): temp (O_EXCL,
 * O_NOFOLLOW, 0600) -> write -> fsync -> rename -> fsync the folder, so a crash or a power cut
 * leaves the whole old file or the whole new one, and a report the host was told of survives. */
export function durableWrite(file: string, body: string): void {
  const dir = path.dirname(file);
  const tmp = path.join(dir, `.${path.basename(file)}.${process.pid}.tmp`);
  const data = Buffer.from(body, "utf8");
  const fd = fs.openSync(tmp, CREATE_FLAGS, 0o600);
  let renamed = false;
  try {
    try {
      fs.fchmodSync(fd, 0o600); // O_CREAT's mode passes through the umask
      for (let at = 0; at < data.length; ) at += fs.writeSync(fd, data, at, data.length - at);
      fs.fsyncSync(fd);
    } finally {
      fs.closeSync(fd);
    }
    fs.renameSync(tmp, file);
    renamed = true;
    const dirFd = fs.openSync(dir, DIR_FLAGS);
    try {
      fs.fsyncSync(dirFd); // the rename itself survives a crash only once its folder is synced
    } finally {
      fs.closeSync(dirFd);
    }
  } finally {
    if (!renamed) {
      try {
        fs.unlinkSync(tmp);
      } catch (error) {
        debug("durableWrite: removing the temp file", error); // nothing left to remove
      }
    }
  }
}

/** The bridge's one reader of state-dir files (the host's notices), by the host's rules
 * (fsio.read_state_file): never a symlink (the file's or its folder's), never blocked on a FIFO
 * or a device, at most `maxBytes` from `offset`. null when the file is absent; throws for a file
 * that is not a regular one (left untouched). `size` is the file's whole size. */
export function readStateFile(file: string, maxBytes: number, offset = 0): { bytes: Buffer; size: number } | null {
  let fd: number;
  try {
    // node has no openat: the folder is checked just before the open (the state dir is 0700, ours).
    if (fs.lstatSync(path.dirname(file)).isSymbolicLink()) throw new Error(`${path.dirname(file)}: a symlink`);
    fd = fs.openSync(file, READ_FLAGS);
  } catch (error: any) {
    if (error && error.code === "ENOENT") return null;
    throw error;
  }
  try {
    const stat = fs.fstatSync(fd);
    if (!stat.isFile()) throw new Error(`${file}: not a regular file`);
    const length = Math.max(0, Math.min(stat.size - offset, maxBytes));
    const bytes = Buffer.alloc(length);
    let read = 0;
    while (read < length) {
      const got = fs.readSync(fd, bytes, read, length - read, offset + read);
      if (got === 0) break;
      read += got;
    }
    return { bytes: bytes.subarray(0, read), size: stat.size };
  } finally {
    fs.closeSync(fd);
  }
}

/** A report to the host's inbox: <state>/mailbox/<key>/<ms>-<rand>.json (Inbox.post's format). */
export function post(kind: string, text: string): void {
  if (!underHost()) return;
  try {
    const dir = path.join(STATE, "mailbox", KEY);
    fs.mkdirSync(dir, { recursive: true, mode: 0o700 });
    const now = Date.now();
    const name = `${String(now).padStart(15, "0")}-${Math.random().toString(16).slice(2, 10)}.json`;
    durableWrite(path.join(dir, name), JSON.stringify({ kind, text, at: now, sender: "bridge" }));
  } catch (error) {
    // The host notices a silent bridge; a failed report must never take the session down.
    debug(`post: a ${kind} report`, error);
  }
}

export function textOf(message: any): string {
  const content = message && message.content;
  if (typeof content === "string") return content;
  if (Array.isArray(content)) {
    return content.filter((p: any) => p && p.type === "text").map((p: any) => String(p.text || "")).join("");
  }
  return "";
}

/** Each assistant text of an agent_end event's run, in order, the newest kept whole first: at
 * most ``budget`` characters together. A marker answer is not always the run's last text (notices
 * taken as steers are answered after it, in the same run), so the host looks in all of them. */
export function answersOf(event: any, budget: number): string[] {
  const messages: any[] = (event && event.messages) || [];
  const kept: string[] = [];
  let left = budget;
  for (const message of [...messages].reverse()) {
    if (!message || message.role !== "assistant" || left <= 0) continue;
    const text = textOf(message);
    if (!text) continue;
    kept.unshift(text.slice(0, left));
    left -= Math.min(text.length, left);
  }
  return kept;
}

/** The last assistant message of an agent_end event (undefined if none). */
export function lastAssistant(event: any): any {
  const messages: any[] = (event && event.messages) || [];
  return [...messages].reverse().find((m: any) => m && m.role === "assistant");
}
