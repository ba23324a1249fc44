// Page chrome shared by every page: the title, the last error (#error) and
// the note shown in place of data a key's scopes do not cover.

import { describe, isAborted, missingScope } from "./api";
import { h } from "./dom";

/** Page is one route: render fills main; signal aborts when the user leaves. */
export interface Page {
  render(main: HTMLElement, signal: AbortSignal): void | Promise<void>;
}

/** setTitle names the page in the tab and in the document. */
export function setTitle(text: string): void {
  document.title = `${text} · fanout console`;
}

function errorBox(): HTMLElement {
  return document.getElementById("error")!;
}

/**
 * showError puts err in #error (role="alert", so it is announced), in the
 * words of its Connect code and message. Our own aborts (leaving a page)
 * are not errors.
 */
export function showError(err: unknown, context?: string): void {
  if (isAborted(err)) return;
  const box = errorBox();
  box.textContent = (context ? `${context}: ` : "") + describe(err);
  box.hidden = false;
}

/** clearError empties #error. */
export function clearError(): void {
  const box = errorBox();
  box.textContent = "";
  box.hidden = true;
}

/**
 * scopeNote is what stands in place of data the key may not read:
 * "needs the audit scope", with the server's message as its title.
 */
export function scopeNote(err: unknown, scope: string): HTMLElement {
  const name = missingScope(err, scope);
  return h("p", { class: "note scope-note", "data-scope": name, title: describe(err) }, `Needs the ${name} scope.`);
}

/** panel is a titled section of a page, labelled by its h2 (id). */
export function panel(id: string, title: string, ...content: Node[]): HTMLElement {
  return h("section", { "aria-labelledby": id, class: "panel" }, h("h2", { id }, title), ...content);
}

/** heading is a page's h1, focusable so navigation can move focus to it. */
export function heading(text: string, ...rest: (Node | string)[]): HTMLHeadingElement {
  return h("h1", { tabindex: "-1" }, text, ...rest);
}
