// The run's timeline as SVG: the picture `fanout trace` draws in text
// (cmd/fanout/trace.go). One row per task on a shared time axis from the
// run's first event to its last; a bar from the task's start to its end,
// coloured by its status; a tick at the end of each iteration (a dot where
// the iteration ran tools); an x where a task was not started; and one
// vertical line across every row at the moment the budget ran out
// (#budget-exhausted-marker), labelled "budget exhausted": the run's one
// BudgetExhausted event (model.ts, RunView.exhaustedAt), as trace draws it.

import { s } from "./dom";
import { enumText } from "./enums";
import { duration, time, tokens } from "./format";
import { TaskStatus, TaskStatusSchema } from "./gen/fanout/v1/run_pb";
import type { RunView } from "./model";

const WIDTH = 960;
const LEFT = 150; // task names
const RIGHT = 210; // status and tokens
const TOP = 34; // axis and the marker's label
const ROW = 24;
const BAR = 14;
const BOTTOM = 22;

/** statusClass is the CSS class of a task status ("st-budget-exhausted"). */
export function statusClass(st: TaskStatus): string {
  return "st-" + enumText(TaskStatusSchema, st).toLowerCase().replace(/_/g, "-");
}

function truncate(text: string, max: number): string {
  return text.length > max ? text.slice(0, max - 1) + "…" : text;
}

/** timeline draws v; now is the right edge while the run is still going. */
export function timeline(v: RunView, now: Date): SVGSVGElement {
  const t0 = v.firstAt?.getTime() ?? now.getTime();
  const t1 = Math.max(v.finished ? v.lastAt?.getTime() ?? t0 : now.getTime(), t0 + 1);
  const span = t1 - t0;
  const plot = WIDTH - LEFT - RIGHT;
  const x = (d: Date | number) => {
    const ms = typeof d === "number" ? d : d.getTime();
    return LEFT + (Math.min(Math.max(ms - t0, 0), span) / span) * plot;
  };
  const height = TOP + Math.max(v.tasks.length, 1) * ROW + BOTTOM;
  const desc =
    `${v.tasks.length} tasks over ${duration(span)}` +
    (v.exhaustedAt ? `; the budget ran out ${duration(v.exhaustedAt.getTime() - t0)} after the start` : "") +
    ". " +
    v.tasks
      .map(
        (t) =>
          `${t.id}: ${enumText(TaskStatusSchema, t.status)}, ${tokens(t.tokens)} tokens` +
          (t.hedgedAt ? `, hedged ${duration(t.hedgedAt.getTime() - t0)} after the start` : ""),
      )
      .join("; ");

  const svg = s(
    "svg",
    {
      id: "timeline",
      class: "timeline",
      viewBox: `0 0 ${WIDTH} ${height}`,
      role: "img",
      "aria-labelledby": "timeline-title timeline-desc",
    },
    s("title", { id: "timeline-title" }, `Timeline of run ${v.runId}`),
    s("desc", { id: "timeline-desc" }, desc),
  );

  // The axis: from the run's first event (0) to its last (or now).
  const axisY = TOP - 8;
  svg.append(
    s("line", { class: "axis", x1: LEFT, x2: LEFT + plot, y1: axisY, y2: axisY }),
    s("text", { class: "axis-label", x: LEFT, y: axisY - 6, "text-anchor": "start" }, "0"),
    s("text", { class: "axis-label", x: LEFT + plot, y: axisY - 6, "text-anchor": "end" }, duration(span)),
  );

  v.tasks.forEach((t, i) => {
    const y = TOP + i * ROW;
    const mid = y + ROW / 2;
    const cls = statusClass(t.status);
    const row = s("g", { class: "row", "data-task-id": t.id });
    row.append(
      s("text", { class: "task-name", x: LEFT - 8, y: mid + 4, "text-anchor": "end" }, truncate(t.id, 20)),
      s("line", { class: "row-guide", x1: LEFT, x2: LEFT + plot, y1: mid, y2: mid }),
    );
    if (t.startedAt) {
      const from = x(t.startedAt);
      const to = Math.max(x(t.finishedAt ?? (v.finished ? t1 : now)), from + 2);
      row.append(s("rect", { class: `bar ${cls}`, x: from, y: mid - BAR / 2, width: to - from, height: BAR, rx: 2 }));
      for (const seg of t.segments) {
        const sx = x(seg.end);
        row.append(s("line", { class: "tick", x1: sx, x2: sx, y1: mid - BAR / 2, y2: mid + BAR / 2 }));
        if (seg.toolCalls > 0) row.append(s("circle", { class: "tool-dot", cx: sx, cy: mid - BAR / 2 - 1, r: 2.5 }));
      }
      if (t.hedgedAt) {
        // Its second attempt started here (TaskHedged).
        const hx = x(t.hedgedAt);
        row.append(
          s("line", { class: "hedge-mark", x1: hx, x2: hx, y1: mid - BAR / 2 - 3, y2: mid + BAR / 2 + 3 }),
          s("text", { class: "hedge-label", x: hx, y: mid - BAR / 2 - 4, "text-anchor": "middle" }, "hedged"),
        );
      }
    } else if (t.status === TaskStatus.NOT_STARTED || t.status === TaskStatus.SKIPPED) {
      const at = x(t.finishedAt ?? t1);
      row.append(s("text", { class: `not-started ${cls}`, x: at, y: mid + 5, "text-anchor": "middle" }, "×"));
    }
    row.append(
      s(
        "text",
        { class: "task-status", x: LEFT + plot + 10, y: mid + 4 },
        `${enumText(TaskStatusSchema, t.status)}  ${tokens(t.tokens)}`,
      ),
    );
    svg.append(row);
  });

  if (v.exhaustedAt) {
    const ex = x(v.exhaustedAt);
    svg.append(
      s("line", {
        id: "budget-exhausted-marker",
        class: "exhausted-marker",
        x1: ex,
        x2: ex,
        y1: TOP - 10,
        y2: height - BOTTOM + 6,
        "data-time": v.exhaustedAt.toISOString(),
      }),
      s(
        "text",
        {
          id: "budget-exhausted-label",
          class: "exhausted-label",
          x: ex,
          y: height - 4,
          "text-anchor": ex > LEFT + plot * 0.8 ? "end" : ex < LEFT + plot * 0.2 ? "start" : "middle",
        },
        `budget exhausted (${time(v.exhaustedAt)})`,
      ),
    );
  }
  return svg;
}
