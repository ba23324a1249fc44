// The API client: Connect (JSON) to fanout.v1.OrchestratorService at this
// page's origin, with the signed-in API key as a bearer token, and the
// helpers that turn its errors into words.

import { Code, ConnectError, createClient, type Client, type Interceptor } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-web";
import { OrchestratorService } from "./gen/fanout/v1/orchestrator_pb";

export type Orchestrator = Client<typeof OrchestratorService>;

// The key lives in sessionStorage only: gone when the tab closes, never in
// localStorage, a URL or a log. An empty string is a valid key (a server
// with authentication off takes any key, or none).
const KEY_ITEM = "fanout.console.apiKey";
const AUTH_OFF_ITEM = "fanout.console.authOff";

/** signedIn reports whether a key (possibly empty) was accepted in this tab. */
export function signedIn(): boolean {
  return storedKey() !== null;
}

function storedKey(): string | null {
  try {
    return sessionStorage.getItem(KEY_ITEM);
  } catch {
    return null;
  }
}

/** authOff reports whether signing in with no key worked (a hint: the server may have authentication off). */
export function authOff(): boolean {
  try {
    return sessionStorage.getItem(AUTH_OFF_ITEM) === "1";
  } catch {
    return false;
  }
}

/** remember keeps key for this tab's session. */
export function remember(key: string, serverHasAuthOff: boolean): void {
  sessionStorage.setItem(KEY_ITEM, key);
  if (serverHasAuthOff) sessionStorage.setItem(AUTH_OFF_ITEM, "1");
  else sessionStorage.removeItem(AUTH_OFF_ITEM);
}

/**
 * probeAuthOff asks the server whether it needs a key: a ListRuns with
 * none. When that is answered, authentication is off (fanout dev) and the
 * tab is signed in with no key; any error (UNAUTHENTICATED on a server
 * with keys, or no answer) leaves the sign-in form to say what is wrong.
 */
export async function probeAuthOff(): Promise<boolean> {
  try {
    await clientWithKey("").listRuns({ pageSize: 1 });
  } catch {
    return false;
  }
  remember("", true);
  return true;
}

/** forget signs out: the key is removed from this tab. */
export function forget(): void {
  sessionStorage.removeItem(KEY_ITEM);
  sessionStorage.removeItem(AUTH_OFF_ITEM);
}

function bearer(key: () => string | null): Interceptor {
  return (next) => async (req) => {
    const k = key();
    if (k) req.header.set("Authorization", `Bearer ${k}`);
    return next(req);
  };
}

function newClient(key: () => string | null): Orchestrator {
  // Same origin as the page: the orchestrator serves the console and the
  // API on one listener (no CORS; the CSP's connect-src is 'self').
  const transport = createConnectTransport({
    baseUrl: location.origin,
    interceptors: [bearer(key)],
  });
  return createClient(OrchestratorService, transport);
}

/** api is the client every page uses: it sends the signed-in key. */
export const api: Orchestrator = newClient(storedKey);

/** clientWithKey is a client for one key, used to check a key before keeping it. */
export function clientWithKey(key: string): Orchestrator {
  return newClient(() => key);
}

/** asConnectError returns err as a ConnectError (a fetch failure becomes one too). */
export function asConnectError(err: unknown): ConnectError {
  return ConnectError.from(err);
}

/** codeName is a Connect code as the protocol spells it: "permission_denied". */
export function codeName(code: Code): string {
  const name = Code[code] ?? String(code);
  return name.replace(/([a-z])([A-Z])/g, "$1_$2").toLowerCase();
}

/** describe is an error in one line: its code and message. */
export function describe(err: unknown): string {
  const e = asConnectError(err);
  return `${codeName(e.code)}: ${e.rawMessage}`;
}

/** isDenied reports a missing scope (or another tenant's resource refused as such). */
export function isDenied(err: unknown): boolean {
  return asConnectError(err).code === Code.PermissionDenied;
}

/** isAborted reports an error caused by our own AbortSignal (leaving a page). */
export function isAborted(err: unknown): boolean {
  return asConnectError(err).code === Code.Canceled;
}

/**
 * missingScope names the scope a PERMISSION_DENIED error says the key
 * lacks ('lacks scope "audit"'), or fallback when the message names none.
 */
export function missingScope(err: unknown, fallback: string): string {
  const m = /scope "?([a-z]+)"?/.exec(asConnectError(err).rawMessage);
  return m?.[1] ?? fallback;
}
