// pi-matrix bridge: the small pi extension that connects a pi session to its pi-matrix host.
//
// Loaded with `pi -e <this file>` by the pi launch profiles. Under a host (PI_MATRIX_KEY and
// PI_MATRIX_STATE_DIR set) it:
//   * reports pi's real session id and session file to the host (an "identity" message);
//   * delivers the host's notices (PI_MATRIX_MAILBOX, one JSON object per line) into the session,
//     as they are appended (fs.watch, i.e. inotify; a 250 ms poll is the safety net):
//     steer/prompt as user messages (a steer or follow-up while busy, one at a time while idle;
//     see delivery.ts), each acknowledged once pi's conversation has it; abort, and shutdown (a
//     clean exit);
//   * writes a result artifact on every agent_end (final assistant text, the run's answers, stop
//     reason, usage) and tells the host where it is (a "result" message);
//   * claims the job round's usage for its worker (usage.ts): pi's own usage records, summed;
//   * makes SIGTERM graceful (pi's shutdown hooks run).
// Outside a host it does nothing. Writes are small, synchronous and durable (temp, fsync, rename,
// fsync the folder: common.ts durableWrite); reads keep the state dir's rules (readStateFile); no
// dependency beyond node and pi's own extension API.
import * as fs from "node:fs";
import * as path from "node:path";
import { KEY, MAILBOX, STATE, answersOf, debug, durableWrite, lastAssistant, post, readStateFile, textOf, underHost } from "./common.ts";
import { Delivery, type Item, type Mode } from "./delivery.ts";
import { UsageClaim } from "./usage.ts";
import { installEnvelope } from "./envelope.ts";
import type { ExtensionAPI, ExtensionContext } from "./pi-api.d.ts";
import { installFork } from "./fork.ts";
import { forkResultDelivery, installForkTool } from "./forktool.ts";
import { handoffDelivery, installMaster } from "./master.ts";

