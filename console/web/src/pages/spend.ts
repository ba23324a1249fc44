// Spend: the tenant's spend per UTC day, in money at the operator's prices
// and in tokens (GetSpend, scope audit), as a table and a bar chart.

import { api, isDenied } from "../api";
import { h, replace, s } from "../dom";
import { addDecimal, tokens } from "../format";
import type { DaySpend } from "../gen/fanout/v1/orchestrator_pb";
import { clearError, heading, scopeNote, setTitle, showError, type Page } from "../ui";

const CHART_W = 960;
const CHART_H = 240;
const PAD_L = 70;
const PAD_B = 40;
const PAD_T = 16;

function currencyOf(days: DaySpend[]): string {
  // The chart shows one currency: the one with the most priced tokens.
  const byCur = new Map<string, bigint>();
  for (const d of days) {
    const c = d.spend?.currency ?? "";
    if (c) byCur.set(c, (byCur.get(c) ?? 0n) + (d.spend?.pricedTokens ?? 0n));
  }
  let best = "";
  let most = -1n;
  for (const [c, n] of byCur) {
    if (n > most) {
      best = c;
      most = n;
    }
  }
  return best;
}

// everyDay lists the UTC days from first to last (YYYY-MM-DD), at most 400.
function everyDay(first: string, last: string): string[] {
  const out: string[] = [];
  const d = new Date(`${first}T00:00:00Z`);
  const end = new Date(`${last}T00:00:00Z`);
  if (isNaN(d.getTime()) || isNaN(end.getTime())) return out;
  while (d <= end && out.length < 400) {
    out.push(d.toISOString().slice(0, 10));
    d.setUTCDate(d.getUTCDate() + 1);
  }
  return out;
}

function chart(days: DaySpend[], fromDay: string, toDay: string): SVGSVGElement | HTMLElement {
  if (!days.length) return h("p", { class: "muted" }, "No spend in this range.");
  const currency = currencyOf(days);
  // Money when anything is priced, else tokens; every day of the range has
  // a slot, days without spend an empty one.
  const value = new Map<string, number>();
  for (const d of days) {
    if (currency && d.spend?.currency !== currency) continue;
    const v = currency ? Number(d.spend?.cost || "0") : Number((d.spend?.pricedTokens ?? 0n) + (d.spend?.unpricedTokens ?? 0n));
    value.set(d.day, (value.get(d.day) ?? 0) + v);
  }
  const range = everyDay(fromDay, toDay);
  const points = (range.length ? range : [...value.keys()]).map((day) => ({ day, value: value.get(day) ?? 0 }));
  const unit = currency || "tokens";
  const max = Math.max(...points.map((p) => p.value), Number.MIN_VALUE);
  const plotW = CHART_W - PAD_L - 10;
  const plotH = CHART_H - PAD_T - PAD_B;
  const slot = plotW / points.length;
  const barW = Math.max(Math.min(slot * 0.7, 40), 1);
  const label = `Spend per day in ${unit}, ${points[0]!.day} to ${points[points.length - 1]!.day}`;
  const svg = s(
    "svg",
    { id: "spend-chart", class: "chart", viewBox: `0 0 ${CHART_W} ${CHART_H}`, role: "img", "aria-labelledby": "spend-chart-title" },
    s("title", { id: "spend-chart-title" }, label + " (the table below has the figures)"),
    s("line", { class: "axis", x1: PAD_L, x2: PAD_L + plotW, y1: PAD_T + plotH, y2: PAD_T + plotH }),
    s("line", { class: "axis", x1: PAD_L, x2: PAD_L, y1: PAD_T, y2: PAD_T + plotH }),
    s("text", { class: "axis-label", x: PAD_L - 6, y: PAD_T + 4, "text-anchor": "end" }, currency ? max.toFixed(2) : tokens(Math.round(max))),
    s("text", { class: "axis-label", x: PAD_L - 6, y: PAD_T + plotH, "text-anchor": "end" }, "0"),
    s("text", { class: "axis-label", x: 4, y: PAD_T + plotH / 2 }, unit),
  );
  const every = Math.ceil(points.length / 12); // at most ~12 day labels
  points.forEach((p, i) => {
    const bh = (p.value / max) * plotH;
    const x = PAD_L + i * slot + (slot - barW) / 2;
    svg.append(
      s("rect", { class: "bar spend-bar", x, y: PAD_T + plotH - bh, width: barW, height: Math.max(bh, 0), "data-day": p.day }),
    );
    if (i % every === 0) {
      svg.append(
        s("text", { class: "axis-label", x: x + barW / 2, y: PAD_T + plotH + 16, "text-anchor": "middle" }, p.day.slice(5)),
      );
    }
  });
  return svg;
}

