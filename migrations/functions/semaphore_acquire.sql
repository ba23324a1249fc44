-- semaphore_acquire takes one slot of each of p_keys, whose bounds are
-- p_limits, for lease p_lease held by p_holder until now() + p_ttl, all or
-- none. It returns NULL when granted, else the first key (in sort order)
-- that had no free slot. A lease that already holds every one of p_keys (a
-- retry of an acquire whose reply was lost) is renewed and granted again.
CREATE OR REPLACE FUNCTION semaphore_acquire(p_lease bigint, p_holder text, p_keys text[], p_limits int[], p_ttl interval)
RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, fanout, pg_temp AS $$
DECLARE
    n     int := coalesce(cardinality(p_keys), 0);
    held  int;
    i     int;
    k     text;
    lim   int;
    s     int;
    taken int[] := array_fill(NULL::int, ARRAY[greatest(n, 1)]);
BEGIN
    IF p_lease IS NULL OR p_holder IS NULL OR p_holder = '' OR octet_length(p_holder) > 256
       OR n = 0 OR n > 16 OR cardinality(p_limits) IS DISTINCT FROM n
       OR p_ttl IS NULL OR p_ttl <= interval '0' OR p_ttl > interval '1 hour'
       OR EXISTS (SELECT FROM unnest(p_keys, p_limits) AS u(k, l)
                   WHERE u.k IS NULL OR u.k = '' OR octet_length(u.k) > 256
                      OR u.l IS NULL OR u.l < 1 OR u.l > 10000)
       OR (SELECT count(DISTINCT u.k) FROM unnest(p_keys) AS u(k)) <> n THEN
        RAISE EXCEPTION 'semaphore_acquire: lease %, holder %, keys %, limits %, ttl % out of range (1 to 16 distinct keys, limits 1 to 10000, ttl at most 1 hour)',
            p_lease, p_holder, p_keys, p_limits, p_ttl
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- A tenant's task slots (max_tasks_in_flight) are the orchestrators':
    -- a worker's login takes its providers' and tools' slots only.
    IF NOT session_is_orchestrator() AND EXISTS (SELECT FROM unnest(p_keys) AS u(k) WHERE u.k LIKE 'tenant-tasks:%') THEN
        RAISE EXCEPTION 'semaphore_acquire: a tenant''s task slots are taken by orchestrators only'
            USING ERRCODE = 'insufficient_privilege';
    END IF;

    -- A retry whose earlier try committed: the lease holds its slots.
    UPDATE semaphore_slot SET expires_at = now() + p_ttl
     WHERE lease_id = p_lease AND holder = p_holder AND expires_at > now();
    GET DIAGNOSTICS held = ROW_COUNT;
    IF held = n THEN
        RETURN NULL;
    ELSIF held > 0 THEN
        -- Part of it lapsed meanwhile: give the rest back and start over.
        UPDATE semaphore_slot SET lease_id = NULL, expires_at = '-infinity' WHERE lease_id = p_lease;
    END IF;

    -- Keys in sort order, so that two acquirers creating slots of the same
    -- keys wait on each other's inserts in one order (no deadlock); the
    -- slot locks never wait (SKIP LOCKED).
    FOR i IN SELECT u.ord FROM unnest(p_keys) WITH ORDINALITY AS u(k, ord) ORDER BY u.k LOOP
        k := p_keys[i];
        lim := p_limits[i];
        IF NOT EXISTS (SELECT FROM semaphore_slot WHERE key = k AND slot = lim - 1) THEN
            INSERT INTO semaphore_slot (key, slot)
            SELECT k, g FROM generate_series(0, lim - 1) AS g
            ON CONFLICT DO NOTHING;
        END IF;
        -- A holder of a slot at or above the limit counts against it.
        IF EXISTS (SELECT FROM semaphore_slot WHERE key = k AND slot >= lim AND expires_at > now()) THEN
            RETURN k;
        END IF;
        SELECT slot INTO s FROM semaphore_slot
         WHERE key = k AND slot < lim AND expires_at <= now()
         ORDER BY slot LIMIT 1
         FOR UPDATE SKIP LOCKED;
        IF NOT FOUND THEN
            RETURN k;
        END IF;
        taken[i] := s;
    END LOOP;

    UPDATE semaphore_slot AS x
       SET lease_id = p_lease, holder = p_holder, acquired_at = now(), expires_at = now() + p_ttl
      FROM unnest(p_keys, taken) AS t(k, s)
     WHERE x.key = t.k AND x.slot = t.s;
    RETURN NULL;
END $$;
REVOKE ALL ON FUNCTION semaphore_acquire(bigint,text,text[],integer[],interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION semaphore_acquire(bigint,text,text[],integer[],interval) TO fanout_app, fanout_worker;
