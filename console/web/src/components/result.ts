// The run's result, once it ended: the joined facts with their sources,
// and the synthesis (or why it was skipped) with the run's total spend.

import { h, replace } from "../dom";
import { tokens } from "../format";
import type { Fact, JoinedResult } from "../gen/fanout/v1/run_pb";
import type { RunStore } from "../runstore";
import { panel } from "../ui";

/** factList lists facts with their sources. */
export function factList(facts: Fact[], id?: string): HTMLElement {
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

// onResult calls draw with the run's result each time it is a new one
// (the facts and the synthesis are drawn once, not at every event).
function onResult(store: RunStore, draw: (res: JoinedResult | undefined) => void): void {
  let drawn: unknown = null;
  store.subscribe((v) => {
    if (v.result === drawn) return;
    drawn = v.result;
    draw(v.result);
  });
}

/** factsPanel is the run page's Joined facts section. */
export function factsPanel(store: RunStore): HTMLElement {
  const area = h("div", { id: "facts-area" });
  onResult(store, (res) =>
    replace(
      area,
      !res
        ? h("p", { class: "muted" }, "The joined facts appear when the run ends.")
        : res.facts.length
          ? factList(res.facts, "facts")
          : h("p", { class: "muted", id: "facts-none" }, "No facts."),
    ),
  );
  return panel("h-facts", "Joined facts", area);
}

/** synthesisPanel is the run page's Synthesis section. */
export function synthesisPanel(store: RunStore): HTMLElement {
  const area = h("div", { id: "synthesis-area" });
  onResult(store, (res) =>
    replace(
      area,
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
    ),
  );
  return panel("h-synthesis", "Synthesis", area);
}
