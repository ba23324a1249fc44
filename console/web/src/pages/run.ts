// One run, live: WatchRun from sequence 0, resumed after the last sequence
// seen when the stream drops (backoff 0.5 s doubling to 10 s), until
// RunFinished; then GetRun for the run in full (its synthesis). Around it:
// the MCP writes (ListToolCalls), the run's pending approvals
// (ListApprovals) with Approve and Deny, and Cancel.

import { Code } from "@connectrpc/connect";
import { api, asConnectError, isAborted, isDenied } from "../api";
import { enumName, enumText } from "../enums";
import { h, replace } from "../dom";
import { budgetBar, duration, timeElement, tokens } from "../format";
import type { PendingToolCall, ToolCall } from "../gen/fanout/v1/orchestrator_pb";
import { RunState, RunStateSchema, TaskStatusSchema, type Fact, type FactSummary } from "../gen/fanout/v1/run_pb";
import { applyEvent, newRunView, seedFromRun, type RunView, type TaskView } from "../model";
import { statusClass, timeline } from "../timeline";
import { clearError, heading, scopeNote, setTitle, showError, type Page } from "../ui";

const BACKOFF_MIN_MS = 500;
const BACKOFF_MAX_MS = 10_000;
const POLL_MS = 5000;

// Errors after which watching again cannot help.
const FINAL_CODES = new Set([Code.Unauthenticated, Code.PermissionDenied, Code.NotFound, Code.InvalidArgument]);

function sleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const t = setTimeout(resolve, ms);
    signal.addEventListener("abort", () => {
      clearTimeout(t);
      resolve();
    });
  });
}

function factList(facts: Fact[], id?: string): HTMLElement {
  return h(
    "ol",
    { class: "facts", id: id ?? null },
    facts.map((f) =>
      h(
        "li",
        { class: "fact" },
        h("span", { class: "fact-text" }, f.text),
        f.sources.length
          ? h(
              "ul",
              { class: "sources", "aria-label": "sources" },
              f.sources.map((src) => h("li", { class: "mono" }, src)),
            )
          : null,
      ),
    ),
  );
}

function textList(title: string, items: string[]): HTMLElement | null {
  if (!items.length) return null;
  return h("div", null, h("h4", null, title), h("ul", null, items.map((i) => h("li", null, i))));
}

// summaryDetails is one task's outcome; open holds the ids the user opened,
// so that a redraw keeps them open.
function summaryDetails(t: TaskView, open: Set<string>): HTMLElement {
  const sm: FactSummary | undefined = t.summary;
  const o = t.outcome;
  const st = enumText(TaskStatusSchema, t.status);
  const el = h(
    "details",
    { class: "outcome", "data-task-id": t.id, open: open.has(t.id) },
    h(
      "summary",
      null,
      h("span", { class: "mono" }, t.id),
      " ",
      h("span", { class: `badge ${statusClass(t.status)}` }, st),
      ` ${tokens(t.tokens)} tokens`,
      sm ? `, ${sm.facts.length} facts` : "",
    ),
    h(
      "dl",
      { class: "pairs" },
      h("dt", null, "Status"),
      h("dd", null, st),
      sm?.error ? [h("dt", null, "Why"), h("dd", null, sm.error)] : null,
      h("dt", null, "Tokens spent"),
      h("dd", null, tokens(sm?.tokensSpent ?? t.tokens)),
      sm ? [h("dt", null, "Peak (spent + reserved)"), h("dd", null, tokens(sm.peakTokens))] : null,
      h("dt", null, "Forecast"),
      h("dd", null, tokens(o?.forecastTokens ?? t.forecastTokens)),
      h("dt", null, "Iterations"),
      h("dd", null, String(sm?.iterations ?? t.iterations)),
      sm?.woundDown ? [h("dt", null, "Wound down"), h("dd", null, "yes: its last iteration answered without tools")] : null,
    ),
    sm?.facts.length ? [h("h4", null, "Facts"), factList(sm.facts)] : null,
    sm ? textList("Tried", sm.tried) : null,
    sm ? textList("Failed", sm.failed) : null,
    sm ? null : h("p", { class: "muted" }, "No summary yet."),
  );
  el.addEventListener("toggle", () => {
    if (el.open) open.add(t.id);
    else open.delete(t.id);
  });
  return el;
}

