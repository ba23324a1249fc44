// The run page's Task outcomes: one <details> per task with its status,
// tokens, peak, forecast, iterations and FactSummary (facts, tried,
// failed). Redrawn only when a task changed, and a task the user opened
// stays open, so focus and what is open survive the live updates.

import { enumText } from "../enums";
import { h, replace } from "../dom";
import { duration, tokens } from "../format";
import { HedgeAttempt, TaskStatusSchema, type FactSummary, type TaskOutcome } from "../gen/fanout/v1/run_pb";
import type { TaskView } from "../model";
import type { RunStore } from "../runstore";
import { statusClass } from "../timeline";
import { panel } from "../ui";
import { factList } from "./result";

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
      t.hedged || o?.hedge ? [h("dt", null, "Hedged"), h("dd", null, hedgeText(t, o))] : null,
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

/** outcomesPanel is the run page's Task outcomes section, drawn from store. */
export function outcomesPanel(store: RunStore): HTMLElement {
  const area = h("div", { id: "outcomes" });
  const open = new Set<string>();
  let drawn = "";
  store.subscribe((v) => {
    // Outcomes hold focusable elements: redrawn only when one changed.
    const key = v.tasks.map((t) => `${t.id}:${t.status}:${t.tokens}:${t.iterations}:${t.summary ? 1 : 0}`).join(",");
    if (key === drawn) return;
    drawn = key;
    replace(area, v.tasks.length ? v.tasks.map((t) => summaryDetails(t, open)) : h("p", { class: "muted" }, "No tasks yet."));
  });
  return panel("h-outcomes", "Task outcomes", area);
}

/** hedgeText says how a hedged task's two attempts went (docs/budget.md#hedged-tasks). */
export function hedgeText(t: TaskView, o: TaskOutcome | undefined): string {
  const ev = t.hedged;
  const started = ev
    ? `a second attempt started on ${ev.worker} after ${duration(Number(ev.after?.seconds ?? 0n) * 1000 + (ev.after?.nanos ?? 0) / 1e6)} (${ev.reason})`
    : "a second attempt started";
  const r = o?.hedge;
  if (!r) return started;
  const won =
    r.winner === HedgeAttempt.HEDGE ? "the hedge won" : r.winner === HedgeAttempt.FIRST ? "the first attempt won" : "neither answered";
  return `${started}; ${won}; first ${tokens(r.firstTokens)} + hedge ${tokens(r.hedgeTokens)} tokens`;
}
