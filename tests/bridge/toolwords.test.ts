// The tmux_agent_manager tool's words for the CLI's (toolwords.ts): a CLI error names the tool's
// parameters and calls, never a flag or a verb the model cannot pass.
import assert from "node:assert/strict";
import { test } from "node:test";
import { toolWords } from "../../pi_tmux_matrix/bridge/toolwords.ts";

test("the field of a CLI error is the parameter it came from", () => {
  assert.equal(
    toolWords("fire_task", "pi-matrix: error: --launch-key: 'x' is too short; use 4-80 characters"),
    "pi-matrix: error: launchKey: 'x' is too short; use 4-80 characters",
  );
  assert.equal(toolWords("fire_task", "pi-matrix: error: TASK: is empty"), "pi-matrix: error: task: is empty");
});

test("an argument's name depends on the action", () => {
  assert.equal(toolWords("set_variable", "pi-matrix: error: NAME: bad"), "pi-matrix: error: name: bad");
  assert.equal(toolWords("stop_session", "pi-matrix: error: NAME: bad"), "pi-matrix: error: sessionName: bad");
  assert.equal(toolWords("job_status", "pi-matrix: error: ID: no such job"), "pi-matrix: error: jobId: no such job");
  // An action without that argument leaves the word as it is.
  assert.equal(toolWords("list_jobs", "pi-matrix: error: ID: no such job"), "pi-matrix: error: ID: no such job");
});

test("a switch the CLI suggests is the parameter set to true", () => {
  assert.equal(
    toolWords("fire_task", "pi-matrix: error: job-1 exists; pass --force to archive it"),
    "pi-matrix: error: job-1 exists; pass force: true to archive it",
  );
  assert.equal(toolWords("fire_task", "use --dry-run first, or --workspace"), "use dryRun: true first, or workspaceName");
});

test("a flag the tool never passes is left alone, and so is a longer word", () => {
  assert.equal(toolWords("fire_task", "unknown --colour and --forced"), "unknown --colour and --forced");
});

test("a command the CLI suggests is the tool call that does the same", () => {
  assert.equal(
    toolWords("stop_session", "run 'pi-matrix stop-session team --json --confirm yes-tmux-stop' to stop them"),
    'run stop_session with sessionName "team" and confirm "yes-tmux-stop" to stop them',
  );
  assert.equal(
    toolWords("stop_job", "then 'pi-matrix stop job-7 --confirm yes-tmux-stop'"),
    'then stop_job with jobId "job-7" and confirm "yes-tmux-stop"',
  );
  assert.equal(toolWords("fire_task", "see 'pi-matrix job job-7' and 'pi-matrix profiles'"), 'see job_status with jobId "job-7" and list_profiles');
});
