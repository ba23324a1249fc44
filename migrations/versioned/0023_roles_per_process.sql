-- 0023: one database role per kind of process (issue 23). A worker logs in
-- as a member of fanout_worker: it reserves, settles, voids and renews
-- reservations of the tasks it was dispatched (the attempt fence holds it
-- to them), takes semaphore slots and rate buckets, and records tool calls;
-- it cannot open runs, begin attempts, end runs, or touch keys, tenants,
-- budgets or prices. An orchestrator logs in as a member of fanout_app, as
-- before: runs, attempts, events, key lookups — but no admin function any
-- more. AdminService logs in as a member of fanout_admin (the orchestrator's
-- --admin-database-url): keys, tenants, quotas, budgets, prices. Function
-- grants are in migrations/functions; the table grants are here.
--
-- Upgrading: logins IN ROLE fanout_app keep everything an orchestrator or a
-- worker needs, and lose the admin functions. Give workers their own login
-- IN ROLE fanout_worker, and AdminService one IN ROLE fanout_admin
-- (docs/operations.md "Database roles").
DO $$
BEGIN
    CREATE ROLE fanout_worker NOLOGIN;
EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
END $$;
DO $$
BEGIN
    CREATE ROLE fanout_admin NOLOGIN;
EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
END $$;

GRANT USAGE ON SCHEMA fanout TO fanout_worker, fanout_admin;
GRANT USAGE ON SCHEMA public TO fanout_worker, fanout_admin;

-- A worker reads the accounts and reservations it works on (and the
-- sweeper, on every node, the expired ones), its rate buckets and slots,
-- and the tool calls of its tasks; it writes a tool call's outcome. Its
-- health gauge reads the runs' states and heartbeats, not their specs.
GRANT SELECT ON TABLE fanout.account, fanout.reservation, fanout.semaphore_slot, fanout.tool_call TO fanout_worker;
GRANT SELECT, INSERT, UPDATE ON TABLE fanout.rate_bucket TO fanout_worker;
GRANT UPDATE (state, result, error) ON TABLE fanout.tool_call TO fanout_worker;
GRANT SELECT (state, owner_heartbeat) ON TABLE fanout.run TO fanout_worker;

-- AdminService reads tenants, keys, budgets and the admin log, and defines
-- a key's request bucket.
GRANT SELECT ON TABLE fanout.tenant, fanout.api_key, fanout.account, fanout.tenant_period, fanout.admin_action,
    fanout.price TO fanout_admin;
GRANT SELECT, INSERT, UPDATE ON TABLE fanout.rate_bucket TO fanout_admin;

-- The admin log is AdminService's and the auditors' to read, not a node's.
REVOKE SELECT ON TABLE fanout.admin_action FROM fanout_app;

-- Settings only the owner writes. anonymous_admin 'on' lets admin
-- functions act for "anonymous", the actor of an orchestrator run with
-- --auth none: `fanout dev` opts its database in; a production database
-- never is, so no credential-less caller is ever logged as having acted.
CREATE TABLE fanout.setting (
    name   text PRIMARY KEY CHECK (name IN ('anonymous_admin')),
    value  text NOT NULL CHECK (value IN ('on', 'off')),
    set_at timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE fanout.setting IS 'Database settings only the owner writes (anonymous_admin: admin functions accept the actor "anonymous").';
