// Sign-in: paste an API key. The key is checked with a ListRuns call
// before it is kept (in sessionStorage only); an empty key is allowed, for
// a server with authentication off (fanout dev).

import { Code } from "@connectrpc/connect";
import { asConnectError, clientWithKey, describe, remember } from "../api";
import { h } from "../dom";
import { clearError, heading, setTitle, type Page } from "../ui";

export function signInPage(onSignedIn: () => void): Page {
  return {
    render(main) {
      setTitle("Sign in");
      const key = h("input", {
        id: "sign-in-key",
        name: "key",
        type: "password",
        autocomplete: "off",
        spellcheck: "false",
        "aria-describedby": "sign-in-help",
      });
      const submit = h("button", { id: "sign-in-submit", type: "submit" }, "Sign in");
      const status = h("p", { id: "sign-in-status", class: "status", role: "status" });
      const form = h(
        "form",
        { class: "card sign-in", "aria-labelledby": "sign-in-heading" },
        h("label", { for: "sign-in-key" }, "API key"),
        key,
        h(
          "p",
          { id: "sign-in-help", class: "help" },
          "A key fanout issued for your tenant (fanout key create). It is kept in this tab only, " +
            "until you sign out or close the tab. Leave it empty for a server with authentication off (fanout dev).",
        ),
        submit,
        status,
      );
      form.addEventListener("submit", async (ev) => {
        ev.preventDefault();
        clearError();
        submit.disabled = true;
        status.textContent = "Checking the key…";
        const value = key.value.trim();
        try {
          await clientWithKey(value).listRuns({ pageSize: 1 });
          remember(value, value === "");
          key.value = "";
          onSignedIn();
        } catch (err) {
          const e = asConnectError(err);
          if (e.code === Code.PermissionDenied && value !== "") {
            // A key without the read scope still signs in: it may start
            // runs, approve or read spend.
            remember(value, false);
            key.value = "";
            onSignedIn();
            return;
          }
          status.textContent =
            e.code === Code.Unauthenticated
              ? value === ""
                ? "This server needs an API key."
                : "The server refused this key (unknown, expired or revoked)."
              : `Could not check the key: ${describe(e)}`;
        } finally {
          submit.disabled = false;
        }
      });
      main.append(heading("Sign in"), form);
      key.focus();
    },
  };
}
