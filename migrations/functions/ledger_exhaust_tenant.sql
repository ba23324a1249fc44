-- ledger_exhaust_tenant marks every open run under tenant account t
-- exhausted, posts their 'exhaust' entries and notifies each. Callers hold
-- t's row lock (so two statements never mark the same runs at once). The
-- runs' sliced task accounts take the state too (ledger_mark_tasks), after
-- every run's row.
CREATE OR REPLACE FUNCTION ledger_exhaust_tenant(t account) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, fanout, pg_temp AS $$
DECLARE
    a    account;
    runs bigint[] := '{}';
BEGIN
    FOR a IN UPDATE account SET state = 'exhausted', cause = 'tenant budget exhausted', updated_at = now()
              WHERE parent_id = t.account_id AND kind = 'run' AND state = 'open'
             RETURNING * LOOP
        INSERT INTO ledger_entry (tenant_id, run_id, account_id, chain, kind, note)
        VALUES (a.tenant_id, a.run_id, a.account_id, ARRAY[a.account_id], 'exhaust',
                format('tenant account %s: available %s < min_reservation %s',
                       t.account_id, ledger_available(t), t.min_reservation));
        PERFORM pg_notify('fanout_run_state', 'exhausted ' || a.run_id);
        runs := runs || a.account_id;
    END LOOP;
    PERFORM ledger_mark_tasks(runs, 'exhausted');
END $$;
REVOKE ALL ON FUNCTION ledger_exhaust_tenant(account) FROM PUBLIC;