function taskTable(v: RunView): HTMLElement {
  return h(
    "table",
    { id: "tasks", class: "data" },
    h("caption", { class: "visually-hidden" }, "Tasks in dispatch order"),
    h(
      "thead",
      null,
      h(
        "tr",
        null,
        ["Task", "State", "Iterations", "Tokens", "Forecast", "Worker", "Attempt", "Started", "Took"].map((c) =>
          h("th", { scope: "col" }, c),
        ),
      ),
    ),
    h(
      "tbody",
      null,
      v.tasks.map((t) =>
        h(
          "tr",
          { "data-task-id": t.id, "data-state": enumName(TaskStatusSchema, t.status) },
          h("th", { scope: "row", class: "mono" }, t.id),
          h(
            "td",
            null,
            h("span", { class: `badge ${statusClass(t.status)}` }, enumText(TaskStatusSchema, t.status)),
            t.queued ? h("span", { class: "muted" }, " queued") : null,
          ),
          h("td", { class: "num" }, String(t.iterations)),
          h("td", { class: "num" }, tokens(t.tokens)),
          h("td", { class: "num" }, t.forecastTokens > 0n ? tokens(t.forecastTokens) : ""),
          h("td", { class: "mono" }, t.worker),
          h("td", { class: "num" }, t.attempts ? String(t.attempts) : ""),
          h("td", null, t.startedAt ? h("time", { datetime: t.startedAt.toISOString() }, t.startedAt.toLocaleTimeString()) : ""),
          h(
            "td",
            { class: "num" },
            t.startedAt && t.finishedAt ? duration(t.finishedAt.getTime() - t.startedAt.getTime()) : "",
          ),
        ),
      ),
    ),
  );
}

function toolCallTable(calls: ToolCall[]): HTMLElement {
  if (!calls.length) return h("p", { class: "muted" }, "No writes.");
  return h(
    "table",
    { class: "data", id: "tool-calls-table" },
    h("caption", { class: "visually-hidden" }, "Writes the run's subagents asked for, oldest first"),
    h(
      "thead",
      null,
      h(
        "tr",
        null,
        ["Call", "Task", "Tool", "State", "Attempt / iteration", "Decision", "Error", "Arguments", "Asked", "Resolved"].map((c) =>
          h("th", { scope: "col" }, c),
        ),
      ),
    ),
    h(
      "tbody",
      null,
      calls.map((c) =>
        h(
          "tr",
          { "data-call-id": c.callId, "data-state": c.state },
          h("td", { class: "mono" }, c.callId),
          h("td", { class: "mono" }, c.taskId),
          h("td", { class: "mono" }, c.server ? `${c.server} / ${c.tool}` : c.tool),
          h("td", null, h("span", { class: `badge call-${c.state.replace(/_/g, "-")}` }, c.state)),
          h("td", { class: "num" }, `${c.attempt} / ${c.iteration}`),
          h(
            "td",
            null,
            c.decision ? `${c.decision.approved ? "approved" : "denied"} by ${c.decision.actor}${c.decision.reason ? `: ${c.decision.reason}` : ""}` : "",
          ),
          h("td", null, c.error),
          h("td", null, c.preview ? h("code", { class: "preview" }, c.preview) : ""),
          h("td", null, timeElement(c.createdAt)),
          h("td", null, timeElement(c.resolvedAt)),
        ),
      ),
    ),
  );
}

