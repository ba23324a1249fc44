-- run_tree_spend: every run with its place in the tree of child runs
-- (docs/ledger.md#child-runs) and its spend per level: own_spent_tokens is
-- what its own tasks' calls spent; spent_tokens what its account counts
-- (run_spend's: its own and its closed children's, as their fundings were
-- settled or expired); tree_spent_tokens adds what its children still in
-- flight have spent so far, at every depth (a child's spend is counted
-- through the first funding above it that is no longer held, else itself).
-- A root run's tree_spent_tokens is the whole tree's spend.
CREATE VIEW run_tree_spend AS
WITH RECURSIVE
  runs AS (
    SELECT a.account_id, a.tenant_id, a.run_id, a.limit_tokens, a.state, a.parent_task,
           a.spent + coalesce(u.unposted, 0) AS spent,
           p.run_id AS parent_run_id, t.task_id AS parent_task_id,
           f.state AS funding_state, coalesce(f.spent, 0) AS funding_spent
      FROM account a
      LEFT JOIN account t ON t.account_id = a.parent_task
      LEFT JOIN account p ON p.account_id = t.parent_id
      LEFT JOIN reservation f ON f.reservation_id = a.funding
      LEFT JOIN (SELECT parent_id AS account_id, sum(spent - posted) AS unposted
                   FROM account WHERE kind = 'task' AND cap_tokens IS NOT NULL
                  GROUP BY parent_id) u ON u.account_id = a.account_id
     WHERE a.kind = 'run'),
  -- tree(root, run, depth): each run under its root.
  tree AS (
    SELECT r.run_id AS root_run_id, r.run_id, 0 AS depth FROM runs r WHERE r.parent_task IS NULL
    UNION ALL
    SELECT tr.root_run_id, c.run_id, tr.depth + 1
      FROM tree tr JOIN runs c ON c.parent_run_id = tr.run_id),
  -- live(ancestor, run): run is in ancestor's subtree and every funding
  -- on the way down is still held.
  live AS (
    SELECT r.run_id AS ancestor, r.run_id FROM runs r
    UNION ALL
    SELECT l.ancestor, c.run_id
      FROM live l JOIN runs c ON c.parent_run_id = l.run_id AND c.funding_state = 'held')
SELECT r.tenant_id, r.run_id, r.parent_run_id, r.parent_task_id, tr.root_run_id, tr.depth, r.state,
       r.limit_tokens, r.spent::bigint AS spent_tokens,
       (r.spent - coalesce((SELECT sum(c.funding_spent) FROM runs c
                             WHERE c.parent_run_id = r.run_id AND c.funding_state <> 'held'), 0))::bigint AS own_spent_tokens,
       (SELECT sum(d.spent) FROM live l JOIN runs d ON d.run_id = l.run_id WHERE l.ancestor = r.run_id)::bigint
         AS tree_spent_tokens
  FROM runs r
  JOIN tree tr ON tr.run_id = r.run_id;
GRANT SELECT ON run_tree_spend TO fanout_app, fanout_auditor;
