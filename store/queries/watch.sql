-- name: EndedRuns :many
SELECT run_id::text AS run_id, state, cause FROM account
WHERE kind = 'run' AND run_id = ANY(@run_ids::text[]) AND state <> 'open';
