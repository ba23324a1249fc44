// Enum values in words: the one place that turns them into text.

import type { DescEnum } from "@bufbuild/protobuf";

/**
 * enumText is an enum value's name without its prefix, as the CLI prints it
 * (RUN_STATE_BUDGET_EXHAUSTED -> BUDGET_EXHAUSTED).
 */
export function enumText(desc: DescEnum, value: number): string {
  const v = desc.value[value];
  if (!v) return String(value);
  // sharedPrefix is lower case ("run_state_"); the names are upper case.
  const prefix = desc.sharedPrefix ?? "";
  return prefix && v.name.toLowerCase().startsWith(prefix) ? v.name.slice(prefix.length) : v.name;
}

/** enumName is an enum value's full proto name (RUN_STATE_BUDGET_EXHAUSTED). */
export function enumName(desc: DescEnum, value: number): string {
  return desc.value[value]?.name ?? String(value);
}
