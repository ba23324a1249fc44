// The run page's tasks: one row per task in dispatch order, with its state,
// iterations, tokens, forecast, worker, attempt and times.

import { enumName, enumText } from "../enums";
import { h, replace } from "../dom";
import { duration, tokens } from "../format";
import { TaskStatusSchema } from "../gen/fanout/v1/run_pb";
import type { RunView } from "../model";
import type { RunStore } from "../runstore";
import { statusClass } from "../timeline";
import { panel, scopeNote } from "../ui";

/** TasksPanel is the tasks' section; denied shows a scope note in place of the table. */
export interface TasksPanel {
  el: HTMLElement;
  denied(err: unknown): void;
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

/** tasksPanel is the run page's Tasks section, drawn from store. */
export function tasksPanel(store: RunStore): TasksPanel {
  const area = h("div", { id: "tasks-area" });
  store.subscribe((v) => replace(area, taskTable(v)));
  return {
    el: panel("h-tasks", "Tasks", area),
    denied: (err) => replace(area, scopeNote(err, "read")),
  };
}
