// The run page's header: the run's state and cause, its budget bar, what
// the run is (tenant, idempotency key, goal, times, labels, adoptions),
// the cancel form (CancelRun) while it runs, the continue form
// (ContinueRun) while it runs or once its budget ran out, and the stream's
// status line.

import { api } from "../api";
import { enumName, enumText } from "../enums";
import { h, replace, type Child } from "../dom";
import { budgetBar, timeElement } from "../format";
import { RunState, RunStateSchema, type Run } from "../gen/fanout/v1/run_pb";
import type { RunView } from "../model";
import type { RunStore } from "../runstore";
import { clearError, showError } from "../ui";

/** RunHeader is the header element and its status line (#watch-status). */
export interface RunHeader {
  el: HTMLElement;
  status(text: string): void;
}

function meta(v: RunView): Child[] {
  const run: Run | undefined = v.run;
  const labels = run ? Object.entries(run.labels) : [];
  return [
    run ? [h("dt", null, "Tenant"), h("dd", null, run.tenantId)] : null,
    run ? [h("dt", null, "Idempotency key"), h("dd", { class: "mono" }, run.idempotencyKey)] : null,
    run?.spec?.goal ? [h("dt", null, "Goal"), h("dd", null, run.spec.goal)] : null,
    run?.createdAt ? [h("dt", null, "Created"), h("dd", null, timeElement(run.createdAt))] : null,
    run?.finishedAt ? [h("dt", null, "Finished"), h("dd", null, timeElement(run.finishedAt))] : null,
    labels.length ? [h("dt", null, "Labels"), h("dd", null, labels.map(([k, val]) => `${k}=${val}`).join(", "))] : null,
    v.adoptions ? [h("dt", null, "Adopted"), h("dd", null, `${v.adoptions} times`)] : null,
    v.continuations ? [h("dt", null, "Continued"), h("dd", { id: "run-continued" }, `${v.continuations} times`)] : null,
    v.concurrency
      ? [
          h("dt", null, "Concurrency"),
          h(
            "dd",
            { id: "run-concurrency" },
            `${v.concurrency.concurrency} tasks at once, from the rate limits: ${v.concurrency.reason}`,
          ),
        ]
      : null,
  ];
}

// cancelForm cancels the run with an optional reason; the cause is shown
// at once, before the run's RunFinished.
function cancelForm(store: RunStore, signal: AbortSignal, status: (text: string) => void): HTMLFormElement {
  const reason = h("input", { id: "cancel-reason", name: "reason", type: "text", maxlength: 1024, autocomplete: "off" });
  const cancelBtn = h("button", { id: "cancel-run", type: "submit", class: "danger" }, "Cancel run");
  const form = h(
    "form",
    { class: "inline-form", id: "cancel-form", "aria-label": "Cancel this run" },
    h("label", { for: "cancel-reason" }, "Reason (optional)"),
    reason,
    cancelBtn,
  );
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    cancelBtn.disabled = true;
    try {
      const runId = store.view.runId;
      const resp = await api.cancelRun({ runId, reason: reason.value.trim() || "cancelled from the console" }, { signal });
      if (resp.run) {
        status("Cancel recorded; waiting for the run to end.");
        const cause = resp.run.cancelCause;
        store.update((v) => {
          if (!v.finished) v.cause = cause;
        });
      }
      clearError();
    } catch (err) {
      showError(err, "CancelRun");
      cancelBtn.disabled = false;
    }
  });
  return form;
}

// continueForm adds tokens to the run's budget (docs/budget.md#continue):
// a top-up while it runs, a reopening once its budget ran out. A reopened
// run is followed again (onReopened).
function continueForm(
  store: RunStore,
  signal: AbortSignal,
  status: (text: string) => void,
  onReopened: () => void,
): HTMLFormElement {
  const tokens = h("input", { id: "continue-tokens", name: "tokens", type: "number", min: 1, step: 1, required: true });
  const reason = h("input", { id: "continue-reason", name: "reason", type: "text", maxlength: 1024, autocomplete: "off" });
  const btn = h("button", { id: "continue-run", type: "submit" }, "Continue with more budget");
  const form = h(
    "form",
    { class: "inline-form", id: "continue-form", "aria-label": "Continue this run with more budget" },
    h("label", { for: "continue-tokens" }, "Tokens to add"),
    tokens,
    h("label", { for: "continue-reason" }, "Reason (optional)"),
    reason,
    btn,
  );
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    btn.disabled = true;
    try {
      const resp = await api.continueRun(
        {
          runId: store.view.runId,
          addTokens: BigInt(tokens.value),
          idempotencyKey: `console-${crypto.randomUUID()}`,
          reason: reason.value.trim(),
        },
        { signal },
      );
      const c = resp.continuation;
      if (c) {
        status(
          c.reopened
            ? `Continued with ${c.addedTokens} tokens: ${c.taskIds.length} tasks run again.`
            : `Topped up with ${c.addedTokens} tokens: the budget is now ${c.limitTokens}.`,
        );
        if (c.reopened) onReopened();
      }
      clearError();
    } catch (err) {
      showError(err, "ContinueRun");
    }
    btn.disabled = false;
  });
  return form;
}

/** runHeader is the run page's header, drawn from store. */
export function runHeader(store: RunStore, signal: AbortSignal, onReopened: () => void = () => {}): RunHeader {
  const stateEl = h("span", { id: "run-state", class: "badge" });
  const causeEl = h("span", { id: "run-cause" });
  const budgetEl = h("div", { id: "run-budget" });
  const watchStatus = h("p", { id: "watch-status", class: "status", role: "status" });
  const metaEl = h("dl", { class: "pairs run-meta", id: "run-meta" });
  const status = (text: string) => {
    watchStatus.textContent = text;
  };
  const cancel = cancelForm(store, signal, status);
  const more = continueForm(store, signal, status, onReopened);
  store.subscribe((v) => {
    stateEl.textContent = enumText(RunStateSchema, v.state);
    stateEl.dataset.state = enumName(RunStateSchema, v.state);
    stateEl.className = `badge run-${enumText(RunStateSchema, v.state).toLowerCase().replace(/_/g, "-")}`;
    causeEl.textContent = v.cause ? `(${v.cause})` : "";
    replace(budgetEl, budgetBar(v.budget, "run-budget-bar", v.state === RunState.BUDGET_EXHAUSTED));
    replace(metaEl, meta(v));
    cancel.hidden = v.finished;
    more.hidden = v.finished && v.state !== RunState.BUDGET_EXHAUSTED;
  });
  const el = h(
    "div",
    { class: "run-header" },
    h("p", { class: "run-state-line" }, "State: ", stateEl, " ", causeEl),
    budgetEl,
    metaEl,
    cancel,
    more,
    watchStatus,
  );
  return { el, status };
}
