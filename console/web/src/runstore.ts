// The run page's store: one RunView (model.ts) and the components that draw
// it. A change is folded at once and drawn at most every 100 ms, so a burst
// of events costs one redraw; once the page's signal aborts (the user left)
// nothing is drawn.

import type { Run, RunEvent } from "./gen/fanout/v1/run_pb";
import { applyEvent, newRunView, seedFromRun, type RunView } from "./model";

/** DRAW_DELAY_MS is how long a change waits for others before it is drawn. */
export const DRAW_DELAY_MS = 100;

/** Subscriber draws the view; it is called after changes, never during one. */
export type Subscriber = (v: RunView) => void;

/** RunStore holds one run's view for the run page. */
export interface RunStore {
  /** view is the run as folded so far; change it through apply, seed or update. */
  readonly view: RunView;
  /** subscribe adds a subscriber (called in the order added) and returns its removal. */
  subscribe(fn: Subscriber): () => void;
  /** apply folds one WatchRun event (model.ts applyEvent). */
  apply(ev: RunEvent): void;
  /** seed fills the view from a Run (GetRun), without going back in time. */
  seed(run: Run): void;
  /** update changes the view by hand (a cancel's cause before its event). */
  update(fn: (v: RunView) => void): void;
  /** changed schedules a draw of the view as it is (the clock moved). */
  changed(): void;
  /** flush draws now. */
  flush(): void;
}

/** Schedule runs draw later: after DRAW_DELAY_MS in the page, when a test says in tests. */
export type Schedule = (draw: () => void) => void;

const afterDelay: Schedule = (draw) => {
  setTimeout(draw, DRAW_DELAY_MS);
};

/** createRunStore is the store of run runId, drawing until signal aborts. */
export function createRunStore(runId: string, signal: AbortSignal, schedule: Schedule = afterDelay): RunStore {
  const view = newRunView(runId);
  const subscribers = new Set<Subscriber>();
  let scheduled = false;
  const flush = () => {
    scheduled = false;
    if (signal.aborted) return;
    for (const fn of subscribers) fn(view);
  };
  const changed = () => {
    if (scheduled) return;
    scheduled = true;
    schedule(flush);
  };
  return {
    view,
    subscribe(fn) {
      subscribers.add(fn);
      return () => subscribers.delete(fn);
    },
    apply(ev) {
      applyEvent(view, ev);
      changed();
    },
    seed(run) {
      seedFromRun(view, run);
      changed();
    },
    update(fn) {
      fn(view);
      changed();
    },
    changed,
    flush,
  };
}
