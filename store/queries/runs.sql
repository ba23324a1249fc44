-- name: RunByID :one
SELECT run_id, tenant_id, idempotency_key, spec, state, cancel_cause, result, labels, created_at, finished_at,
    coalesce(forked_from, '')::text AS forked_from, coalesce(parent_run_id, '')::text AS parent_run_id,
    coalesce(parent_task_id, '')::text AS parent_task_id, coalesce(parent_call, '')::text AS parent_call,
    coalesce(root_run_id, run_id)::text AS root_run_id, depth
FROM run
WHERE run_id = @run_id AND (@tenant_id::text = '' OR tenant_id = @tenant_id);

-- name: RunEnd :one
SELECT state, cancel_cause, created_at, finished_at
FROM run
WHERE run_id = @run_id;

-- name: RunByKey :one
SELECT run_id, tenant_id, idempotency_key, spec, state, cancel_cause, result, labels, created_at, finished_at,
    coalesce(forked_from, '')::text AS forked_from, coalesce(parent_run_id, '')::text AS parent_run_id,
    coalesce(parent_task_id, '')::text AS parent_task_id, coalesce(parent_call, '')::text AS parent_call,
    coalesce(root_run_id, run_id)::text AS root_run_id, depth
FROM run
WHERE tenant_id = @tenant_id AND idempotency_key = @idempotency_key;

-- name: RunSummaries :many
-- A page of a tenant's runs, newest first, without their jsonb documents,
-- each with its run account (none yet: NULL limit).
SELECT r.run_id, r.tenant_id, r.idempotency_key, r.state, r.cancel_cause, r.labels, r.created_at, r.finished_at,
    a.limit_tokens, coalesce(a.reserved, 0)::bigint AS reserved, coalesce(a.spent, 0)::bigint AS spent,
    coalesce(a.state = 'exhausted', false)::bool AS exhausted
FROM run r
LEFT JOIN account a ON a.run_id = r.run_id AND a.kind = 'run'
WHERE r.tenant_id = @tenant_id AND (@state::text = '' OR r.state = @state)
  AND (sqlc.narg('before_created')::timestamptz IS NULL
       OR (r.created_at, r.run_id) < (sqlc.narg('before_created')::timestamptz, @before_id::text))
ORDER BY r.created_at DESC, r.run_id DESC
LIMIT @max_runs;

-- name: Tasks :many
SELECT run_id, task_id, dispatch_index, status, outcome, tokens_spent, worker, started_at, finished_at
FROM task
WHERE run_id = ANY(@run_ids::text[])
ORDER BY run_id, dispatch_index;

-- name: TaskSummaries :many
-- Tasks without their outcome documents.
SELECT run_id, task_id, dispatch_index, status, tokens_spent, worker, started_at, finished_at
FROM task
WHERE run_id = ANY(@run_ids::text[])
ORDER BY run_id, dispatch_index;

-- name: TaskStatusAndOwner :one
SELECT t.status, r.owner
FROM task t JOIN run r USING (run_id)
WHERE t.run_id = @run_id AND t.task_id = @task_id;

-- name: LockTenantRuns :exec
-- The transaction-scoped lock every admission of the tenant's runs takes.
SELECT pg_advisory_xact_lock(hashtextextended('fanout.tenant_runs ' || @tenant_id::text, 0));

