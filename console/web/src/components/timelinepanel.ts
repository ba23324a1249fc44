// The run page's Timeline section: the SVG timeline (timeline.ts), drawn
// up to now while the run runs, and its legend.

import { h, replace } from "../dom";
import type { RunStore } from "../runstore";
import { timeline } from "../timeline";
import { panel } from "../ui";

function legend(): HTMLElement {
  return h(
    "ul",
    { class: "legend", "aria-label": "Legend" },
    h("li", null, h("span", { class: "swatch st-running" }), "running"),
    h("li", null, h("span", { class: "swatch st-succeeded" }), "succeeded"),
    h("li", null, h("span", { class: "swatch st-budget-exhausted" }), "budget exhausted"),
    h("li", null, h("span", { class: "swatch st-failed" }), "failed or timed out"),
    h("li", null, h("span", { class: "swatch st-cancelled" }), "cancelled"),
    h("li", null, "ticks: iterations; dots: an iteration ran tools; ×: not started; red line: the budget ran out"),
  );
}

/** timelinePanel is the run page's Timeline section, drawn from store. */
export function timelinePanel(store: RunStore): HTMLElement {
  const area = h("div", { id: "timeline-area", class: "timeline-area" });
  store.subscribe((v) => replace(area, timeline(v, new Date())));
  return panel("h-timeline", "Timeline", area, legend());
}