export function runPage(runId: string): Page {
  return {
    render(main, signal) {
      setTitle(`Run ${runId}`);
      const v = newRunView(runId);

      const stateEl = h("span", { id: "run-state", class: "badge" });
      const causeEl = h("span", { id: "run-cause" });
      const budgetEl = h("div", { id: "run-budget" });
      const watchStatus = h("p", { id: "watch-status", class: "status", role: "status" });
      const meta = h("dl", { class: "pairs run-meta", id: "run-meta" });
      const tasksEl = h("div", { id: "tasks-area" });
      const timelineEl = h("div", { id: "timeline-area", class: "timeline-area" });
      const factsEl = h("div", { id: "facts-area" });
      const outcomesEl = h("div", { id: "outcomes" });
      const synthesisEl = h("div", { id: "synthesis-area" });
      const toolCallsEl = h("div", { id: "tool-calls" });
      const approvalsEl = h("div", { id: "approvals" });

      const reason = h("input", { id: "cancel-reason", name: "reason", type: "text", maxlength: 1024, autocomplete: "off" });
      const cancelBtn = h("button", { id: "cancel-run", type: "submit", class: "danger" }, "Cancel run");
      const cancelForm = h(
        "form",
        { class: "inline-form", id: "cancel-form", "aria-label": "Cancel this run" },
        h("label", { for: "cancel-reason" }, "Reason (optional)"),
        reason,
        cancelBtn,
      );
      cancelForm.addEventListener("submit", async (ev) => {
        ev.preventDefault();
        cancelBtn.disabled = true;
        try {
          const resp = await api.cancelRun({ runId, reason: reason.value.trim() || "cancelled from the console" }, { signal });
          if (resp.run) {
            watchStatus.textContent = "Cancel recorded; waiting for the run to end.";
            if (!v.finished) v.cause = resp.run.cancelCause;
            draw();
          }
          clearError();
        } catch (err) {
          showError(err, "CancelRun");
          cancelBtn.disabled = false;
        }
      });

      const section = (id: string, title: string, ...content: Node[]) =>
        h("section", { "aria-labelledby": id, class: "panel" }, h("h2", { id }, title), ...content);

      main.append(
        heading("Run ", h("span", { class: "mono" }, runId)),
        h(
          "div",
          { class: "run-header" },
          h("p", { class: "run-state-line" }, "State: ", stateEl, " ", causeEl),
          budgetEl,
          meta,
          cancelForm,
          watchStatus,
        ),
        section("h-tasks", "Tasks", tasksEl),
        section(
          "h-timeline",
          "Timeline",
          timelineEl,
          h(
            "ul",
            { class: "legend", "aria-label": "Legend" },
            h("li", null, h("span", { class: "swatch st-running" }), "running"),
            h("li", null, h("span", { class: "swatch st-succeeded" }), "succeeded"),
            h("li", null, h("span", { class: "swatch st-budget-exhausted" }), "budget exhausted"),
            h("li", null, h("span", { class: "swatch st-failed" }), "failed or timed out"),
            h("li", null, h("span", { class: "swatch st-cancelled" }), "cancelled"),
            h("li", null, "ticks: iterations; dots: an iteration ran tools; ×: not started; red line: the budget ran out"),
          ),
        ),
        section("h-approvals", "Pending approvals", approvalsEl),
        section("h-facts", "Joined facts", factsEl),
        section("h-synthesis", "Synthesis", synthesisEl),
        section("h-outcomes", "Task outcomes", outcomesEl),
        section("h-tool-calls", "Writes (MCP and note)", toolCallsEl),
      );

      // Drawing. The live parts are redrawn at most every 100 ms.
      let drawScheduled = false;
      let drawnResult: unknown = null;
      const openOutcomes = new Set<string>();
      let drawnOutcomes = "";
      const drawNow = () => {
        drawScheduled = false;
        if (signal.aborted) return;
        stateEl.textContent = enumText(RunStateSchema, v.state);
        stateEl.dataset.state = enumName(RunStateSchema, v.state);
        stateEl.className = `badge run-${enumText(RunStateSchema, v.state).toLowerCase().replace(/_/g, "-")}`;
        causeEl.textContent = v.cause ? `(${v.cause})` : "";
        replace(budgetEl, budgetBar(v.budget, "run-budget-bar", v.state === RunState.BUDGET_EXHAUSTED));
        const run = v.run;
        replace(
          meta,
          run ? [h("dt", null, "Tenant"), h("dd", null, run.tenantId)] : null,
          run ? [h("dt", null, "Idempotency key"), h("dd", { class: "mono" }, run.idempotencyKey)] : null,
          run?.spec?.goal ? [h("dt", null, "Goal"), h("dd", null, run.spec.goal)] : null,
          run?.createdAt ? [h("dt", null, "Created"), h("dd", null, timeElement(run.createdAt))] : null,
          run?.finishedAt ? [h("dt", null, "Finished"), h("dd", null, timeElement(run.finishedAt))] : null,
          run && Object.keys(run.labels).length
            ? [
                h("dt", null, "Labels"),
                h(
                  "dd",
                  null,
                  Object.entries(run.labels)
                    .map(([k, val]) => `${k}=${val}`)
                    .join(", "),
                ),
              ]
            : null,
          v.adoptions ? [h("dt", null, "Adopted"), h("dd", null, `${v.adoptions} times`)] : null,
        );
        cancelForm.hidden = v.finished;
        replace(tasksEl, taskTable(v));
        replace(timelineEl, timeline(v, new Date()));
        // Outcomes hold focusable elements: redrawn only when one changed.
        const outcomesKey = v.tasks.map((t) => `${t.id}:${t.status}:${t.tokens}:${t.iterations}:${t.summary ? 1 : 0}`).join(",");
        if (outcomesKey !== drawnOutcomes) {
          drawnOutcomes = outcomesKey;
          replace(outcomesEl, v.tasks.length ? v.tasks.map((t) => summaryDetails(t, openOutcomes)) : h("p", { class: "muted" }, "No tasks yet."));
        }
        if (v.result !== drawnResult) {
          drawnResult = v.result;
          const res = v.result;
          replace(
            factsEl,
            !res
              ? h("p", { class: "muted" }, "The joined facts appear when the run ends.")
              : res.facts.length
                ? factList(res.facts, "facts")
                : h("p", { class: "muted", id: "facts-none" }, "No facts."),
          );
          replace(
            synthesisEl,
            !res
              ? h("p", { class: "muted" }, "The synthesis appears when the run ends.")
              : res.synthesis
                ? h("div", { id: "synthesis", class: "synthesis" }, res.synthesis)
                : h(
                    "p",
                    { id: "synthesis-skipped", class: "muted" },
                    res.synthesisSkippedReason ? `Skipped: ${res.synthesisSkippedReason}` : "None asked for.",
                  ),
            res ? h("p", { class: "muted" }, `The run spent ${tokens(res.totalTokens)} tokens in all.`) : null,
          );
        }
      };
      const draw = () => {
        if (drawScheduled) return;
        drawScheduled = true;
        setTimeout(drawNow, 100);
      };
      drawNow();

      // Writes and approvals: on their events, every 5 s while the run
      // runs, and once at its end.
      let approvalsKey = "";
      const loadApprovals = async () => {
        try {
          const resp = await api.listApprovals({ runId, pageSize: 200 }, { signal });
          const key = resp.calls.map((c) => c.callId).join(",");
          if (key === approvalsKey && approvalsEl.childElementCount) return; // keep what is typed in a reason
          approvalsKey = key;
          replace(approvalsEl, approvalList(resp.calls));
        } catch (err) {
          if (isDenied(err)) replace(approvalsEl, scopeNote(err, "approve"));
          else showError(err, "ListApprovals");
        }
      };
      const loadToolCalls = async () => {
        try {
          const calls: ToolCall[] = [];
          let pageToken = "";
          do {
            const resp = await api.listToolCalls({ runId, pageSize: 200, pageToken }, { signal });
            calls.push(...resp.calls);
            pageToken = resp.nextPageToken;
          } while (pageToken && calls.length < 1000);
          replace(toolCallsEl, toolCallTable(calls));
        } catch (err) {
          if (isDenied(err)) replace(toolCallsEl, scopeNote(err, "read"));
          else showError(err, "ListToolCalls");
        }
      };
      const approvalList = (calls: PendingToolCall[]): HTMLElement => {
        if (!calls.length) return h("p", { class: "muted", id: "approvals-none" }, "None pending.");
        return h(
          "ul",
          { class: "approvals", id: "approvals-list" },
          calls.map((c) => {
            const reasonId = `deny-reason-${c.callId}`;
            const why = h("input", { id: reasonId, type: "text", maxlength: 1024, autocomplete: "off" });
            const approve = h("button", { type: "button", "data-testid": "approve", "data-call-id": c.callId }, "Approve");
            const deny = h("button", { type: "button", class: "danger", "data-testid": "deny", "data-call-id": c.callId }, "Deny");
            const decide = async (approved: boolean) => {
              approve.disabled = deny.disabled = true;
              try {
                const req = { callId: c.callId, reason: why.value.trim() };
                if (approved) await api.approveToolCall(req, { signal });
                else await api.denyToolCall(req, { signal });
                clearError();
                approvalsKey = "";
                await Promise.all([loadApprovals(), loadToolCalls()]);
              } catch (err) {
                showError(err, approved ? "ApproveToolCall" : "DenyToolCall");
                approve.disabled = deny.disabled = false;
              }
            };
            approve.addEventListener("click", () => void decide(true));
            deny.addEventListener("click", () => {
              if (!why.value.trim()) {
                why.setAttribute("aria-invalid", "true");
                why.focus();
                showError(new Error("say why the write is denied (the model is told)"), "DenyToolCall");
                return;
              }
              void decide(false);
            });
            return h(
              "li",
              { class: "approval card", "data-call-id": c.callId },
              h(
                "p",
                null,
                h("span", { class: "mono" }, c.taskId),
                " asks to call ",
                h("span", { class: "mono" }, c.tool),
                ", until ",
                timeElement(c.deadline),
              ),
              c.preview ? h("pre", { class: "preview" }, c.preview) : null,
              h("label", { for: reasonId }, "Reason (required to deny)"),
              why,
              h("span", { class: "buttons" }, approve, deny),
            );
          }),
        );
      };
      const poll = setInterval(() => {
        if (!v.finished && document.visibilityState === "visible") {
          void loadToolCalls();
          void loadApprovals();
        }
      }, POLL_MS);
      signal.addEventListener("abort", () => clearInterval(poll));
      void loadToolCalls();
      void loadApprovals();

      const finish = async () => {
        watchStatus.textContent = "The run has ended.";
        try {
          const resp = await api.getRun({ runId }, { signal });
          if (resp.run) seedFromRun(v, resp.run);
        } catch (err) {
          showError(err, "GetRun");
        }
        draw();
        void loadToolCalls();
        void loadApprovals();
      };

      // The watch loop.
      void (async () => {
        let backoff = BACKOFF_MIN_MS;
        while (!signal.aborted) {
          try {
            watchStatus.textContent = v.lastSequence > 0n ? `Resumed after event ${v.lastSequence}.` : "Watching…";
            for await (const res of api.watchRun({ runId, afterSequence: v.lastSequence }, { signal })) {
              if (!res.event) continue;
              applyEvent(v, res.event);
              backoff = BACKOFF_MIN_MS;
              const c = res.event.event.case;
              if (c === "approvalRequested" || c === "approvalDecided") {
                void loadApprovals();
                void loadToolCalls();
              }
              draw();
              if (v.finished) break;
            }
            if (v.finished) {
              await finish();
              return;
            }
            // Closed without RunFinished: watch again from where it stopped.
          } catch (err) {
            if (signal.aborted || isAborted(err)) return;
            const e = asConnectError(err);
            if (FINAL_CODES.has(e.code)) {
              if (isDenied(e)) replace(tasksEl, scopeNote(e, "read"));
              showError(e, "WatchRun");
              watchStatus.textContent = "Stopped watching.";
              return;
            }
            // A dropped stream, or RESOURCE_EXHAUSTED (a reader left
            // behind): resume after the last event seen.
          }
          watchStatus.textContent = `Stream dropped; resuming after event ${v.lastSequence} in ${duration(backoff)}.`;
          await sleep(backoff, signal);
          backoff = Math.min(backoff * 2, BACKOFF_MAX_MS);
        }
      })();

      // While running, the timeline's right edge moves with the clock.
      const tick = setInterval(() => {
        if (!v.finished) draw();
      }, 1000);
      signal.addEventListener("abort", () => clearInterval(tick));
    },
  };
}
