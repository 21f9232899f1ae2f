// The part of pi's extension API the bridge uses, declared here for its type check
// (`tsc --noEmit -p pi_tmux_matrix/bridge/tsconfig.json`; docs/bridge.md).
//
// Only what the bridge calls or reads, as every supported pi (0.73.1 to 1.6.x) provides it: pi's
// own declarations (dist/core/extensions/types.d.ts of @earendil-works/pi-coding-agent) are not
// imported, so the check needs no pi, and a name or a shape that exists in only some pi versions
// is optional here (the bridge tests for it before it uses it). A .d.ts file is never loaded: the
// bridge imports it with `import type` only, which pi's loader and node's type stripping erase.
//
// What pi hands over from a model, a session file or another extension (a message, a tool's
// input, a session entry) is `any` on purpose: the bridge checks each field it reads at run time
// (`typeof`, `Array.isArray`), whatever a pi version or a model put there.

/** A message of pi's conversation: user, assistant, toolResult, custom (never trusted). */
export type AgentMessage = any;
/** An entry of pi's session file (a message, a custom_message, …). */
export type SessionEntry = any;

export interface SessionManager {
  getSessionId(): string;
  getSessionFile(): string | undefined;
  /** The session file's header (its cwd); pi 0.73.1 has it too, but a stand-in may not. */
  getHeader?(): { cwd?: unknown } | null;
  getEntries(): SessionEntry[];
  /** The entries from the root to the current leaf. */
  getBranch(): SessionEntry[];
}

export interface ExtensionUI {
  select(title: string, options: string[]): Promise<string | undefined>;
  notify(message: string, type?: "info" | "warning" | "error"): void;
  setStatus(key: string, text: string | undefined): void;
}

/** The ctx of an event handler, a tool's execute and a command. */
export interface ExtensionContext {
  cwd: string;
  hasUI: boolean;
  ui: ExtensionUI;
  sessionManager: SessionManager;
  isIdle(): boolean;
  abort(): void;
  /** A clean exit through pi's shutdown hooks. */
  shutdown(): void;
}

export interface AgentEndEvent {
  messages: AgentMessage[];
}
export interface MessageEndEvent {
  message: AgentMessage;
}
export interface BeforeAgentStartEvent {
  systemPrompt: string;
}
export interface BeforeAgentStartResult {
  systemPrompt?: string;
}
export interface ToolCallEvent {
  toolName: string;
  input: Record<string, unknown>;
}
export interface ToolCallResult {
  block?: boolean;
  reason?: string;
}
export interface ToolResultEvent {
  toolName: string;
  input: Record<string, unknown>;
  content: unknown[];
  details: unknown;
  isError: boolean;
}
export interface ToolResultChange {
  content?: unknown[];
  details?: unknown;
  isError?: boolean;
}
export interface SessionShutdownEvent {
  /** "reload" (pi >= 0.74) when the same session goes on; absent in older pi. */
  reason?: string;
}
export interface InputResult {
  action: "continue" | "transform" | "handled";
}
export interface ProjectTrustResult {
  trusted: "yes" | "no" | "undecided";
  remember?: boolean;
}

/** A handler: an event and the ctx, answered with R (or nothing). */
export type Handler<E, R = undefined> = (event: E, ctx: ExtensionContext) => Promise<R | void> | R | void;

/** A tool's result: what the model reads (content) and what the renderers get (details). */
export interface ToolResult<D = unknown> {
  content: Array<{ type: "text"; text: string }>;
  details: D;
}

export interface ToolDefinition<P = any, D = any> {
  name: string;
  label: string;
  description: string;
  promptSnippet?: string;
  /** A typebox schema (pi checks the model's arguments against it). */
  parameters: unknown;
  execute(
    toolCallId: string,
    params: P,
    signal: AbortSignal | undefined,
    onUpdate: unknown,
    ctx: ExtensionContext,
  ): Promise<ToolResult<D>>;
  /** pi-tui components; the theme is pi's (fg, bold). */
  renderCall?(args: any, theme: any): unknown;
  renderResult?(result: any, options: any, theme: any): unknown;
}

export interface CommandDefinition {
  description: string;
  handler(args: string, ctx: ExtensionContext): Promise<void>;
}

/** A custom message into the conversation (handoffs, fork results). */
export interface CustomMessage<D = unknown> {
  customType: string;
  content: string;
  display: boolean;
  details?: D;
}

/** The `pi` a pi extension's default export is called with. */
export interface ExtensionAPI {
  /** pi >= 0.79 only (an older pi never emits it). The ctx is a smaller one: unused here. */
  on(event: "project_trust", handler: (event: unknown, ctx: unknown) => Promise<ProjectTrustResult>): void;
  on(event: "session_start", handler: Handler<unknown>): void;
  on(event: "session_shutdown", handler: Handler<SessionShutdownEvent>): void;
  on(event: "session_before_compact", handler: Handler<unknown, unknown>): void;
  on(event: "session_compact", handler: Handler<unknown>): void;
  on(event: "session_tree", handler: Handler<unknown>): void;
  on(event: "before_agent_start", handler: Handler<BeforeAgentStartEvent, BeforeAgentStartResult>): void;
  on(event: "agent_end", handler: Handler<AgentEndEvent>): void;
  on(event: "turn_end", handler: Handler<unknown>): void;
  on(event: "message_end", handler: Handler<MessageEndEvent>): void;
  on(event: "input", handler: Handler<unknown, InputResult>): void;
  on(event: "tool_call", handler: Handler<ToolCallEvent, ToolCallResult>): void;
  on(event: "tool_result", handler: Handler<ToolResultEvent, ToolResultChange>): void;
  registerTool<P, D>(tool: ToolDefinition<P, D>): void;
  registerCommand(name: string, command: CommandDefinition): void;
  /** A user message: a new turn when idle, else into pi's queue as `deliverAs` says. */
  sendUserMessage(content: string, options?: { deliverAs?: "steer" | "followUp" }): void;
  sendMessage<D>(message: CustomMessage<D>, options?: { triggerTurn?: boolean; deliverAs?: "steer" | "followUp" }): void;
  getActiveTools(): string[];
  setActiveTools(names: string[]): void;
}
