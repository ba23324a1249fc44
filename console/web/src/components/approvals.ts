// The run page's Pending approvals: each write waiting for a decision
// (ListApprovals), with Approve and Deny (ApproveToolCall, DenyToolCall;
// a denial needs a reason, which the model is told).

import { api, isDenied } from "../api";
import { h, replace } from "../dom";
import { timeElement } from "../format";
import type { PendingToolCall } from "../gen/fanout/v1/orchestrator_pb";
import { clearError, panel, scopeNote, showError } from "../ui";

/** ApprovalsPanel is the Pending approvals section; load lists them again. */
export interface ApprovalsPanel {
  el: HTMLElement;
  load(): Promise<void>;
}

// approvalItem is one pending write; decide sends the decision.
function approvalItem(c: PendingToolCall, decide: (approved: boolean, reason: string) => Promise<boolean>): HTMLElement {
  const reasonId = `deny-reason-${c.callId}`;
  const why = h("input", { id: reasonId, type: "text", maxlength: 1024, autocomplete: "off" });
  const approve = h("button", { type: "button", "data-testid": "approve", "data-call-id": c.callId }, "Approve");
  const deny = h("button", { type: "button", class: "danger", "data-testid": "deny", "data-call-id": c.callId }, "Deny");
  const send = async (approved: boolean) => {
    approve.disabled = deny.disabled = true;
    if (!(await decide(approved, why.value.trim()))) approve.disabled = deny.disabled = false;
  };
  approve.addEventListener("click", () => void send(true));
  deny.addEventListener("click", () => {
    if (!why.value.trim()) {
      why.setAttribute("aria-invalid", "true");
      why.focus();
      showError(new Error("say why the write is denied (the model is told)"), "DenyToolCall");
      return;
    }
    void send(false);
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
}

/**
 * approvalsPanel is the run page's Pending approvals section for run
 * runId; after a decision it lists them again and calls decided (the page
 * reloads the writes).
 */
export function approvalsPanel(runId: string, signal: AbortSignal, decided: () => Promise<void>): ApprovalsPanel {
  const area = h("div", { id: "approvals" });
  let shown = "";
  // decide reports whether the decision was recorded.
  const decide = async (callId: string, approved: boolean, reason: string): Promise<boolean> => {
    try {
      const req = { callId, reason };
      if (approved) await api.approveToolCall(req, { signal });
      else await api.denyToolCall(req, { signal });
      clearError();
      shown = "";
      await Promise.all([load(), decided()]);
      return true;
    } catch (err) {
      showError(err, approved ? "ApproveToolCall" : "DenyToolCall");
      return false;
    }
  };
  const list = (calls: PendingToolCall[]): HTMLElement => {
    if (!calls.length) return h("p", { class: "muted", id: "approvals-none" }, "None pending.");
    return h(
      "ul",
      { class: "approvals", id: "approvals-list" },
      calls.map((c) => approvalItem(c, (approved, reason) => decide(c.callId, approved, reason))),
    );
  };
  const load = async () => {
    try {
      const resp = await api.listApprovals({ runId, pageSize: 200 }, { signal });
      const key = resp.calls.map((c) => c.callId).join(",");
      if (key === shown && area.childElementCount) return; // keep what is typed in a reason
      shown = key;
      replace(area, list(resp.calls));
    } catch (err) {
      if (isDenied(err)) replace(area, scopeNote(err, "approve"));
      else showError(err, "ListApprovals");
    }
  };
  return { el: panel("h-approvals", "Pending approvals", area), load };
}
