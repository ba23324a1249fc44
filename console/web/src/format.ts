// Formatting of numbers, times, money and budgets.

import { timestampDate, type Timestamp } from "@bufbuild/protobuf/wkt";
import type { BudgetSnapshot } from "./gen/fanout/v1/run_pb";
import type { Spend } from "./gen/fanout/v1/orchestrator_pb";
import { h, s } from "./dom";

const intFormat = new Intl.NumberFormat("en-US");

/** tokens formats a token count with thousands separators. */
export function tokens(n: bigint | number): string {
  return intFormat.format(n);
}

/** date converts a Timestamp, or returns undefined when it is unset. */
export function date(ts: Timestamp | undefined): Date | undefined {
  return ts ? timestampDate(ts) : undefined;
}

function pad(n: number): string {
  return String(n).padStart(2, "0");
}

/** time formats a timestamp in local time as YYYY-MM-DD HH:MM:SS. */
export function time(ts: Timestamp | Date | undefined): string {
  const d = ts instanceof Date ? ts : date(ts);
  if (!d) return "";
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

/** timeElement is a <time> element for a timestamp. */
export function timeElement(ts: Timestamp | undefined): HTMLTimeElement | string {
  const d = date(ts);
  if (!d) return "";
  return h("time", { datetime: d.toISOString() }, time(d));
}

/** duration formats milliseconds as "850 ms", "12.3 s" or "4 min 05 s". */
export function duration(ms: number): string {
  if (ms < 1000) return `${Math.round(ms)} ms`;
  if (ms < 60_000) return `${(ms / 1000).toFixed(1)} s`;
  const m = Math.floor(ms / 60_000);
  return `${m} min ${pad(Math.round((ms % 60_000) / 1000))} s`;
}

/**
 * money formats a Spend's cost ("0.0421 USD"), with its unpriced tokens
 * after it; costs are exact decimal strings and are shown as given.
 */
export function money(sp: Spend | undefined): string {
  if (!sp) return "";
  const parts: string[] = [];
  if (sp.currency) parts.push(`${sp.cost || "0"} ${sp.currency}`);
  if (sp.unpricedTokens > 0n) parts.push(`${tokens(sp.unpricedTokens)} tokens unpriced`);
  return parts.join(", ") || "0";
}

/**
 * addDecimal adds two non-negative decimal strings exactly ("0.10" +
 * "0.2" = "0.30"), for totals of costs the server gives as numerics.
 */
export function addDecimal(a: string, b: string): string {
  const [ai, af = ""] = (a || "0").split(".");
  const [bi, bf = ""] = (b || "0").split(".");
  const scale = Math.max(af.length, bf.length);
  const sum = BigInt(ai + af.padEnd(scale, "0")) + BigInt(bi + bf.padEnd(scale, "0"));
  if (scale === 0) return sum.toString();
  const digits = sum.toString().padStart(scale + 1, "0");
  return `${digits.slice(0, -scale)}.${digits.slice(-scale)}`;
}

/**
 * budgetBar draws a run's budget as an SVG bar: spent, reserved and held
 * for the synthesis, out of the limit, with the figures beside it in text.
 */
export function budgetBar(b: BudgetSnapshot | undefined, id?: string, runExhausted = false): HTMLElement {
  if (!b || b.limitTokens === 0n) return h("span", { class: "muted" }, "no budget reported");
  // A run can end BUDGET_EXHAUSTED with an account that is not (tasks it
  // could not afford were never started): drawn as exhausted all the same.
  const exhausted = b.exhausted || runExhausted;
  const limit = Number(b.limitTokens);
  const frac = (n: bigint) => Math.min(Math.max(Number(n) / limit, 0), 1) * 100;
  const spent = frac(b.spentTokens);
  const reserved = Math.min(frac(b.reservedTokens), 100 - spent);
  const held = Math.min(frac(b.heldTokens), 100 - spent - reserved);
  const label =
    `${tokens(b.spentTokens)} of ${tokens(b.limitTokens)} tokens spent` +
    (b.reservedTokens > 0n ? `, ${tokens(b.reservedTokens)} reserved` : "") +
    (b.heldTokens > 0n ? `, ${tokens(b.heldTokens)} held for the synthesis` : "") +
    (exhausted ? ", exhausted" : "");
  const svg = s(
    "svg",
    { class: "budget-bar", viewBox: "0 0 100 10", preserveAspectRatio: "none", role: "img", "aria-label": label },
    s("title", null, label),
    s("rect", { class: "budget-track", x: 0, y: 0, width: 100, height: 10 }),
    s("rect", { class: "budget-spent", x: 0, y: 0, width: spent, height: 10 }),
    s("rect", { class: "budget-reserved", x: spent, y: 0, width: reserved, height: 10 }),
    s("rect", { class: "budget-held", x: spent + reserved, y: 0, width: held, height: 10 }),
  );
  return h(
    "span",
    { class: exhausted ? "budget exhausted" : "budget", id: id ?? null },
    svg,
    h("span", { class: "budget-text" }, `${tokens(b.spentTokens)} / ${tokens(b.limitTokens)}`, exhausted ? " exhausted" : ""),
  );
}