-- name: RunAdmission :one
SELECT EXISTS (SELECT FROM run k WHERE k.tenant_id = @tenant_id::text AND k.idempotency_key = @idempotency_key::text)::bool AS taken,
    -- A child run is part of its root run (docs/budget.md#nested-fan-out):
    -- counted, a tree under a cap of one run could never fan out.
    (SELECT count(*) FROM run r WHERE r.tenant_id = @tenant_id::text AND r.state = 'RUNNING'
        AND r.parent_run_id IS NULL)::bigint AS running;

-- name: InsertRun :one
INSERT INTO run (run_id, tenant_id, idempotency_key, spec, labels, owner, forked_from,
    parent_run_id, parent_task_id, parent_call, root_run_id, depth)
VALUES (@run_id, @tenant_id, @idempotency_key, @spec, @labels, @owner, nullif(@forked_from::text, ''),
    nullif(@parent_run_id::text, ''), nullif(@parent_task_id::text, ''), nullif(@parent_call::text, ''),
    nullif(@root_run_id::text, ''), @depth::int)
ON CONFLICT (tenant_id, idempotency_key) DO NOTHING
RETURNING created_at;

-- name: LockTreeRoot :exec
-- The root's row, which every child's open of its tree takes before it
-- counts the tree's tasks (TreeTasks), in a statement of its own: under
-- READ COMMITTED a statement's snapshot is taken when it starts, so a count
-- in the statement that waited for the lock would see the tree as it was
-- before the open it waited for (RunSpec.fan_out.max_tree_tasks).
SELECT FROM run WHERE run_id = @root_run_id::text FOR NO KEY UPDATE;

-- name: TreeTasks :one
-- How many tasks the tree under root_run_id has, every level counted.
SELECT count(*)::int AS tasks FROM task t JOIN run r USING (run_id)
WHERE r.run_id = @root_run_id::text OR r.root_run_id = @root_run_id::text;

-- name: RunIDByKey :one
SELECT run_id FROM run WHERE tenant_id = @tenant_id AND idempotency_key = @idempotency_key;

-- name: InsertTasks :exec
INSERT INTO task (run_id, task_id, tenant_id, dispatch_index)
SELECT @run_id, t.id, @tenant_id, t.n - 1
FROM unnest(@task_ids::text[]) WITH ORDINALITY AS t(id, n);

-- name: Heads :many
SELECT run_id, last_sequence, state FROM run WHERE run_id = ANY(@run_ids::text[]);

-- name: Heartbeat :many
-- Refreshes the lease of the runs of run_ids that owner drives, and returns
-- those another node drives now. The SELECT sees the rows as they were
-- before the UPDATE, which does not change owners. The rows are locked in
-- run id order (byte order: COLLATE "C"), the order in which every batch
-- that writes many runs takes them (startBatch, finishBatch, appendBatch):
-- taken in the order the scan finds them, a heartbeat of many runs
-- deadlocked with those batches, each deadlock failing a whole batch.
WITH mine AS (
    SELECT run_id FROM run
    WHERE run_id = ANY(@run_ids::text[]) AND owner = @owner::text AND state = 'RUNNING'
    ORDER BY run_id COLLATE "C"
    FOR NO KEY UPDATE),
beat AS (
    UPDATE run b SET owner_heartbeat = now() FROM mine WHERE b.run_id = mine.run_id)
SELECT r.run_id FROM run r WHERE r.run_id = ANY(@run_ids::text[]) AND r.owner <> @owner::text AND r.state = 'RUNNING';

-- name: AdoptOrphan :one
WITH orphan AS (
    SELECT run_id, owner FROM run
    WHERE state = 'RUNNING' AND owner_heartbeat < now() - @orphan_after::interval
    ORDER BY owner_heartbeat
    LIMIT 1
    FOR UPDATE SKIP LOCKED)
UPDATE run SET owner = @node, owner_heartbeat = now(),
    adoptions = run.adoptions + (orphan.owner <> @node)::int
FROM orphan WHERE run.run_id = orphan.run_id
RETURNING run.run_id, orphan.owner AS prev_owner, run.adoptions, now()::timestamptz AS adopted_at;

-- name: EventByKey :one
SELECT sequence, created_at FROM run_event WHERE run_id = @run_id AND event_key = CAST(@event_key::text AS uuid);

-- name: Events :many
SELECT sequence, event, created_at FROM run_event
WHERE run_id = @run_id AND tenant_id = @tenant_id AND sequence > @after
ORDER BY sequence
LIMIT @max_events;

-- name: RunTaskCount :one
-- How many tasks a tenant's run has (no row: no such run of the tenant).
SELECT (SELECT count(*) FROM task t WHERE t.run_id = r.run_id)::int AS task_count
FROM run r
WHERE r.run_id = @run_id AND r.tenant_id = @tenant_id;

-- name: RunTaskPage :many
-- A page of a run's tasks in dispatch order, from dispatch index @from_index.
SELECT run_id, task_id, dispatch_index, status, outcome, tokens_spent, worker, started_at, finished_at
FROM task
WHERE run_id = @run_id AND dispatch_index >= @from_index::int
ORDER BY dispatch_index
LIMIT @max_tasks;

-- name: SetContentKeys :exec
-- A new run's tasks' content keys, by dispatch index ('' for none:
-- a task that reused another's facts).
UPDATE task t SET content_key = nullif(k.key, '')
FROM unnest(@content_keys::text[]) WITH ORDINALITY AS k(key, n)
WHERE t.run_id = @run_id AND t.dispatch_index = k.n - 1 AND k.key <> '';

-- name: CachedTasks :many
-- The result cache (docs/budget.md#the-result-cache): of each of the
-- content keys, the tenant's newest SUCCEEDED task that has it and ended
-- no longer than max_age ago (database time), with its writes that were
-- sent (or may have been: unknown).
SELECT DISTINCT ON (t.content_key) t.content_key::text AS content_key, t.run_id, t.task_id, t.outcome,
    t.tokens_spent, t.finished_at::timestamptz AS finished_at,
    (SELECT count(*) FROM tool_call c
      WHERE c.tenant_id = t.tenant_id AND c.run_id = t.run_id AND c.task_id = t.task_id
        AND c.state IN ('done', 'failed', 'unknown'))::int AS writes
FROM task t
WHERE t.tenant_id = @tenant_id AND t.content_key = ANY(@content_keys::text[]) AND t.status = 'SUCCEEDED'
  AND t.content_key IS NOT NULL AND t.finished_at >= now() - @max_age::interval
ORDER BY t.content_key, t.finished_at DESC, t.run_id;

-- name: SentWrites :many
-- How many writes each task of a tenant's run sent (or may have: unknown).
SELECT task_id, count(*)::int AS writes
FROM tool_call
WHERE tenant_id = @tenant_id AND run_id = @run_id AND state IN ('done', 'failed', 'unknown')
GROUP BY task_id;
