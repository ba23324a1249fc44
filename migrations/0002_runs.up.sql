-- Runs: what a caller submitted, how each task ended, and the run's event
-- history, so that any orchestrator replica can answer GetRun and WatchRun,
-- also after a restart. Every row carries tenant_id; every read filters on it.

CREATE TABLE run (
    run_id          text PRIMARY KEY CHECK (run_id <> ''),
    tenant_id       text NOT NULL CHECK (tenant_id <> '' AND length(tenant_id) <= 128),
    idempotency_key text NOT NULL CHECK (idempotency_key <> '' AND octet_length(idempotency_key) <= 128),
    -- spec is the RunSpec as submitted, proto-encoded.
    spec            bytea NOT NULL,
    state           text NOT NULL DEFAULT 'RUNNING'
                    CHECK (state IN ('RUNNING', 'SUCCEEDED', 'FAILED', 'CANCELLED',
                                     'BUDGET_EXHAUSTED', 'TIMED_OUT')),
    cancel_cause    text NOT NULL DEFAULT '',
    -- result is the JoinedResult, proto-encoded; NULL while running.
    result          bytea,
    labels          jsonb NOT NULL DEFAULT '{}',
    -- owner is the orchestrator node driving the run.
    owner           text NOT NULL DEFAULT '',
    -- last_sequence is the sequence of the run's newest event; appending an
    -- event bumps it under the row lock, so sequences have no gaps.
    last_sequence   bigint NOT NULL DEFAULT 0 CHECK (last_sequence >= 0),
    created_at      timestamptz NOT NULL DEFAULT now(),
    finished_at     timestamptz,
    CONSTRAINT run_idempotency_key UNIQUE (tenant_id, idempotency_key),
    CONSTRAINT run_finished CHECK ((state = 'RUNNING') = (finished_at IS NULL))
);
CREATE INDEX run_tenant_newest ON run (tenant_id, created_at DESC, run_id DESC);

CREATE TABLE task (
    run_id         text NOT NULL REFERENCES run (run_id) ON DELETE CASCADE,
    task_id        text NOT NULL CHECK (task_id <> '' AND octet_length(task_id) <= 64),
    tenant_id      text NOT NULL,
    dispatch_index int NOT NULL CHECK (dispatch_index >= 0),
    status         text NOT NULL DEFAULT 'PENDING'
                   CHECK (status IN ('PENDING', 'RUNNING', 'SUCCEEDED', 'FAILED', 'TIMED_OUT',
                                     'CANCELLED', 'BUDGET_EXHAUSTED', 'ITERATION_LIMIT', 'SKIPPED')),
    -- outcome is the TaskOutcome, proto-encoded, once the task has ended.
    outcome        bytea,
    tokens_spent   bigint NOT NULL DEFAULT 0 CHECK (tokens_spent >= 0),
    worker         text NOT NULL DEFAULT '',
    started_at     timestamptz,
    finished_at    timestamptz,
    PRIMARY KEY (run_id, task_id),
    CONSTRAINT task_dispatch_index UNIQUE (run_id, dispatch_index)
);

CREATE TABLE run_event (
    run_id     text NOT NULL REFERENCES run (run_id) ON DELETE CASCADE,
    sequence   bigint NOT NULL CHECK (sequence >= 1),
    tenant_id  text NOT NULL,
    -- event is the RunEvent, proto-encoded, without sequence and time (the
    -- columns hold them).
    event      bytea NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, sequence)
);

GRANT SELECT, INSERT, UPDATE ON run, task TO fanout_app;
GRANT SELECT, INSERT ON run_event TO fanout_app;
