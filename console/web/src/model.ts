// The run page's model: a run folded from its WatchRun events, in sequence
// order. Pure (no DOM), so the timeline and the tables draw from one place.

import type { BudgetSnapshot, ConcurrencyChosen, FactSummary, JoinedResult, Run, RunEvent, TaskHedged, TaskOutcome } from "./gen/fanout/v1/run_pb";
import { RunState, TaskStatus } from "./gen/fanout/v1/run_pb";
import { date } from "./format";

/** Segment is one finished iteration of a task's agent loop. */
export interface Segment {
  end: Date;
  iteration: number;
  toolCalls: number;
}

/** TaskView is one task as the events tell it. */
export interface TaskView {
  id: string;
  dispatchIndex: number;
  status: TaskStatus;
  /** Queued for a slot (TaskQueued) and not started since. */
  queued: boolean;
  /** Iterations of the current attempt (TaskIteration.iteration, then FactSummary.iterations). */
  iterations: number;
  tokens: bigint;
  worker: string;
  /** How many times a worker started it (TaskStarted events): 1 unless re-dispatched. */
  attempts: number;
  forecastTokens: bigint;
  startedAt?: Date;
  finishedAt?: Date;
  /** The current attempt's iterations, for the timeline. */
  segments: Segment[];
  outcome?: TaskOutcome;
  summary?: FactSummary;
  /** When its second attempt started (TaskHedged; docs/budget.md#hedged-tasks), and the event. */
  hedgedAt?: Date;
  hedged?: TaskHedged;
}

/** RunView is a run as its events tell it. */
export interface RunView {
  runId: string;
  state: RunState;
  cause: string;
  budget?: BudgetSnapshot;
  run?: Run;
  tasks: TaskView[];
  /** Time of the first and the last event. */
  firstAt?: Date;
  lastAt?: Date;
  /**
   * When the budget ran out: the time of the run's one BudgetExhausted, the
   * event the engine sends for every run whose budget ran out, whatever the
   * path (proto BudgetExhausted; docs/budget.md, "When the budget ran out").
   * Nothing else sets it: fanout trace reads the same event.
   */
  exhaustedAt?: Date;
  finished: boolean;
  result?: JoinedResult;
  lastSequence: bigint;
  adoptions: number;
  /** How many times the run was continued with more budget (RunContinued). */
  continuations: number;
  /**
   * How many tasks may run at once and why, for a run whose concurrency
   * comes from the rate limits: its latest ConcurrencyChosen (or GetRun's
   * Run.concurrency); changes counts the events.
   */
  concurrency?: ConcurrencyChosen;
  concurrencyChanges: number;
}

export function newRunView(runId: string): RunView {
  return {
    runId,
    state: RunState.RUNNING,
    cause: "",
    tasks: [],
    finished: false,
    lastSequence: 0n,
    adoptions: 0,
    continuations: 0,
    concurrencyChanges: 0,
  };
}

// byId indexes each view's tasks by id: a run of 10,000 tasks folds 40,000
// events, and a search of the list for each cost seconds.
const byId = new WeakMap<RunView, Map<string, TaskView>>();

function task(v: RunView, id: string, dispatchIndex = -1): TaskView {
  let index = byId.get(v);
  if (!index || index.size !== v.tasks.length) {
    index = new Map(v.tasks.map((x) => [x.id, x]));
    byId.set(v, index);
  }
  let t = index.get(id);
  if (!t) {
    t = {
      id,
      dispatchIndex: dispatchIndex >= 0 ? dispatchIndex : v.tasks.length,
      status: TaskStatus.PENDING,
      queued: false,
      iterations: 0,
      tokens: 0n,
      worker: "",
      attempts: 0,
      forecastTokens: 0n,
      segments: [],
    };
    const last = v.tasks[v.tasks.length - 1];
    v.tasks.push(t);
    index.set(id, t);
    if (last && last.dispatchIndex > t.dispatchIndex) v.tasks.sort((a, b) => a.dispatchIndex - b.dispatchIndex);
  }
  return t;
}

function applyOutcome(t: TaskView, o: TaskOutcome, at: Date | undefined): void {
  t.status = o.status;
  t.outcome = o;
  t.summary = o.summary ?? t.summary;
  t.tokens = o.tokensSpent;
  t.worker = o.worker || t.worker;
  t.forecastTokens = o.forecastTokens || t.forecastTokens;
  t.startedAt = date(o.startedAt) ?? t.startedAt;
  t.finishedAt = date(o.finishedAt) ?? at ?? t.finishedAt;
  if (o.summary && o.summary.iterations > 0) t.iterations = o.summary.iterations;
  t.queued = false;
}

/** seedFromRun fills the view from a Run (GetRun or RunStarted), without going back in time. */
export function seedFromRun(v: RunView, run: Run): void {
  v.run = run;
  seedTasks(v, run.tasks);
  if (!v.budget && run.budget) v.budget = run.budget;
  if (!v.concurrency && run.concurrency) v.concurrency = run.concurrency;
  if (run.state !== RunState.RUNNING && run.state !== RunState.UNSPECIFIED) {
    v.state = run.state;
    v.cause = run.cancelCause;
    v.finished = true;
  }
  if (run.result) v.result = run.result;
}

