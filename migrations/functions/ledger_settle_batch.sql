-- ledger_settle_batch makes n settles in one statement: call i is
-- ledger_settle(p_ids[i], p_gens[i], p_actuals[i], p_estimated[i],
-- p_models[i], p_inputs[i], p_outputs[i], p_secrets[i]), and row i of the
-- result is what that call returns. It is how a group commit batch of
-- settles is written, for speed only: it settles nothing ledger_settle
-- would not, and no differently.
--
-- The settles of calls drawn on budget slices (docs/ledger.md#budget-slices)
-- that need nothing but the plain rule (the reservation is held at that
-- generation, granted to that secret, named once in the batch, its usage
-- within its grant and the arguments in range, its task's slice open and
-- in its period) are written together under their task rows' locks alone,
-- taken in chain order: one UPDATE of the reservations, one of the task
-- accounts, one INSERT of the entries. Every other settle is made by
-- ledger_settle itself, in the order given, after them (each touches a
-- reservation none of them does).
CREATE OR REPLACE FUNCTION ledger_settle_batch(p_ids bigint[], p_gens bigint[], p_actuals bigint[], p_estimated boolean[],
                                    p_models text[], p_inputs bigint[], p_outputs bigint[], p_secrets text[])
RETURNS SETOF ledger_result
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, fanout, pg_temp AS $$
DECLARE
    n       int := coalesce(cardinality(p_ids), 0);
    results ledger_result[];
    done    int[] := '{}';
    rec     record;
    i       int;
BEGIN
    IF n = 0 THEN
        RETURN;
    END IF;
    IF coalesce(cardinality(p_gens), -1) <> n OR coalesce(cardinality(p_actuals), -1) <> n
       OR coalesce(cardinality(p_estimated), -1) <> n OR coalesce(cardinality(p_models), -1) <> n
       OR coalesce(cardinality(p_inputs), -1) <> n OR coalesce(cardinality(p_outputs), -1) <> n
       OR coalesce(cardinality(p_secrets), -1) <> n THEN
        RAISE EXCEPTION 'ledger_settle_batch: every argument must have one element per call (% calls)', n
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    results := array_fill(NULL::ledger_result, ARRAY[n]);
    -- The slices the plain settles are on, locked in chain order; the
    -- rest of this transaction takes no row above them but without waiting.
    -- (A batch with none, of calls on accounts that are not slices, locks
    -- as ledger_settle does.)
    IF EXISTS (SELECT FROM reservation v JOIN account a ON a.account_id = v.account_id
                WHERE v.reservation_id = ANY (p_ids) AND v.state = 'held' AND v.chain = ARRAY[v.account_id]
                  AND a.kind = 'task') THEN
        PERFORM set_config('fanout.slice_locked', 'on', true);
        PERFORM FROM account a
          WHERE a.account_id IN (SELECT v.account_id FROM reservation v WHERE v.reservation_id = ANY (p_ids)
                                    AND v.state = 'held' AND v.chain = ARRAY[v.account_id])
            AND a.kind = 'task' AND ledger_slice_fits(a, 0, 0)
          ORDER BY a.chain FOR UPDATE;
    END IF;
    FOR rec IN
        WITH u AS (
            SELECT * FROM unnest(p_ids, p_gens, p_actuals, p_estimated, p_models, p_inputs, p_outputs, p_secrets)
                     WITH ORDINALITY AS u(id, gen, actual, est, model, inp, outp, secret, ord)),
        plain AS (
            SELECT u.*, v.amount, v.account_id FROM u
              JOIN reservation v ON v.reservation_id = u.id
              JOIN account a ON a.account_id = v.account_id
             WHERE v.state = 'held' AND v.generation = u.gen AND v.chain = ARRAY[v.account_id] AND a.kind = 'task'
               AND ledger_slice_fits(a, 0, 0) AND ledger_secret_ok(v.secret_hash, u.secret)
               AND u.actual IS NOT NULL AND u.actual >= 0 AND u.actual <= v.amount AND u.est IS NOT NULL
               AND coalesce(octet_length(u.model), 0) <= 256
               AND coalesce(u.inp, 0) >= 0 AND coalesce(u.outp, 0) >= 0
               AND ((coalesce(u.inp, 0) = 0 AND coalesce(u.outp, 0) = 0)
                    OR (NOT u.est AND coalesce(u.inp, 0) + coalesce(u.outp, 0) = u.actual))
               AND (SELECT count(*) FROM unnest(p_ids) AS x WHERE x = u.id) = 1
             FOR UPDATE OF v),
        settled AS (
            UPDATE reservation v
               SET state = 'settled', actual = p.actual, spent = p.actual, estimated = p.est,
                   model = coalesce(nullif(p.model, ''), v.model),
                   input_tokens = nullif(coalesce(p.inp, 0) + coalesce(p.outp, 0), 0) - coalesce(p.outp, 0),
                   output_tokens = nullif(coalesce(p.inp, 0) + coalesce(p.outp, 0), 0) - coalesce(p.inp, 0),
                   overrun = 0, resolved_at = now()
              FROM plain p
             WHERE v.reservation_id = p.id AND v.state = 'held'
            RETURNING v AS res, p.ord, v.reservation_id, v.tenant_id, v.run_id, v.account_id, v.chain, v.amount,
                      v.spent, v.actual, v.estimated, v.holder, v.model, v.input_tokens, v.output_tokens),
        moved AS (
            UPDATE account a SET reserved = a.reserved - s.amount, spent = a.spent + s.spent, updated_at = now()
              FROM (SELECT account_id, sum(amount) AS amount, sum(spent) AS spent FROM settled GROUP BY account_id) s
             WHERE a.account_id = s.account_id),
        entries AS (
            INSERT INTO ledger_entry (tenant_id, run_id, task_id, account_id, chain, reservation_id, kind,
                                      delta_reserved, delta_spent, delta_held, actual, overrun, estimated, holder,
                                      model, input_tokens, output_tokens, note)
            SELECT s.tenant_id, s.run_id, a.task_id, s.account_id, s.chain, s.reservation_id, 'settle',
                   -s.amount, s.spent, 0, s.actual, 0, s.estimated, s.holder,
                   s.model, s.input_tokens, s.output_tokens, ''
              FROM settled s JOIN account a ON a.account_id = s.account_id
             ORDER BY s.reservation_id)
        SELECT s.res, s.ord FROM settled s
    LOOP
        results[rec.ord] := ledger_result_of('ok', rec.res);
        done := done || rec.ord::int;
    END LOOP;
    FOR i IN 1..n LOOP
        IF i <> ALL (done) THEN
            results[i] := ledger_settle(p_ids[i], p_gens[i], p_actuals[i], p_estimated[i], p_models[i],
                                        p_inputs[i], p_outputs[i], p_secrets[i]);
        END IF;
        RETURN NEXT results[i];
    END LOOP;
END $$;
REVOKE ALL ON FUNCTION ledger_settle_batch(bigint[],bigint[],bigint[],boolean[],text[],bigint[],bigint[],text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION ledger_settle_batch(bigint[],bigint[],bigint[],boolean[],text[],bigint[],bigint[],text[]) TO fanout_app, fanout_worker;
