// Running this same pi-matrix from inside pi (the master's tmux_agent_manager, the fork tool):
// always an argv list (never a shell string), with --state-dir of this session's host.
import { type ChildProcess, spawn, spawnSync } from "node:child_process";
import { STATE, debug, env } from "./common.ts";

const CLI_TIMEOUT_MS = 120_000;
const MAX_OUTPUT = 16 * 1024 * 1024;

export type Cli = { code: number; out: string; err: string };

function cliPrefix(): string[] {
  try {
    const value = JSON.parse(env.PI_MATRIX_CLI || "");
    if (Array.isArray(value) && value.length > 0 && value.every((v) => typeof v === "string" && v)) return value;
  } catch (error) {
    debug("cli: PI_MATRIX_CLI (the installed pi-matrix instead)", error);
    // fall through to the installed command
  }
  return ["pi-matrix"];
}

/** Run `pi-matrix --state-dir <state> ARGS…` and wait for it (a short command: it blocks pi). */
export function runCli(args: string[], cwd?: string): Cli {
  const [command, ...rest] = cliPrefix();
  const done = spawnSync(command, [...rest, "--state-dir", STATE, ...args], {
    encoding: "utf8",
    timeout: CLI_TIMEOUT_MS,
    maxBuffer: MAX_OUTPUT,
    cwd,
    env: process.env,
    stdio: ["ignore", "pipe", "pipe"],
  });
  if (done.error) return { code: 127, out: "", err: `pi-matrix: error: cannot run ${command}: ${done.error.message}` };
  return { code: done.status === null ? 128 : done.status, out: done.stdout || "", err: done.stderr || "" };
}

/** The same, without blocking pi (a command that may take minutes: a waited fork). An abort of
 * `signal` sends the command SIGINT (it stops what it started and reports); `track` sees the
 * process while it runs (a session that shuts down stops it with SIGTERM). */
export function runCliAsync(
  args: string[],
  cwd?: string,
  signal?: AbortSignal,
  track?: (child: ChildProcess, running: boolean) => void,
): Promise<Cli> {
  const [command, ...rest] = cliPrefix();
  return new Promise((resolve) => {
    let out = "";
    let err = "";
    let child: ChildProcess;
    try {
      child = spawn(command, [...rest, "--state-dir", STATE, ...args], {
        cwd,
        env: process.env,
        stdio: ["ignore", "pipe", "pipe"],
      });
    } catch (error) {
      resolve({ code: 127, out: "", err: `pi-matrix: error: cannot run ${command}: ${(error as Error).message}` });
      return;
    }
    track?.(child, true);
    const onAbort = () => {
      try {
        child.kill("SIGINT");
      } catch (error) {
        debug("cli: SIGINT to a command", error);
        // already gone
      }
    };
    signal?.addEventListener("abort", onAbort, { once: true });
    child.stdout?.setEncoding("utf8");
    child.stderr?.setEncoding("utf8");
    child.stdout?.on("data", (chunk: string) => {
      if (out.length < MAX_OUTPUT) out += chunk;
    });
    child.stderr?.on("data", (chunk: string) => {
      if (err.length < MAX_OUTPUT) err += chunk;
    });
    child.on("error", (error) => {
      err += `pi-matrix: error: cannot run ${command}: ${error.message}\n`;
    });
    child.on("close", (code, sig) => {
      signal?.removeEventListener("abort", onAbort);
      track?.(child, false);
      resolve({ code: code === null ? (sig ? 128 : 127) : code, out, err });
    });
  });
}

/** The CLI's own one-line error (its last "pi-matrix: error:" line), for a tool error. */
export function cliError(result: Cli): Error {
  const lines = result.err.split("\n").map((l) => l.trim()).filter(Boolean);
  const line = [...lines].reverse().find((l) => l.startsWith("pi-matrix: error:")) || lines[lines.length - 1];
  return new Error(line || `pi-matrix exited with code ${result.code}`);
}