/**
 * seedTasks adds the tasks the view lacks and takes what outcomes tell of
 * the others, without going back in time: a Run's tasks, or a page of
 * ListRunTasks (the rest of a run cut to fit its response).
 */
export function seedTasks(v: RunView, outcomes: TaskOutcome[]): void {
  for (const o of outcomes) {
    const t = task(v, o.taskId, o.dispatchIndex);
    if (o.status !== TaskStatus.PENDING && o.status !== TaskStatus.UNSPECIFIED) {
      if (o.status === TaskStatus.RUNNING) {
        t.status = o.status;
        t.worker = o.worker || t.worker;
        t.tokens = o.tokensSpent > t.tokens ? o.tokensSpent : t.tokens;
        t.startedAt = t.startedAt ?? date(o.startedAt);
      } else {
        applyOutcome(t, o, undefined);
      }
    }
  }
}

/**
 * applyEvent folds one event into the view. Events at or below the last
 * sequence seen are ignored (a resumed stream never repeats one, but a
 * duplicate must not count an iteration twice).
 */
export function applyEvent(v: RunView, ev: RunEvent): void {
  if (ev.sequence <= v.lastSequence) return;
  v.lastSequence = ev.sequence;
  const at = date(ev.time);
  if (at) {
    v.firstAt ??= at;
    v.lastAt = at;
  }
  const e = ev.event;
  switch (e.case) {
    case "runStarted":
      if (e.value.run) {
        for (const ts of e.value.run.spec?.tasks ?? []) task(v, ts.id);
        seedFromRun(v, e.value.run);
      }
      break;
    case "taskQueued": {
      const t = task(v, e.value.taskId, e.value.dispatchIndex);
      t.queued = true;
      t.status = TaskStatus.PENDING;
      break;
    }
    case "taskStarted": {
      const t = task(v, e.value.taskId);
      t.status = TaskStatus.RUNNING;
      t.queued = false;
      t.worker = e.value.worker;
      t.attempts += 1;
      t.forecastTokens = e.value.forecastTokens;
      t.startedAt = at;
      t.finishedAt = undefined;
      t.segments = [];
      t.iterations = 0;
      break;
    }
    case "taskIteration": {
      const t = task(v, e.value.taskId);
      t.iterations = Math.max(t.iterations, e.value.iteration);
      t.tokens = e.value.tokensSpent;
      if (at) t.segments.push({ end: at, iteration: e.value.iteration, toolCalls: e.value.toolCalls });
      break;
    }
    case "taskFinished":
      if (e.value.outcome) {
        applyOutcome(task(v, e.value.outcome.taskId), e.value.outcome, at);
      }
      break;
    case "budgetUpdate":
      if (e.value.budget) v.budget = e.value.budget;
      break;
    case "budgetExhausted":
      if (e.value.budget) v.budget = e.value.budget;
      v.exhaustedAt = v.exhaustedAt ?? at; // sent once; a replay after a resume repeats it
      break;
    case "runFinished":
      v.state = e.value.state;
      v.cause = e.value.cancelCause;
      v.finished = true;
      if (e.value.result) {
        v.result = e.value.result;
        for (const o of e.value.result.tasks) applyOutcome(task(v, o.taskId, o.dispatchIndex), o, undefined);
      }
      break;
    case "runContinued":
      // A run that ended BUDGET_EXHAUSTED reopens for the tasks it admits
      // again; a top-up of a running run changes only its budget
      // (docs/budget.md#continue). The first exhaustion keeps its marker.
      v.continuations += 1;
      if (e.value.reopened) {
        v.state = RunState.RUNNING;
        v.cause = "";
        v.finished = false;
        v.result = undefined;
        for (const id of e.value.taskIds) {
          const t = task(v, id);
          t.status = TaskStatus.PENDING;
          t.outcome = undefined;
        }
      }
      break;
    case "runAdopted":
      v.adoptions = e.value.adoptions;
      for (const id of e.value.resumedTaskIds) {
        const t = task(v, id);
        t.status = TaskStatus.PENDING;
      }
      break;
    case "concurrencyChosen":
      v.concurrency = e.value;
      v.concurrencyChanges += 1;
      break;
    case "taskHedged": {
      const t = task(v, e.value.taskId);
      t.hedgedAt = at;
      t.hedged = e.value;
      break;
    }
    case "approvalRequested":
    case "approvalDecided":
    case undefined:
      break;
  }
}

/** isTerminal reports a task status that no longer changes. */
export function isTerminal(s: TaskStatus): boolean {
  return s !== TaskStatus.PENDING && s !== TaskStatus.RUNNING && s !== TaskStatus.UNSPECIFIED;
}
