// Shared by the bridge's parts: the launch env, atomic writes, the host's inbox, message text.
import * as fs from "node:fs";
import * as path from "node:path";

export const env = process.env;
export const KEY = env.PI_MATRIX_KEY || "";
export const STATE = env.PI_MATRIX_STATE_DIR || "";
export const MAILBOX = env.PI_MATRIX_MAILBOX || "";
const KEY_PATTERN = /^(master|worker)-[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/;

/** True when a pi-matrix host supervises this pi (its key and state dir are in the env). */
export function underHost(): boolean {
  return KEY_PATTERN.test(KEY) && STATE !== "";
}

/** The role of this session's entry: "master", "worker", or "" outside a host. */
export function role(): string {
  if (!underHost()) return "";
  return KEY.startsWith("master-") ? "master" : "worker";
}

export function atomicWrite(file: string, body: string): void {
  const tmp = path.join(path.dirname(file), `.${path.basename(file)}.${process.pid}.tmp`);
  fs.writeFileSync(tmp, body, { mode: 0o600, flag: "wx" });
  fs.renameSync(tmp, file);
}

/** A report to the host's inbox: <state>/mailbox/<key>/<ms>-<rand>.json (Inbox.post's format). */
export function post(kind: string, text: string): void {
  if (!underHost()) return;
  try {
    const dir = path.join(STATE, "mailbox", KEY);
    fs.mkdirSync(dir, { recursive: true, mode: 0o700 });
    const now = Date.now();
    const name = `${String(now).padStart(15, "0")}-${Math.random().toString(16).slice(2, 10)}.json`;
    atomicWrite(path.join(dir, name), JSON.stringify({ kind, text, at: now, sender: "bridge" }));
  } catch {
    // The host notices a silent bridge; a failed report must never take the session down.
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

/** The last assistant message of an agent_end event (undefined if none). */
export function lastAssistant(event: any): any {
  const messages: any[] = (event && event.messages) || [];
  return [...messages].reverse().find((m: any) => m && m.role === "assistant");
}
