-- ledger_lock_accounts locks the accounts p_ids FOR UPDATE in the one order
-- every transaction takes account locks in: by chain, which is tree
-- preorder, root first (a tenant before its runs, a run before its tasks;
-- docs/ledger.md#chain-and-lock-order), and returns them in that order. A
-- tenant account whose budget period has ended is rolled over under its
-- lock, before the caller reads it: whichever statement is the first after
-- the end (a reserve, a settle, the sweeper's expiry, a void, a run's end),
-- what it posts counts in the new period, as database time says it should.
-- In a transaction that took a budget slice's row alone (the setting
-- fanout.slice_locked), it does not wait: a row another transaction holds
-- is serialization_failure, to be retried.
CREATE OR REPLACE FUNCTION ledger_lock_accounts(p_ids bigint[]) RETURNS SETOF account
LANGUAGE plpgsql SET search_path = pg_catalog, fanout, pg_temp AS $$
DECLARE
    a account;
BEGIN
    IF current_setting('fanout.slice_locked', true) = 'on' THEN
        -- This transaction holds a slice's row, taken alone out of the
        -- root-first order (docs/ledger.md#budget-slices): it must not wait
        -- for a row above it, which a recall or a mark holding that row
        -- could be waiting to take from it. What another transaction holds
        -- sends this one back, to be retried.
        BEGIN
            PERFORM FROM account WHERE account_id = ANY (p_ids) ORDER BY chain FOR UPDATE NOWAIT;
        EXCEPTION WHEN lock_not_available THEN
            RAISE EXCEPTION 'ledger_lock_accounts: this transaction holds a budget slice''s row and % are locked by another: try again',
                p_ids USING ERRCODE = 'serialization_failure';
        END;
    END IF;
    FOR a IN SELECT * FROM account WHERE account_id = ANY (p_ids) ORDER BY chain FOR UPDATE LOOP
        IF a.kind = 'tenant' THEN
            a := ledger_roll_period(a);
        END IF;
        RETURN NEXT a;
    END LOOP;
END $$;
REVOKE ALL ON FUNCTION ledger_lock_accounts(bigint[]) FROM PUBLIC;
