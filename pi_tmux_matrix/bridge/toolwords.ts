// The tmux_agent_manager tool's words for the CLI's
// (docs/decisions.md#the-tool-keeps-the-origins-words): a CLI error the tool hands the
// model names the tool's parameter and a fix the tool can carry out (launchKey, force: true,
// workspaceName, stop_session with confirm …), never a flag or a verb the model cannot pass. The
// CLI's own messages keep naming its flags; this is the one place the two namings meet.

/** A flag the tool passes, and the parameter it comes from. */
const FLAGS: Record<string, string> = {
  "--launch-key": "launchKey",
  "--force": "force",
  "--workspace": "workspaceName", // fire's session
  "--name": "workspaceName", // workspace's session
  "--team": "teamTemplate",
  "--profile": "profile",
  "--agent": "agents",
  "--lane": "lane",
  "--goal-id": "goalId",
  "--path": "path",
  "--deadline": "deadlineSeconds",
  "--dry-run": "dryRun",
  "--confirm": "confirm",
};

/** Given as a switch on the CLI: a fix that says "pass --force" says "pass force: true" here. */
const BOOLEANS = new Set(["force", "dryRun"]);

/** A CLI argument's name in an error, per action (its NAME is set_variable's name but
 * stop_session's sessionName). */
const ARGUMENTS: Record<string, Record<string, string>> = {
  fire_task: { TASK: "task" },
  workspace_plan: { TEMPLATE: "teamTemplate", TASK: "task" },
  launch_workspace: { TEMPLATE: "teamTemplate", TASK: "task" },
  job_status: { ID: "jobId" },
  dismiss: { ID: "jobId" },
  stop_job: { "KEY|ID": "jobId", ID: "jobId" },
  send_followup: { ID: "jobId", TEXT: "text" },
  set_variable: { ID: "jobId", NAME: "name", VALUE: "value" },
  list_variables: { ID: "jobId" },
  show_template: { NAME: "templateName" },
  stop_session: { NAME: "sessionName" },
  notify: { session: "sessionName", TEXT: "message" },
  set_status: { session: "sessionName", KEY: "key", TEXT: "value" },
  clear_status: { session: "sessionName", KEY: "key" },
};

/** A command the CLI suggests (quoted), as the tool call that does the same. */
const COMMANDS: Array<[RegExp, (...found: string[]) => string]> = [
  [
    /'pi-matrix stop-session (\S+) [^']*--confirm (\S+)'/g,
    (_all, session, word) => `stop_session with sessionName "${session}" and confirm "${word}"`,
  ],
  [/'pi-matrix stop (\S+) --confirm (\S+)'/g, (_all, job, word) => `stop_job with jobId "${job}" and confirm "${word}"`],
  [/'pi-matrix job (\S+)'/g, (_all, job) => `job_status with jobId "${job}"`],
  [/'pi-matrix (jobs|profiles|templates)'/g, (_all, verb) => `list_${verb}`],
];

const CLI_ERROR = "pi-matrix: error: ";

/** `message` (a CLI error, or the tool's own) in the tool's words for `action`. */
export function toolWords(action: string, message: string): string {
  const names: Record<string, string> = { ...FLAGS, ...(ARGUMENTS[action] || {}) };
  let said = message;
  for (const [pattern, call] of COMMANDS) said = said.replace(pattern, call as any);
  if (said.startsWith(CLI_ERROR)) {
    // "pi-matrix: error: FIELD: problem; fix": the field is a flag or an argument's name.
    const rest = said.slice(CLI_ERROR.length);
    const colon = rest.indexOf(": ");
    const field = colon > 0 ? rest.slice(0, colon) : "";
    if (Object.hasOwn(names, field)) said = CLI_ERROR + names[field] + rest.slice(colon);
  }
  // Any other flag it names, as the parameter (a switch as "name: true").
  return said.replace(/--[a-z][a-z-]*(?![a-z-])/g, (flag) => {
    if (!Object.hasOwn(FLAGS, flag)) return flag;
    return BOOLEANS.has(FLAGS[flag]) ? `${FLAGS[flag]}: true` : FLAGS[flag];
  });
}
