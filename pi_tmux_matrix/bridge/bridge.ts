// pi-matrix bridge: the small pi extension that connects a pi session to its pi-matrix host.
//
// Loaded with `pi -e <this file>` by the pi launch profiles. Under a host (PI_MATRIX_KEY and
// PI_MATRIX_STATE_DIR set) it:
//   * reports pi's real session id and session file to the host (an "identity" message);
//   * delivers the host's notices (PI_MATRIX_MAILBOX, one JSON object per line) into the session:
//     steer/prompt as user messages (steering while busy), abort, and shutdown (a clean exit);
//   * writes a result artifact on every agent_end (final assistant text, stop reason, usage) and
//     tells the host where it is (a "result" message);
//   * makes SIGTERM graceful (pi's shutdown hooks run).
// Outside a host it does nothing. Writes are small, synchronous and atomic (temp + rename); no
// dependency beyond node and pi's own extension API.
import * as fs from "node:fs";
import * as path from "node:path";
import { KEY, MAILBOX, STATE, atomicWrite, lastAssistant, post, textOf, underHost } from "./common.ts";
import { installEnvelope } from "./envelope.ts";
import { installFork } from "./fork.ts";
import { handoffDelivery, installMaster } from "./master.ts";

export default function (pi: any) {
  // A fork child (PI_FORK=1) writes its result.json and exits after its one run, host or not.
  installFork(pi);
  // The envelope: a worker's under its host; a fork child's (private roots only) without one.
  installEnvelope(pi);
  if (!underHost()) return;
  installMaster(pi);
  let ctxRef: any = null;
  let offset = 0;
  let runs = 0;
  let timer: ReturnType<typeof setInterval> | null = null;

  function deliver(notice: any): void {
    const kind = String(notice.type || "");
    const text = String(notice.message || "");
    const ctx = ctxRef;
    if (!ctx) return;
    try {
      if (kind === "shutdown") {
        ctx.shutdown();
      } else if (kind === "abort") {
        if (typeof ctx.abort === "function") ctx.abort();
      } else if (kind === "handoff") {
        if (handoffDelivery.deliver !== null) handoffDelivery.deliver(notice);
      } else if (kind === "steer" || kind === "prompt") {
        const body = `[pi-matrix ${kind}] ${text}`;
        if (ctx.isIdle()) pi.sendUserMessage(body);
        else pi.sendUserMessage(body, { deliverAs: kind === "steer" ? "steer" : "followUp" });
      }
    } catch {
      // A notice that cannot be delivered now is not retried: the host recorded it.
    }
  }

  function poll(): void {
    if (!MAILBOX) return;
    let size = 0;
    try {
      size = fs.statSync(MAILBOX).size;
    } catch {
      return;
    }
    if (size <= offset) return;
    const fd = fs.openSync(MAILBOX, "r");
    try {
      const buffer = Buffer.alloc(Math.min(size - offset, 1 << 20));
      const read = fs.readSync(fd, buffer, 0, buffer.length, offset);
      const chunk = buffer.subarray(0, read).toString("utf8");
      const end = chunk.lastIndexOf("\n");
      if (end < 0) return;
      offset += Buffer.byteLength(chunk.slice(0, end + 1));
      for (const line of chunk.slice(0, end).split("\n")) {
        try {
          deliver(JSON.parse(line));
        } catch {
          // a torn or foreign line: skipped
        }
      }
    } finally {
      fs.closeSync(fd);
    }
  }

  pi.on("session_start", async (_event: any, ctx: any) => {
    ctxRef = ctx;
    // Notices already there belong to before this session started: only new ones are delivered.
    try {
      offset = MAILBOX ? fs.statSync(MAILBOX).size : 0;
    } catch {
      offset = 0;
    }
    const sm = ctx.sessionManager;
    post("identity", JSON.stringify({ sessionId: sm.getSessionId(), sessionFile: sm.getSessionFile() || null }));
    if (timer === null) {
      timer = setInterval(poll, 250);
      if (typeof timer.unref === "function") timer.unref();
    }
  });

  pi.on("agent_end", async (event: any, ctx: any) => {
    runs += 1;
    const last = lastAssistant(event);
    const artifact = {
      key: KEY,
      run: runs,
      at: Date.now(),
      sessionId: ctx.sessionManager.getSessionId(),
      sessionFile: ctx.sessionManager.getSessionFile() || null,
      text: textOf(last).slice(0, 16000),
      stopReason: last ? last.stopReason || null : null,
      usage: last ? last.usage || null : null,
    };
    try {
      const dir = path.join(STATE, "artifacts", KEY);
      fs.mkdirSync(dir, { recursive: true, mode: 0o700 });
      const file = path.join(dir, `run-${String(runs).padStart(4, "0")}.json`);
      atomicWrite(file, JSON.stringify(artifact));
      post("result", JSON.stringify({ path: file, run: runs, stopReason: artifact.stopReason }));
    } catch {
      // no artifact: the job's watcher still sees the marker or the exit
    }
  });

  pi.on("session_shutdown", async () => {
    post("bridge", JSON.stringify({ event: "session_shutdown" }));
    if (timer !== null) clearInterval(timer);
    timer = null;
  });

  // With a SIGTERM listener pi exits 0 through its shutdown hooks instead of dying by signal.
  process.on("SIGTERM", () => {
    try {
      if (ctxRef) ctxRef.shutdown();
      else process.exit(0);
    } catch {
      process.exit(0);
    }
  });
}
