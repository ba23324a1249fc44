-- Fleet-wide counting semaphores (issue 13): a bound on calls in flight that
-- every node shares, such as an MCP server's or a tool's max_in_flight.
--
-- A key (a server's or a tool's name) has slots 0 .. limit-1, one row each,
-- created the first time a limit asks for them. A slot is held while its
-- expires_at, set from the database's clock, is in the future; anything
-- else is free. So a holder that dies frees its slots when their lease runs
-- out, with no sweeper, and a released slot is one whose expiry was moved to
-- now (or to now + a grace). Nodes change slots only through the functions
-- below (SECURITY DEFINER, pinned search_path); they may read the table.
--
-- semaphore_acquire takes one slot of every key asked for in one statement,
-- or none: each free slot is locked FOR UPDATE SKIP LOCKED, so two
-- acquirers never pick one slot and neither waits for the other, and
-- nothing is written unless every key had one. The limit comes with every
-- acquire (as rate buckets' limits come with Define): slots at or above it
-- are never granted, and while a holder of such a slot (granted under a
-- higher limit) remains, nothing of that key is granted, so once a lowered
-- limit is in force everywhere no grant puts more than it in flight.

SET LOCAL search_path = fanout, pg_catalog;

CREATE TABLE semaphore_slot (
    key         text NOT NULL CHECK (key <> '' AND octet_length(key) <= 256),
    slot        int NOT NULL CHECK (slot >= 0 AND slot < 10000),
    -- lease_id: the lease that holds or last held the slot (the client
    -- makes it up before its first try, so a retried acquire finds its own
    -- grant); NULL when never held or released.
    lease_id    bigint,
    holder      text NOT NULL DEFAULT '',
    acquired_at timestamptz,
    -- Held while expires_at > now(); '-infinity' when free.
    expires_at  timestamptz NOT NULL DEFAULT '-infinity',
    PRIMARY KEY (key, slot)
);
CREATE INDEX semaphore_slot_lease ON semaphore_slot (lease_id) WHERE lease_id IS NOT NULL;

COMMENT ON TABLE semaphore_slot IS
    'Fleet-wide semaphores: slot N of key is held while expires_at > now() (database time).';

-- semaphore_acquire takes one slot of each of p_keys, whose bounds are
-- p_limits, for lease p_lease held by p_holder until now() + p_ttl, all or
-- none. It returns NULL when granted, else the first key (in sort order)
-- that had no free slot. A lease that already holds every one of p_keys (a
-- retry of an acquire whose reply was lost) is renewed and granted again.
CREATE FUNCTION semaphore_acquire(p_lease bigint, p_holder text, p_keys text[], p_limits int[], p_ttl interval)
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

-- semaphore_renew moves the expiry of every slot lease p_lease of p_holder
-- still holds to now() + p_ttl and returns how many it renewed: fewer than
-- the lease's keys means a slot expired (and may have been taken).
CREATE FUNCTION semaphore_renew(p_lease bigint, p_holder text, p_ttl interval) RETURNS int
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, fanout, pg_temp AS $$
DECLARE
    n int;
BEGIN
    IF p_ttl IS NULL OR p_ttl <= interval '0' OR p_ttl > interval '1 hour' THEN
        RAISE EXCEPTION 'semaphore_renew: ttl % out of range (at most 1 hour)', p_ttl
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE semaphore_slot SET expires_at = now() + p_ttl
     WHERE lease_id = p_lease AND holder = p_holder AND expires_at > now();
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;

-- semaphore_release frees the slots of lease p_lease of p_holder: at once
-- with p_grace 0, else at now() + p_grace (the call may still run on the
-- server). It returns how many slots the lease had; a slot another lease
-- took after this one expired is not touched.
CREATE FUNCTION semaphore_release(p_lease bigint, p_holder text, p_grace interval) RETURNS int
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, fanout, pg_temp AS $$
DECLARE
    n int;
BEGIN
    IF p_grace IS NULL OR p_grace < interval '0' OR p_grace > interval '1 hour' THEN
        RAISE EXCEPTION 'semaphore_release: grace % out of range (0 to 1 hour)', p_grace
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_grace = interval '0' THEN
        UPDATE semaphore_slot SET lease_id = NULL, expires_at = '-infinity'
         WHERE lease_id = p_lease AND holder = p_holder;
    ELSE
        UPDATE semaphore_slot SET expires_at = now() + p_grace
         WHERE lease_id = p_lease AND holder = p_holder;
    END IF;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;

REVOKE ALL ON FUNCTION semaphore_acquire(bigint, text, text[], int[], interval),
                       semaphore_renew(bigint, text, interval),
                       semaphore_release(bigint, text, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION semaphore_acquire(bigint, text, text[], int[], interval),
                          semaphore_renew(bigint, text, interval),
                          semaphore_release(bigint, text, interval) TO fanout_app;
GRANT SELECT ON semaphore_slot TO fanout_app;
