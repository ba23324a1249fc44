// One run, live: the page composes the run's store (runstore.ts), fed by
// WatchRun (watch.ts) until RunFinished and then by GetRun for the run in
// full (its synthesis), with the components that draw it (components/):
// the header with Cancel, tasks, timeline, the run's pending approvals
// with Approve and Deny (ListApprovals), the joined facts, the synthesis,
// the task outcomes and the MCP writes (ListToolCalls).

import { api, isDenied } from "../api";
import { h } from "../dom";
import { approvalsPanel, type ApprovalsPanel } from "../components/approvals";
import { runHeader, type RunHeader } from "../components/header";
import { outcomesPanel } from "../components/outcomes";
import { factsPanel, synthesisPanel } from "../components/result";
import { tasksPanel, type TasksPanel } from "../components/tasks";
import { timelinePanel } from "../components/timelinepanel";
import { toolCallsPanel, type ToolCallsPanel } from "../components/toolcalls";
import { seedTasks } from "../model";
import { completeRun, restOfTasks } from "../paging";
import { createRunStore, type RunStore } from "../runstore";
import { statusText, watch } from "../watch";
import { heading, setTitle, showError, type Page } from "../ui";

// Writes and approvals are listed again this often while the run runs
// (and the tab is visible), besides on their events and at the run's end.
const POLL_MS = 5000;

// The timeline's right edge moves with the clock this often while the run runs.
const TICK_MS = 1000;

// Parts are the components follow tells about the stream.
interface Parts {
  header: RunHeader;
  tasks: TasksPanel;
  approvals: ApprovalsPanel;
  toolCalls: ToolCallsPanel;
}

// follow feeds store from WatchRun until the run ends, then from GetRun
// (the run in full, its tasks and facts paged when the server cut them);
// approvals and writes are listed again on their events
// and at the end.
async function follow(runId: string, store: RunStore, p: Parts, signal: AbortSignal): Promise<void> {
  const end = await watch({
    open: (afterSequence) => api.watchRun({ runId, afterSequence }, { signal }),
    after: () => store.view.lastSequence,
    event: (ev) => {
      store.apply(ev);
      if (ev.event.case === "runStarted" && ev.event.value.run?.tasksNextPageToken) {
        // A large run's RunStarted holds its first tasks only: the rest, by page.
        const run = ev.event.value.run;
        restOfTasks(api, runId, [], run.tasksNextPageToken, signal).then(
          (rest) => store.update((v) => seedTasks(v, rest)),
          (err) => showError(err, "ListRunTasks"),
        );
      }
      if (ev.event.case === "approvalRequested" || ev.event.case === "approvalDecided") {
        void p.approvals.load();
        void p.toolCalls.load();
      }
    },
    finished: () => store.view.finished,
    status: (s) => p.header.status(statusText(s)),
    signal,
  });
  if (end.kind === "stopped") {
    if (isDenied(end.error)) p.tasks.denied(end.error);
    showError(end.error, "WatchRun");
    p.header.status("Stopped watching.");
  } else if (end.kind === "finished") {
    p.header.status("The run has ended.");
    try {
      const resp = await api.getRun({ runId }, { signal });
      if (resp.run) {
        await completeRun(api, resp.run, signal); // a large run's tasks and facts, by page
        store.seed(resp.run);
      }
    } catch (err) {
      showError(err, "GetRun");
    }
    store.changed();
    void p.toolCalls.load();
    void p.approvals.load();
  }
}

/** runPage is run runId's page, live while it runs. */
export function runPage(runId: string): Page {
  return {
    render(main, signal) {
      setTitle(`Run ${runId}`);
      const store = createRunStore(runId, signal);
      // A continuation that reopens the run: follow it again from the
      // last event seen (docs/budget.md#continue).
      const refollow = () => void follow(runId, store, { header, tasks, approvals, toolCalls }, signal);
      const header = runHeader(store, signal, refollow);
      const tasks = tasksPanel(store);
      const toolCalls = toolCallsPanel(runId, signal);
      const approvals = approvalsPanel(runId, signal, toolCalls.load);
      main.append(
        heading("Run ", h("span", { class: "mono" }, runId)),
        header.el,
        tasks.el,
        timelinePanel(store),
        approvals.el,
        factsPanel(store),
        synthesisPanel(store),
        outcomesPanel(store),
        toolCalls.el,
      );
      store.flush();

      const loadWrites = () => {
        void toolCalls.load();
        void approvals.load();
      };
      const poll = setInterval(() => {
        if (!store.view.finished && document.visibilityState === "visible") loadWrites();
      }, POLL_MS);
      signal.addEventListener("abort", () => clearInterval(poll));
      loadWrites();

      void follow(runId, store, { header, tasks, approvals, toolCalls }, signal);

      const tick = setInterval(() => {
        if (!store.view.finished) store.changed();
      }, TICK_MS);
      signal.addEventListener("abort", () => clearInterval(tick));
    },
  };
}
