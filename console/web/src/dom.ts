// Small DOM helpers. Every element is built with createElement and text
// nodes, never from HTML strings, so nothing a run holds (facts, previews,
// labels) can become markup; and no "style" attribute is ever set, which
// the Content-Security-Policy (style-src 'self') would refuse.

export type Child = Node | string | number | bigint | null | undefined | false | Child[];

type AttrValue = string | number | boolean | null | undefined;
export type Attrs = Record<string, AttrValue | ((ev: Event) => void)>;

const SVG_NS = "http://www.w3.org/2000/svg";

function setAttrs(el: Element, attrs: Attrs | null | undefined): void {
  if (!attrs) return;
  for (const [name, value] of Object.entries(attrs)) {
    if (name === "style") {
      throw new Error("style attributes are refused by the console's CSP: use a class");
    }
    if (typeof value === "function") {
      el.addEventListener(name.replace(/^on/, ""), value);
    } else if (value === true) {
      el.setAttribute(name, "");
    } else if (value !== false && value !== null && value !== undefined) {
      el.setAttribute(name, String(value));
    }
  }
}

function append(el: Element, children: Child[]): void {
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else if (c instanceof Node) el.appendChild(c);
    else el.appendChild(document.createTextNode(String(c)));
  }
}

/** h builds an HTML element: attributes ("onclick" adds a listener), then children. */
export function h<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  attrs?: Attrs | null,
  ...children: Child[]
): HTMLElementTagNameMap[K] {
  const el = document.createElement(tag);
  setAttrs(el, attrs);
  append(el, children);
  return el;
}

/** s builds an SVG element, as h does. */
export function s<K extends keyof SVGElementTagNameMap>(
  tag: K,
  attrs?: Attrs | null,
  ...children: Child[]
): SVGElementTagNameMap[K] {
  const el = document.createElementNS(SVG_NS, tag) as SVGElementTagNameMap[K];
  setAttrs(el, attrs);
  append(el, children);
  return el;
}

/** replace empties el and appends children. */
export function replace(el: Element, ...children: Child[]): void {
  el.replaceChildren();
  append(el, children);
}

/** visuallyHidden is text for screen readers only. */
export function visuallyHidden(text: string): HTMLSpanElement {
  return h("span", { class: "visually-hidden" }, text);
}