function table(days: DaySpend[]): HTMLElement {
  const totals = new Map<string, { cost: string; priced: bigint; unpriced: bigint; worst: bigint }>();
  for (const d of days) {
    const c = d.spend?.currency ?? "";
    const t = totals.get(c) ?? { cost: "0", priced: 0n, unpriced: 0n, worst: 0n };
    t.cost = addDecimal(t.cost, d.spend?.cost || "0");
    t.priced += d.spend?.pricedTokens ?? 0n;
    t.unpriced += d.spend?.unpricedTokens ?? 0n;
    t.worst += d.spend?.worstCaseTokens ?? 0n;
    totals.set(c, t);
  }
  const cols = ["Day (UTC)", "Currency", "Cost", "Reported cost", "Worst-case cost", "Priced tokens", "Of those at worst case", "Unpriced tokens", "Runs"];
  return h(
    "table",
    { id: "spend-table", class: "data" },
    h("caption", { class: "visually-hidden" }, "Spend per day and currency"),
    h("thead", null, h("tr", null, cols.map((c) => h("th", { scope: "col" }, c)))),
    h(
      "tbody",
      null,
      days.map((d) =>
        h(
          "tr",
          { "data-day": d.day },
          h("th", { scope: "row" }, d.day),
          h("td", null, d.spend?.currency || "—"),
          h("td", { class: "num" }, d.spend?.currency ? d.spend.cost || "0" : ""),
          h("td", { class: "num" }, d.spend?.currency ? d.spend.reportedCost || "0" : ""),
          h("td", { class: "num" }, d.spend?.currency ? d.spend.worstCaseCost || "0" : ""),
          h("td", { class: "num" }, tokens(d.spend?.pricedTokens ?? 0n)),
          h("td", { class: "num" }, tokens(d.spend?.worstCaseTokens ?? 0n)),
          h("td", { class: "num" }, tokens(d.spend?.unpricedTokens ?? 0n)),
          h("td", { class: "num" }, String(d.runs)),
        ),
      ),
    ),
    h(
      "tfoot",
      null,
      [...totals].map(([cur, t]) =>
        h(
          "tr",
          null,
          h("th", { scope: "row" }, "Total"),
          h("td", null, cur || "—"),
          h("td", { class: "num" }, cur ? t.cost : ""),
          h("td", null, ""),
          h("td", null, ""),
          h("td", { class: "num" }, tokens(t.priced)),
          h("td", { class: "num" }, tokens(t.worst)),
          h("td", { class: "num" }, tokens(t.unpriced)),
          h("td", null, ""),
        ),
      ),
    ),
  );
}

export const spendPage: Page = {
  async render(main, signal) {
    setTitle("Spend");
    const from = h("input", { id: "spend-from", name: "from", type: "date" });
    const to = h("input", { id: "spend-to", name: "to", type: "date" });
    const show = h("button", { id: "spend-show", type: "submit" }, "Show");
    const range = h("p", { id: "spend-range", class: "muted", role: "status" });
    const area = h("div", { id: "spend-area" });
    const form = h(
      "form",
      { class: "toolbar", "aria-label": "Days" },
      h("label", { for: "spend-from" }, "From"),
      from,
      h("label", { for: "spend-to" }, "To"),
      to,
      show,
    );
    main.append(
      heading("Spend"),
      h(
        "p",
        { class: "help" },
        "The tenant's spend per UTC day, at the prices the operator set (fanout price); tokens of a model with no price count as unpriced. Empty days mean the last 30.",
      ),
      form,
      range,
      area,
    );
    const load = async () => {
      try {
        const resp = await api.getSpend({ fromDay: from.value, toDay: to.value }, { signal });
        from.value ||= resp.fromDay;
        to.value ||= resp.toDay;
        range.textContent = `${resp.fromDay} to ${resp.toDay}: ${resp.days.length} rows`;
        replace(area, chart(resp.days, resp.fromDay, resp.toDay), resp.days.length ? table(resp.days) : null);
        clearError();
      } catch (err) {
        if (isDenied(err)) replace(area, scopeNote(err, "audit"));
        else showError(err, "GetSpend");
      }
    };
    form.addEventListener("submit", (ev) => {
      ev.preventDefault();
      void load();
    });
    await load();
  },
};
