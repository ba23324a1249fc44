-- ledger_adopt_runs puts every run of tenant account t's tenant that is not
-- under it (a run opened before the tenant had a budget) under it, with
-- its tasks and the reservations they hold: from the caller's commit the
-- tenant's budget bounds them (I16). What they hold counts as reserved on
-- the tenant's account and settles in its current period, and what they
-- hold back for their synthesis as held on it; what they spent before
-- stays outside it. The limit is raised, never the reservations
-- cut, when they hold more than the budget leaves (the tenant is then
-- exhausted: the caller checks). Callers hold t's row lock; the runs and
-- their tasks are locked here, root first, as ledger_lock_chain does, and
-- a reserve, settle or void that read an account's chain before this
-- commit is refused by ledger_lock_chain as stale, to be retried.
CREATE OR REPLACE FUNCTION ledger_adopt_runs(t account) RETURNS account
LANGUAGE plpgsql SET search_path = pg_catalog, fanout, pg_temp AS $$
DECLARE
    moved     bigint[];
    res_held  bigint; -- what their reservations hold
    kept      bigint; -- the runs' synthesis allowances (account.held)
    new_limit bigint;
BEGIN
    SELECT array_agg(account_id ORDER BY account_id) INTO moved
      FROM (SELECT account_id FROM account
             WHERE tenant_id = t.tenant_id AND kind = 'run' AND parent_id IS NULL AND parent_task IS NULL
               AND state <> 'closed'
             ORDER BY account_id FOR UPDATE) AS r;
    IF moved IS NULL THEN
        RETURN t;
    END IF;
    PERFORM FROM account WHERE kind = 'task' AND parent_id = ANY (moved) ORDER BY chain FOR UPDATE;
    SELECT coalesce(sum(amount), 0) INTO res_held
      FROM reservation WHERE state = 'held' AND chain[1] = ANY (moved);
    -- A sliced task's slice counts as reserved on its run: what it has not
    -- posted, on the tenant's account too, carved in the tenant's period.
    res_held := res_held + (SELECT coalesce(sum(limit_tokens - posted), 0) FROM account
                             WHERE kind = 'task' AND parent_id = ANY (moved) AND cap_tokens IS NOT NULL);
    UPDATE account SET slice_until = t.period_end
     WHERE kind = 'task' AND parent_id = ANY (moved) AND cap_tokens IS NOT NULL;
    SELECT coalesce(sum(a.held), 0) INTO kept FROM account a WHERE a.account_id = ANY (moved);
    UPDATE reservation SET chain = t.account_id || chain WHERE state = 'held' AND chain[1] = ANY (moved);
    UPDATE account SET parent_id = t.account_id WHERE account_id = ANY (moved);
    UPDATE account SET chain = t.account_id || chain, updated_at = now()
     WHERE account_id = ANY (moved) OR (kind = 'task' AND parent_id = ANY (moved));
    new_limit := greatest(t.limit_tokens, t.spent + t.reserved + res_held + t.held + kept);
    INSERT INTO ledger_entry (tenant_id, account_id, chain, kind, delta_limit, delta_reserved, delta_held, note)
    VALUES (t.tenant_id, t.account_id, ARRAY[t.account_id], 'adjust', new_limit - t.limit_tokens, res_held, kept,
            format('%s run(s) opened before the tenant budget put under it; the %s tokens they hold and the %s they keep for synthesis count in it',
                   cardinality(moved), res_held, kept));
    UPDATE account SET reserved = reserved + res_held, held = held + kept, limit_tokens = new_limit, updated_at = now()
     WHERE account_id = t.account_id
    RETURNING * INTO t;
    RETURN t;
END $$;
REVOKE ALL ON FUNCTION ledger_adopt_runs(account) FROM PUBLIC;
