-- name: TaskPrior :one
SELECT tasks, spent, peak FROM task_prior WHERE tenant_id = @tenant_id AND model = @model;

-- name: AddTaskPrior :execrows
-- Adds run @run_id's whole tasks to its tenant's prior for the model, once:
-- the run's prior_added is set in the same statement, and a run that has it
-- set adds nothing (0 rows). Past 1,000 tasks the old sums are halved
-- first, so that recent runs weigh more.
WITH mark AS (
    UPDATE run SET prior_added = true
    WHERE run_id = @run_id AND NOT prior_added
    RETURNING run_id
)
INSERT INTO task_prior AS p (tenant_id, model, tasks, spent, peak)
SELECT @tenant_id, @model, @tasks, @spent, @peak FROM mark
ON CONFLICT (tenant_id, model) DO UPDATE SET
    tasks = CASE WHEN p.tasks >= 1000 THEN p.tasks / 2 ELSE p.tasks END + excluded.tasks,
    spent = CASE WHEN p.tasks >= 1000 THEN p.spent / 2 ELSE p.spent END + excluded.spent,
    peak = greatest(CASE WHEN p.tasks >= 1000 THEN p.peak / 2 ELSE p.peak END + excluded.peak,
                    CASE WHEN p.tasks >= 1000 THEN p.spent / 2 ELSE p.spent END + excluded.spent),
    updated_at = now();
