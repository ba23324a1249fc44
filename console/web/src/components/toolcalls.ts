// The run page's Writes: the MCP (and note) calls the run's subagents asked
// for, oldest first, with their state, decision and error (ListToolCalls,
// up to 1,000).

import { api, isDenied } from "../api";
import { h, replace } from "../dom";
import { timeElement } from "../format";
import type { ToolCall } from "../gen/fanout/v1/orchestrator_pb";
import { panel, scopeNote, showError } from "../ui";

/** ToolCallsPanel is the Writes section; load lists the run's writes again. */
export interface ToolCallsPanel {
  el: HTMLElement;
  load(): Promise<void>;
}

function decision(c: ToolCall): string {
  if (!c.decision) return "";
  const { approved, actor, reason } = c.decision;
  return `${approved ? "approved" : "denied"} by ${actor}${reason ? `: ${reason}` : ""}`;
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
          h("td", null, decision(c)),
          h("td", null, c.error),
          h("td", null, c.preview ? h("code", { class: "preview" }, c.preview) : ""),
          h("td", null, timeElement(c.createdAt)),
          h("td", null, timeElement(c.resolvedAt)),
        ),
      ),
    ),
  );
}

/** toolCallsPanel is the run page's Writes section for run runId. */
export function toolCallsPanel(runId: string, signal: AbortSignal): ToolCallsPanel {
  const area = h("div", { id: "tool-calls" });
  const load = async () => {
    try {
      const calls: ToolCall[] = [];
      let pageToken = "";
      do {
        const resp = await api.listToolCalls({ runId, pageSize: 200, pageToken }, { signal });
        calls.push(...resp.calls);
        pageToken = resp.nextPageToken;
      } while (pageToken && calls.length < 1000);
      replace(area, toolCallTable(calls));
    } catch (err) {
      if (isDenied(err)) replace(area, scopeNote(err, "read"));
      else showError(err, "ListToolCalls");
    }
  };
  return { el: panel("h-tool-calls", "Writes (MCP and note)", area), load };
}