export default function (pi: ExtensionAPI) {
  // A fork child (PI_FORK=1) writes its result.json and exits after its one run, host or not.
  installFork(pi);
  // The envelope: a worker's under its host; a fork child's (private roots only) without one.
  installEnvelope(pi);
  // pi >= 0.79 asks "Trust project folder?" before it loads a project's .pi/ resources; an
  // extension given with -e is asked first. pi-matrix decided at launch (PI_MATRIX_PROJECT_TRUST:
  // "no" for every worker, the master's per processMatrix.masterProjectTrust); unset, pi decides
  // (its trust.json, defaultProjectTrust, or its dialog). An older pi never emits the event.
  const trust = process.env.PI_MATRIX_PROJECT_TRUST;
  if (trust === "yes" || trust === "no") {
    pi.on("project_trust", async () => ({ trusted: trust, remember: false }));
  }
  if (!underHost()) return;
  let ctxRef: ExtensionContext | null = null;
  let offset = 0;
  let runs = 0;
  let timer: ReturnType<typeof setInterval> | null = null;
  let watcher: fs.FSWatcher | null = null;
  let woken = false; // a tick is scheduled for the watch's burst of events
  const usage = new UsageClaim();
  // A ctx gone stale (pi shutting down, a session replaced) throws: then nothing is sent.
  const delivery = new Delivery(() => {
    try {
      return Boolean(ctxRef && ctxRef.isIdle());
    } catch (error) {
      debug("bridge: ctx.isIdle (a stale ctx: taken as busy)", error);
      return false;
    }
  });
  installMaster(pi, delivery);
  // The fork tool (not in a fork child; a worker's envelope takes it away again).
  installForkTool(pi, delivery);

  /** An owner's steer or prompt: a user message (the owner's own words), acknowledged to the
   * host once pi's conversation has it. */
  function userMessage(kind: string, text: string, id: string): Item {
    const body = `[pi-matrix ${kind}] ${text}`;
    return {
      id,
      kind,
      send(mode: Mode): void {
        if (mode === "idle") pi.sendUserMessage(body);
        else pi.sendUserMessage(body, { deliverAs: mode });
      },
      matches: (message: any) => Boolean(message) && message.role === "user" && textOf(message) === body,
      taken: () => post("bridge", JSON.stringify({ event: "notice_taken", id, kind })),
    };
  }

  function deliver(notice: any, at: number): void {
    const kind = String(notice.type || "");
    const text = String(notice.message || "");
    const ctx = ctxRef;
    if (!ctx) return;
    try {
      if (kind === "shutdown") {
        ctx.shutdown();
      } else if (kind === "abort") {
        delivery.keptByPi();
        if (typeof ctx.abort === "function") ctx.abort();
      } else if (kind === "handoff") {
        if (handoffDelivery.deliver !== null) handoffDelivery.deliver(notice);
      } else if (kind === "fork_result") {
        if (forkResultDelivery.deliver !== null) forkResultDelivery.deliver(notice);
      } else if (kind === "steer" || kind === "prompt") {
        // The host's id for the notice; a host without ids: the notice's place in the file.
        delivery.add(userMessage(kind, text, String(notice.id || `${kind}@${at}`)));
      }
    } catch (error) {
      debug("bridge: delivering a notice", error);
      // A notice that cannot be delivered now is not retried: the host recorded it.
    }
  }

  function poll(): void {
    if (!MAILBOX) return;
    let read: { bytes: Buffer; size: number } | null;
    try {
      // A FIFO, a symlink or a device where the notices file should be is never read (a FIFO
      // would block pi itself): no notices until it is a regular file again.
      read = readStateFile(MAILBOX, 1 << 20, offset);
    } catch (error) {
      debug("bridge: reading the notices file", error);
      return;
    }
    if (read === null || read.size <= offset) return;
    const chunk = read.bytes.toString("utf8");
    const end = chunk.lastIndexOf("\n");
    if (end < 0) return;
    let at = offset;
    offset += Buffer.byteLength(chunk.slice(0, end + 1));
    for (const line of chunk.slice(0, end).split("\n")) {
      try {
        deliver(JSON.parse(line), at);
      } catch (error) {
        debug("bridge: a notices line skipped", error);
        // a torn or foreign line: skipped
      }
      at += Buffer.byteLength(line) + 1;
    }
  }

  function tick(): void {
    poll();
    delivery.pump();
  }

  /** Follow the notices file by inotify: a handoff or prompt is read as it is appended, not at
   * the next poll (a result reaches an idle master in <= 1 s:
   * docs/decisions.md#handoffs-are-pushed-not-polled). The folder is watched,
   * not the file: the file may not exist yet. Every event of one burst makes one tick, in a fresh
   * macrotask like the timer's (see delivery.ts). Without a watch the poll alone delivers. */
  function follow(): void {
    if (!MAILBOX || watcher !== null) return;
    const name = path.basename(MAILBOX);
    try {
      watcher = fs.watch(path.dirname(MAILBOX), { persistent: false }, (_event, file) => {
        if (woken || (file !== null && String(file) !== name)) return;
        woken = true;
        setImmediate(() => {
          woken = false;
          tick();
        });
      });
      watcher.on("error", unfollow);
    } catch (error) {
      debug("bridge: no watch of the notices folder (the poll delivers)", error);
      watcher = null; // no inotify here (or no folder yet): the poll delivers
    }
  }

  function unfollow(): void {
    if (watcher !== null) watcher.close();
    watcher = null;
  }

  pi.on("session_start", async (_event, ctx) => {
    ctxRef = ctx;
    // Made now, not at the first run's end: a job's watcher takes it as the sign that this worker
    // claims its usage through the bridge (and waits a moment for the claim at a marker).
    try {
      fs.mkdirSync(path.join(STATE, "artifacts", KEY), { recursive: true, mode: 0o700 });
    } catch (error) {
      debug("bridge: making the artifacts folder", error);
      // the watcher then does not wait: the result is written without the claim
    }
    // Notices already there belong to before this session started: only new ones are delivered.
    try {
      offset = MAILBOX ? fs.statSync(MAILBOX).size : 0;
    } catch (error) {
      debug("bridge: the notices file's size at session_start", error);
      offset = 0;
    }
    const sm = ctx.sessionManager;
    post("identity", JSON.stringify({ sessionId: sm.getSessionId(), sessionFile: sm.getSessionFile() || null }));
    if (timer === null) {
      timer = setInterval(tick, 250); // the safety net: a lost or unsupported watch
      if (typeof timer.unref === "function") timer.unref();
    }
    follow();
  });

  // What pi's conversation took: the acknowledgement of a delivered notice or handoff.
  pi.on("message_end", async (event) => {
    delivery.seen(event && event.message);
  });
  pi.on("session_before_compact", async () => {
    delivery.setCompacting(true);
  });
  pi.on("session_compact", async () => {
    delivery.setCompacting(false);
  });

  pi.on("agent_end", async (event, ctx) => {
    runs += 1;
    const last = lastAssistant(event);
    // A run that failed leaves pi's follow-up queue in place for its next run.
    if (last && last.stopReason === "error") delivery.keptByPi();
    setTimeout(() => delivery.pump(), 0);
    // Before the artifact: the host's handoff waits for the artifact, so the claim is in by then.
    usage.add(event);
    const artifact = {
      key: KEY,
      run: runs,
      at: Date.now(),
      sessionId: ctx.sessionManager.getSessionId(),
      sessionFile: ctx.sessionManager.getSessionFile() || null,
      text: textOf(last).slice(0, 16000),
      answers: answersOf(event, 16000),
      stopReason: last ? last.stopReason || null : null,
      usage: last ? last.usage || null : null,
    };
    try {
      const dir = path.join(STATE, "artifacts", KEY);
      fs.mkdirSync(dir, { recursive: true, mode: 0o700 });
      const file = path.join(dir, `run-${String(runs).padStart(4, "0")}.json`);
      durableWrite(file, JSON.stringify(artifact));
      post("result", JSON.stringify({ path: file, run: runs, stopReason: artifact.stopReason }));
    } catch (error) {
      debug("bridge: writing the run's artifact", error);
      // no artifact: the job's watcher still sees the marker or the exit
    }
  });

  pi.on("session_shutdown", async () => {
    delivery.close();
    post("bridge", JSON.stringify({ event: "session_shutdown" }));
    if (timer !== null) clearInterval(timer);
    timer = null;
    unfollow();
  });

  // With a SIGTERM listener pi exits 0 through its shutdown hooks instead of dying by signal.
  process.on("SIGTERM", () => {
    try {
      if (ctxRef) ctxRef.shutdown();
      else process.exit(0);
    } catch (error) {
      debug("bridge: SIGTERM's shutdown", error);
      process.exit(0);
    }
  });
}
