// The fanout web console: a small hash router over the pages.
//
//   #/runs        the tenant's runs (the default)
//   #/runs/<id>   one run, live
//   #/new         start a run
//   #/spend       spend per day (scope audit)
//
// Every page needs a signed-in key; without one the sign-in form is shown
// in place of the page asked for, which follows once signed in. A server
// with authentication off (fanout dev) is asked first: the console opens
// on the page asked for, with no sign-in and no sign-out.

import { authOff, forget, probeAuthOff, signedIn } from "./api";
import { h, replace } from "./dom";
import { newRunPage } from "./pages/newrun";
import { runPage } from "./pages/run";
import { runsPage } from "./pages/runs";
import { signInPage } from "./pages/signin";
import { spendPage } from "./pages/spend";
import { clearError, heading, setTitle, type Page } from "./ui";

interface Route {
  nav: string; // which nav link is current
  page: Page;
}

function notFound(hash: string): Page {
  return {
    render(main) {
      setTitle("Not found");
      main.append(
        heading("Not found"),
        h("p", null, `Nothing here (${hash}). `, h("a", { href: "#/runs" }, "See the runs.")),
      );
    },
  };
}

function resolve(hash: string): Route {
  const path = hash.replace(/^#/, "") || "/runs";
  if (path === "/runs" || path === "/") return { nav: "runs", page: runsPage };
  if (path === "/new") return { nav: "new", page: newRunPage };
  if (path === "/spend") return { nav: "spend", page: spendPage };
  const m = /^\/runs\/([^/]+)$/.exec(path);
  if (m) return { nav: "runs", page: runPage(decodeURIComponent(m[1]!)) };
  return { nav: "", page: notFound(hash) };
}

let current: AbortController | null = null;

function updateChrome(nav: string): void {
  const inside = signedIn();
  document.getElementById("nav")!.hidden = !inside;
  document.getElementById("sign-out")!.hidden = !inside || authOff();
  document.getElementById("auth-note")!.hidden = !(inside && authOff());
  for (const a of document.querySelectorAll<HTMLAnchorElement>("#nav a[data-route]")) {
    if (a.dataset.route === nav) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
}

function route(): void {
  current?.abort();
  const ctl = new AbortController();
  current = ctl;
  clearError();
  const main = document.getElementById("page")!;
  replace(main);
  const r: Route = signedIn() ? resolve(location.hash) : { nav: "", page: signInPage(route) };
  updateChrome(r.nav);
  void Promise.resolve(r.page.render(main, ctl.signal)).catch(() => undefined);
  // Move focus to the new page's heading (unless the page focused a field),
  // so keyboard and screen-reader users land on it.
  const active = document.activeElement;
  if (!active || active === document.body || !main.contains(active)) {
    main.querySelector<HTMLElement>("h1")?.focus();
  }
}

async function start(): Promise<void> {
  document.getElementById("sign-out")!.addEventListener("click", () => {
    forget();
    location.hash = "#/runs";
    route();
  });
  window.addEventListener("hashchange", route);
  if (!signedIn()) await probeAuthOff();
  route();
}

if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", () => void start());
else void start();
