// A large run's rest: the server cuts a run and a joined result to fit each
// response under 2 MiB (docs/http.md "Sizes of a response"), with page
// tokens for what it left out; these page through ListRunTasks and
// ListRunFacts so that the run page shows every task and fact.

import type { Fact, JoinedResult, Run, TaskOutcome } from "./gen/fanout/v1/run_pb";
import type { ListRunFactsResponse, ListRunTasksResponse } from "./gen/fanout/v1/orchestrator_pb";

/** PAGE_SIZE is the page size asked: the server's maximum (a page may hold fewer, by bytes). */
export const PAGE_SIZE = 1000;

/** Pager is the part of the API client paging needs (api.ts's client has it). */
export interface Pager {
  listRunTasks(
    req: { runId: string; pageSize: number; pageToken: string },
    opts?: { signal?: AbortSignal },
  ): Promise<ListRunTasksResponse>;
  listRunFacts(
    req: { runId: string; pageSize: number; pageToken: string },
    opts?: { signal?: AbortSignal },
  ): Promise<ListRunFactsResponse>;
}

async function restOf<T>(have: T[], token: string, list: (token: string) => Promise<[T[], string]>): Promise<T[]> {
  const out = [...have];
  while (token) {
    const [page, next] = await list(token);
    if (page.length === 0 && next) throw new Error("the server returned an empty page with a next page token");
    out.push(...page);
    token = next;
  }
  return out;
}

/** restOfTasks returns have followed by the tasks of ListRunTasks from token on. */
export function restOfTasks(api: Pager, runId: string, have: TaskOutcome[], token: string, signal?: AbortSignal): Promise<TaskOutcome[]> {
  return restOf(have, token, async (pageToken) => {
    const r = await api.listRunTasks({ runId, pageSize: PAGE_SIZE, pageToken }, { signal });
    return [r.tasks, r.nextPageToken];
  });
}

/** restOfFacts returns have followed by the facts of ListRunFacts from token on. */
export function restOfFacts(api: Pager, runId: string, have: Fact[], token: string, signal?: AbortSignal): Promise<Fact[]> {
  return restOf(have, token, async (pageToken) => {
    const r = await api.listRunFacts({ runId, pageSize: PAGE_SIZE, pageToken }, { signal });
    return [r.facts, r.nextPageToken];
  });
}

/** completeResult fills in what the server cut of a joined result, in place, and clears its tokens. */
export async function completeResult(api: Pager, runId: string, res: JoinedResult, signal?: AbortSignal): Promise<void> {
  res.tasks = await restOfTasks(api, runId, res.tasks, res.tasksNextPageToken, signal);
  res.tasksNextPageToken = "";
  res.facts = await restOfFacts(api, runId, res.facts, res.factsNextPageToken, signal);
  res.factsNextPageToken = "";
}

/** completeRun fills in what the server cut of a run (its tasks, its result's), in place, and clears its tokens. */
export async function completeRun(api: Pager, run: Run, signal?: AbortSignal): Promise<void> {
  run.tasks = await restOfTasks(api, run.runId, run.tasks, run.tasksNextPageToken, signal);
  run.tasksNextPageToken = "";
  if (run.result) await completeResult(api, run.runId, run.result, signal);
}
