// New run: a RunSpec as JSON (prefilled with the demo's,
// examples/research.json, bundled at build time), started with StartRun;
// then the run's page.

import { fromJson, type JsonObject } from "@bufbuild/protobuf";
import { api } from "../api";
import { h } from "../dom";
import { RunSpecSchema } from "../gen/fanout/v1/run_pb";
import { clearError, heading, setTitle, showError, type Page } from "../ui";
import research from "../../../../examples/research.json";

// Keys the console makes start with this; a key the user typed is kept.
const AUTO_KEY = "console-";

function freshKey(): string {
  return `${AUTO_KEY}${Date.now()}-${Math.floor(Math.random() * 1e6)}`;
}

function demoSpec(): string {
  return JSON.stringify({ ...research.spec, idempotencyKey: freshKey() }, null, 2);
}

export const newRunPage: Page = {
  render(main, signal) {
    setTitle("New run");
    const text = h("textarea", {
      id: "new-run-spec",
      name: "spec",
      rows: 24,
      spellcheck: "false",
      "aria-describedby": "new-run-help",
    });
    text.value = demoSpec();
    const submit = h("button", { id: "new-run-submit", type: "submit" }, "Start run");
    const reset = h("button", { id: "new-run-reset", type: "button", class: "secondary" }, "Reset to the demo spec");
    const status = h("p", { id: "new-run-status", class: "status", role: "status" });
    const form = h(
      "form",
      { class: "card new-run", "aria-labelledby": "new-run-label" },
      h("label", { id: "new-run-label", for: "new-run-spec" }, "Run spec (JSON)"),
      h(
        "p",
        { id: "new-run-help", class: "help" },
        "A RunSpec in JSON, or a RunRequest ({\"spec\": {…}}) as fanout run -f takes it; prefilled with examples/research.json. " +
          `An idempotency key starting with "${AUTO_KEY}" is made anew on each start; another key is kept, ` +
          "and starting it again returns the run it already started.",
      ),
      text,
      h("div", { class: "buttons" }, submit, reset),
      status,
    );
    reset.addEventListener("click", () => {
      text.value = demoSpec();
      text.removeAttribute("aria-invalid");
    });
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      clearError();
      let doc: JsonObject;
      try {
        const parsed: unknown = JSON.parse(text.value);
        if (typeof parsed !== "object" || parsed === null || Array.isArray(parsed)) throw new Error("not a JSON object");
        doc = parsed as JsonObject;
        if (typeof doc.spec === "object" && doc.spec !== null && !Array.isArray(doc.spec)) doc = doc.spec;
        const key = doc.idempotencyKey ?? doc.idempotency_key;
        if (key === undefined || key === "" || (typeof key === "string" && key.startsWith(AUTO_KEY))) {
          delete doc.idempotency_key;
          doc.idempotencyKey = freshKey();
          text.value = JSON.stringify(doc, null, 2);
        }
      } catch (err) {
        text.setAttribute("aria-invalid", "true");
        showError(new Error(`the spec is not valid JSON: ${(err as Error).message}`), "New run");
        return;
      }
      let spec;
      try {
        spec = fromJson(RunSpecSchema, doc);
      } catch (err) {
        text.setAttribute("aria-invalid", "true");
        showError(new Error(`the spec is not a RunSpec: ${(err as Error).message}`), "New run");
        return;
      }
      text.removeAttribute("aria-invalid");
      submit.disabled = true;
      status.textContent = "Starting…";
      try {
        const resp = await api.startRun({ spec }, { signal });
        status.textContent = `Started run ${resp.runId}.`;
        location.hash = `#/runs/${encodeURIComponent(resp.runId)}`;
      } catch (err) {
        status.textContent = "";
        showError(err, "StartRun");
      } finally {
        submit.disabled = false;
      }
    });
    main.append(heading("New run"), form);
  },
};
