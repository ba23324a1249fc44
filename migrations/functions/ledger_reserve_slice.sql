-- ledger_reserve_slice grants a call on sliced task account leaf that its
-- slice cannot pay as it is (docs/ledger.md#budget-slices). The caller
-- (ledger_reserve) holds the chain's locks, root first, and has checked
-- the grant (run, tenant, attempt, secret, key) and that every account of
-- the chain is open; run and tenant are the chain's run and tenant
-- accounts as locked (tenant: NULL without one). The slice is topped up by
-- what the call lacks, and by at least the task's slice_size, as far as
-- its cap and the run's pool allow; a pool too small takes back what the
-- other slices of the run do not use (ledger_recall) and tries again, and
-- then, under a tenant, what the slices of the tenant's other runs do not
-- use. The grant is
-- then min(p_want, what the slice has), if that is at least p_min; else
-- nothing is granted and the refusal names the account that could not pay:
-- the task's (its cap), or the run's or the tenant's, which a refusal
-- leaves exhausted when it is below its minimum. A top-up that leaves the
-- pool below the run's minimum exhausts the run, after a recall
-- (ledger_check_pool), as a grant that took it there did before slices.
CREATE OR REPLACE FUNCTION ledger_reserve_slice(leaf account, run account, tenant account, p_want bigint, p_min bigint,
                                     p_holder text, p_ttl interval, p_key text, p_attempt bigint, p_model text)
RETURNS ledger_result
LANGUAGE plpgsql SET search_path = pg_catalog, fanout, pg_temp AS $$
DECLARE
    a     account;
    g     bigint;
    res   ledger_result;
    topup boolean := false;
BEGIN
    IF ledger_available(leaf) < p_want THEN
        topup := ledger_carve(leaf.account_id, greatest(p_want - ledger_available(leaf), leaf.slice_size)) > 0;
        SELECT * INTO leaf FROM account WHERE account_id = leaf.account_id;
        IF ledger_available(leaf) < p_want AND leaf.limit_tokens < leaf.cap_tokens THEN
            IF ledger_recall(run.account_id, leaf.account_id) > 0 THEN
                topup := ledger_carve(leaf.account_id, p_want - ledger_available(leaf)) > 0 OR topup;
                SELECT * INTO leaf FROM account WHERE account_id = leaf.account_id;
            END IF;
        END IF;
        IF ledger_available(leaf) < p_want AND leaf.limit_tokens < leaf.cap_tokens AND tenant.account_id IS NOT NULL THEN
            SELECT * INTO tenant FROM account WHERE account_id = tenant.account_id;
            SELECT * INTO run FROM account WHERE account_id = run.account_id;
        END IF;
        IF ledger_available(leaf) < p_want AND leaf.limit_tokens < leaf.cap_tokens AND tenant.account_id IS NOT NULL
           AND ledger_available(tenant) < least(p_want - ledger_available(leaf), ledger_available(run)) THEN
            -- The tenant is what is short (not the run's own pool): the
            -- other runs' slices give back what they do not use.
            IF ledger_recall(run.account_id, leaf.account_id, true) > 0 THEN
                topup := ledger_carve(leaf.account_id, p_want - ledger_available(leaf)) > 0 OR topup;
                SELECT * INTO leaf FROM account WHERE account_id = leaf.account_id;
            END IF;
        END IF;
    END IF;
    g := least(p_want, ledger_available(leaf));
    IF g < p_min THEN
        -- Who could not pay: the task's cap, else the first account above
        -- it, root first, with less than the call needs.
        a := leaf;
        res.info_available := leaf.cap_tokens - leaf.reserved - leaf.spent;
        IF leaf.cap_tokens - leaf.reserved - leaf.spent >= p_min THEN
            FOR a IN SELECT * FROM account WHERE account_id = ANY (leaf.chain[1:cardinality(leaf.chain) - 1])
                      ORDER BY chain LOOP
                EXIT WHEN ledger_available(a) + ledger_available(leaf) < p_min
                       OR (a.kind = 'tenant' AND ledger_below_minimum(a, 0));
            END LOOP;
            IF a.kind = 'tenant' AND ledger_below_minimum(a, 0) THEN
                PERFORM ledger_exhaust_tenant(a);
            ELSIF a.kind = 'run' THEN
                PERFORM ledger_check_exhausted(leaf.chain);
            END IF;
            res.info_available := ledger_available(a);
        END IF;
        res.outcome := 'exhausted';
        res.info_account := a.account_id;
        res.info_kind := a.kind;
        res.info_state := a.state;
        RETURN res;
    END IF;
    res := ledger_grant_slice(leaf, p_want, g, p_holder, p_ttl, p_key, p_attempt, p_model);
    IF topup THEN
        PERFORM ledger_check_pool(leaf.account_id);
    END IF;
    RETURN res;
END $$;
REVOKE ALL ON FUNCTION ledger_reserve_slice(account,account,account,bigint,bigint,text,interval,text,bigint,text) FROM PUBLIC;
