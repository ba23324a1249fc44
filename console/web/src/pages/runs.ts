// The runs list: the key's tenant's runs, newest first (ListRuns), with a
// state filter, pages by next_page_token, each run's budget bar and its
// spend in tokens and, for keys with the audit scope, in money (GetSpend
// for the page's runs). Refreshed every 5 s while the tab is visible.

import { api, isDenied } from "../api";
import { enumName, enumText } from "../enums";
import { h, replace, visuallyHidden } from "../dom";
import { budgetBar, money, timeElement, tokens } from "../format";
import type { RunSpend } from "../gen/fanout/v1/orchestrator_pb";
import { RunState, RunStateSchema, type Run } from "../gen/fanout/v1/run_pb";
import { clearError, heading, scopeNote, setTitle, showError, type Page } from "../ui";

const REFRESH_MS = 5000;
const PAGE_SIZE = 25;

// Kept across visits, so coming back from a run shows the same page.
const state = {
  filter: RunState.UNSPECIFIED,
  // tokens[i] is the page token of page i; tokens[0] is "" (the first page).
  tokens: [""],
};

function spendCell(run: Run, spend: Map<string, RunSpend[]> | "denied" | undefined): HTMLTableCellElement {
  if (spend === "denied") {
    return h(
      "td",
      { class: "money" },
      h("span", { title: "needs audit scope", "aria-hidden": "true" }, "—"),
      visuallyHidden("needs audit scope"),
    );
  }
  if (!spend) return h("td", { class: "money" }, "");
  const rows = spend.get(run.runId) ?? [];
  return h("td", { class: "money" }, rows.length ? rows.map((r) => money(r.spend)).join("; ") : "0");
}

function labels(run: Run): HTMLElement {
  const entries = Object.entries(run.labels).sort(([a], [b]) => a.localeCompare(b));
  return h(
    "ul",
    { class: "labels" },
    entries.map(([k, v]) => h("li", null, `${k}=${v}`)),
  );
}

function stateBadge(st: RunState): HTMLElement {
  return h(
    "span",
    { class: `badge run-${enumText(RunStateSchema, st).toLowerCase().replace(/_/g, "-")}`, "data-state": enumName(RunStateSchema, st) },
    enumText(RunStateSchema, st),
  );
}

export { stateBadge };

export const runsPage: Page = {
  async render(main, signal) {
    setTitle("Runs");
    const select = h(
      "select",
      { id: "runs-state-filter", name: "state" },
      RunStateSchema.values.map((v) =>
        h(
          "option",
          { value: String(v.number), selected: v.number === state.filter },
          v.number === RunState.UNSPECIFIED ? "any state" : enumText(RunStateSchema, v.number),
        ),
      ),
    );
    const refresh = h("button", { id: "runs-refresh", type: "button" }, "Refresh");
    const prev = h("button", { id: "runs-prev", type: "button" }, "Previous");
    const next = h("button", { id: "runs-next", type: "button" }, "Next");
    const pageInfo = h("span", { id: "runs-page", class: "muted" });
    const status = h("p", { id: "runs-status", class: "status", role: "status" });
    const body = h("tbody");
    const table = h(
      "table",
      { id: "runs-table", class: "data" },
      h("caption", { class: "visually-hidden" }, "Runs of this tenant, newest first"),
      h(
        "thead",
        null,
        h(
          "tr",
          null,
          ["Run", "State", "Cause", "Budget", "Tokens", "Cost", "Labels", "Created"].map((c) => h("th", { scope: "col" }, c)),
        ),
      ),
      body,
    );
    const area = h("div", { id: "runs-area" }, table);
    main.append(
      heading("Runs"),
      h(
        "div",
        { class: "toolbar" },
        h("label", { for: "runs-state-filter" }, "State"),
        select,
        refresh,
        h("span", { class: "spacer" }),
        prev,
        pageInfo,
        next,
      ),
      status,
      area,
    );

    let nextToken = "";
    let spendDenied = false;
    let loading = false;
    const load = async () => {
      if (loading || signal.aborted) return;
      loading = true;
      const page = state.tokens.length - 1;
      try {
        const resp = await api.listRuns(
          { pageSize: PAGE_SIZE, pageToken: state.tokens[page], state: state.filter },
          { signal },
        );
        nextToken = resp.nextPageToken;
        let spend: Map<string, RunSpend[]> | "denied" | undefined;
        if (spendDenied) {
          spend = "denied";
        } else if (resp.runs.length > 0) {
          try {
            const sp = await api.getSpend({ runIds: resp.runs.map((r) => r.runId) }, { signal });
            spend = new Map();
            for (const r of sp.runs) {
              const list = spend.get(r.runId) ?? [];
              list.push(r);
              spend.set(r.runId, list);
            }
          } catch (err) {
            if (isDenied(err)) {
              spend = "denied";
              spendDenied = true; // not asked again while this page is shown
            } else {
              showError(err, "GetSpend");
            }
          }
        }
        replace(
          body,
          resp.runs.map((run) =>
            h(
              "tr",
              { "data-run-id": run.runId, "data-state": enumName(RunStateSchema, run.state) },
              h("td", null, h("a", { href: `#/runs/${encodeURIComponent(run.runId)}`, class: "mono" }, run.runId)),
              h("td", null, stateBadge(run.state)),
              h("td", { class: "cause" }, run.cancelCause),
              h("td", null, budgetBar(run.budget, undefined, run.state === RunState.BUDGET_EXHAUSTED)),
              h("td", { class: "num" }, tokens(run.budget?.spentTokens ?? 0n)),
              spendCell(run, spend),
              h("td", null, labels(run)),
              h("td", null, timeElement(run.createdAt)),
            ),
          ),
        );
        if (resp.runs.length === 0) {
          body.append(h("tr", null, h("td", { colspan: 8, class: "muted" }, page === 0 ? "No runs." : "No more runs.")));
        }
        prev.disabled = page === 0;
        next.disabled = nextToken === "";
        pageInfo.textContent = `page ${page + 1}`;
        status.textContent = `${resp.runs.length} runs, updated ${new Date().toLocaleTimeString()}`;
        clearError();
      } catch (err) {
        if (isDenied(err)) {
          replace(area, scopeNote(err, "read"));
        } else {
          showError(err, "ListRuns");
        }
      } finally {
        loading = false;
      }
    };

    select.addEventListener("change", () => {
      state.filter = Number(select.value) as RunState;
      state.tokens = [""];
      void load();
    });
    refresh.addEventListener("click", () => void load());
    next.addEventListener("click", () => {
      if (!nextToken) return;
      state.tokens.push(nextToken);
      void load();
    });
    prev.addEventListener("click", () => {
      if (state.tokens.length > 1) state.tokens.pop();
      void load();
    });

    const timer = setInterval(() => {
      if (document.visibilityState === "visible") void load();
    }, REFRESH_MS);
    signal.addEventListener("abort", () => clearInterval(timer));
    await load();
  },
};
