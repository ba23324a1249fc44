-- The baseline: fanout's tables at schema 21, for a new database.
--
-- The history of migrations 1 to 21 is collapsed into this one file (issue
-- 21). It holds what a versioned migration may hold: schemas, types,
-- tables, columns, constraints, indexes, comments, roles and privileges. It
-- holds no function, view, trigger or policy: each of those has one current
-- definition in migrations/functions/ or migrations/views/, applied after
-- the versioned migrations (store/migrate.go, docs/architecture.md).
--
-- A database migrated by an earlier release to schema 21 already has all of
-- this and never runs it; one older than 21 is refused (docs/operations.md).
-- Never edit this file: add migrations/versioned/NNNN_name.sql instead.

-- Roles are cluster-wide: create them only when missing. fanout_app is what
-- a node needs; fanout_auditor reads the audit views and nothing else;
-- fanout_tenant_auditor's members read their own tenants' rows only.
DO $$
BEGIN
    CREATE ROLE fanout_auditor NOLOGIN;
EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
END $$;
DO $$
BEGIN
    CREATE ROLE fanout_app NOLOGIN;
EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
END $$;
DO $$
BEGIN
    CREATE ROLE fanout_tenant_auditor NOLOGIN;
EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
END $$;

-- Only the owner (the role that runs migrations) creates in schema fanout.
-- PostgreSQL 14 and older let PUBLIC create in public, where a planted
-- overload could be picked by an unqualified call; a no-op (with a warning)
-- when the owner may not revoke it.
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
-- Functions the owner creates are not PUBLIC's to call: each file grants
-- EXECUTE to whom it names.
ALTER DEFAULT PRIVILEGES REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC;

CREATE SCHEMA fanout;

CREATE TYPE fanout.ledger_result AS (
	outcome text,
	info_account bigint,
	info_kind text,
	info_state text,
	info_available bigint,
	info text,
	reservation_id bigint,
	account_id bigint,
	run_id text,
	tenant_id text,
	requested bigint,
	amount bigint,
	holder text,
	generation bigint,
	lease_expires_at timestamp with time zone,
	state text,
	actual bigint,
	spent bigint,
	overrun bigint,
	estimated boolean,
	run_available bigint
);

CREATE TABLE fanout.tenant (
    tenant_id text NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    max_run_tokens bigint,
    max_concurrent_runs integer,
    max_tasks_in_flight integer,
    key_requests_per_minute integer,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT tenant_key_requests_per_minute_check CHECK ((key_requests_per_minute > 0)),
    CONSTRAINT tenant_max_concurrent_runs_check CHECK ((max_concurrent_runs >= 0)),
    CONSTRAINT tenant_max_run_tokens_check CHECK ((max_run_tokens > 0)),
    CONSTRAINT tenant_max_tasks_in_flight_check CHECK (((max_tasks_in_flight > 0) AND (max_tasks_in_flight < 10000))),
    CONSTRAINT tenant_tenant_id_check CHECK (((tenant_id <> ''::text) AND (length(tenant_id) <= 128)))
);

COMMENT ON COLUMN fanout.tenant.max_run_tokens IS 'The largest budget.limit_tokens one run may ask for; NULL: no cap beyond the server''s.';

COMMENT ON COLUMN fanout.tenant.max_concurrent_runs IS 'Runs of the tenant RUNNING at once; counted under the tenant row''s lock. NULL: no cap.';

COMMENT ON COLUMN fanout.tenant.max_tasks_in_flight IS 'Tasks of the tenant dispatched at once across the fleet (a store semaphore). NULL: no cap.';

COMMENT ON COLUMN fanout.tenant.key_requests_per_minute IS 'The request rate of each key of the tenant that sets none of its own. NULL: no cap.';

CREATE TABLE fanout.account (
    account_id bigint NOT NULL,
    tenant_id text NOT NULL,
    parent_id bigint,
    chain bigint[] NOT NULL,
    kind text NOT NULL,
    run_id text,
    task_id text,
    limit_tokens bigint NOT NULL,
    reserved bigint DEFAULT 0 NOT NULL,
    spent bigint DEFAULT 0 NOT NULL,
    min_reservation bigint DEFAULT 1 NOT NULL,
    state text DEFAULT 'open'::text NOT NULL,
    cause text DEFAULT ''::text NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    attempt bigint DEFAULT 0 NOT NULL,
    closing boolean DEFAULT false NOT NULL,
    period_kind text DEFAULT 'none'::text NOT NULL,
    period_every interval,
    period_limit bigint,
    period_base bigint DEFAULT 0 NOT NULL,
    period_end timestamp with time zone,
    CONSTRAINT account_attempt_check CHECK ((attempt >= 0)),
    CONSTRAINT account_kind_check CHECK ((kind = ANY (ARRAY['tenant'::text, 'run'::text, 'task'::text]))),
    CONSTRAINT account_kind_keys CHECK ((((kind = 'tenant'::text) AND (run_id IS NULL) AND (task_id IS NULL)) OR ((kind = 'run'::text) AND (run_id IS NOT NULL) AND (task_id IS NULL)) OR ((kind = 'task'::text) AND (run_id IS NOT NULL) AND (task_id IS NOT NULL)))),
    CONSTRAINT account_limit_tokens_check CHECK ((limit_tokens > 0)),
    CONSTRAINT account_min_reservation_check CHECK ((min_reservation >= 1)),
    CONSTRAINT account_period CHECK ((((kind <> 'tenant'::text) AND (period_kind = 'none'::text) AND (period_limit IS NULL) AND (period_end IS NULL) AND (period_every IS NULL)) OR ((kind = 'tenant'::text) AND (period_limit IS NOT NULL) AND ((period_kind = 'none'::text) = (period_end IS NULL)) AND ((period_kind = 'every'::text) = (period_every IS NOT NULL))))),
    CONSTRAINT account_period_base_check CHECK ((period_base >= 0)),
    CONSTRAINT account_period_every_check CHECK ((period_every >= '00:00:01'::interval)),
    CONSTRAINT account_period_kind_check CHECK ((period_kind = ANY (ARRAY['none'::text, 'day'::text, 'month'::text, 'every'::text]))),
    CONSTRAINT account_period_limit_check CHECK ((period_limit > 0)),
    CONSTRAINT account_state_check CHECK ((state = ANY (ARRAY['open'::text, 'exhausted'::text, 'cancelled'::text, 'closed'::text]))),
    CONSTRAINT account_within_limit CHECK (((reserved >= 0) AND (spent >= 0) AND ((reserved + spent) <= limit_tokens)))
);

COMMENT ON COLUMN fanout.account.period_limit IS 'Tenant accounts: the tokens the tenant may spend per period (period none: in all).';

COMMENT ON COLUMN fanout.account.period_base IS 'Tenant accounts: spent at the current period''s start; limit_tokens = period_base + period_limit, clamped to reserved + spent.';

COMMENT ON COLUMN fanout.account.period_end IS 'Tenant accounts: when the current period ends (database time); NULL for period none.';

CREATE TABLE fanout.reservation (
    reservation_id bigint NOT NULL,
    tenant_id text NOT NULL,
    run_id text,
    account_id bigint NOT NULL,
    chain bigint[] NOT NULL,
    requested bigint NOT NULL,
    amount bigint NOT NULL,
    holder text NOT NULL,
    generation bigint DEFAULT 1 NOT NULL,
    lease_expires_at timestamp with time zone NOT NULL,
    state text DEFAULT 'held'::text NOT NULL,
    actual bigint,
    spent bigint DEFAULT 0 NOT NULL,
    overrun bigint DEFAULT 0 NOT NULL,
    estimated boolean DEFAULT false NOT NULL,
    reserve_key text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    resolved_at timestamp with time zone,
    attempt bigint DEFAULT 0 NOT NULL,
    model text,
    input_tokens bigint,
    output_tokens bigint,
    CONSTRAINT reservation_actual_check CHECK ((actual >= 0)),
    CONSTRAINT reservation_check CHECK (((amount > 0) AND (amount <= requested))),
    CONSTRAINT reservation_input_tokens_check CHECK ((input_tokens >= 0)),
    CONSTRAINT reservation_model_check CHECK ((octet_length(model) <= 256)),
    CONSTRAINT reservation_output_tokens_check CHECK ((output_tokens >= 0)),
    CONSTRAINT reservation_overrun_check CHECK ((overrun >= 0)),
    CONSTRAINT reservation_requested_check CHECK ((requested > 0)),
    CONSTRAINT reservation_resolved CHECK (((state = 'held'::text) = (resolved_at IS NULL))),
    CONSTRAINT reservation_spent_check CHECK ((spent >= 0)),
    CONSTRAINT reservation_state_check CHECK ((state = ANY (ARRAY['held'::text, 'settled'::text, 'voided'::text, 'expired'::text])))
);

CREATE TABLE fanout.price (
    model text NOT NULL,
    effective_from timestamp with time zone NOT NULL,
    input_per_million numeric NOT NULL,
    output_per_million numeric NOT NULL,
    currency text DEFAULT 'USD'::text NOT NULL,
    set_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT price_currency_check CHECK ((currency ~ '^[A-Z]{3}$'::text)),
    CONSTRAINT price_input_per_million_check CHECK ((input_per_million >= (0)::numeric)),
    CONSTRAINT price_model_check CHECK (((model <> ''::text) AND (octet_length(model) <= 256))),
    CONSTRAINT price_output_per_million_check CHECK ((output_per_million >= (0)::numeric))
);

COMMENT ON TABLE fanout.price IS 'Price per million tokens of a model from effective_from on, until the next row of the model. Written by price_set only.';

ALTER TABLE fanout.account ALTER COLUMN account_id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME fanout.account_account_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE fanout.admin_action (
    action_id bigint NOT NULL,
    at timestamp with time zone DEFAULT now() NOT NULL,
    actor text NOT NULL,
    action text NOT NULL,
    tenant_id text,
    detail jsonb DEFAULT '{}'::jsonb NOT NULL,
    CONSTRAINT admin_action_action_check CHECK ((action ~ '^[a-z_]+\.[a-z_]+$'::text)),
    CONSTRAINT admin_action_actor_check CHECK ((actor <> ''::text))
);

ALTER TABLE fanout.admin_action ALTER COLUMN action_id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME fanout.admin_action_action_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE fanout.api_key (
    key_id text NOT NULL,
    tenant_id text,
    name text DEFAULT ''::text NOT NULL,
    scopes text[] NOT NULL,
    secret_sha256 bytea NOT NULL,
    requests_per_minute integer,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    created_by text NOT NULL,
    expires_at timestamp with time zone,
    revoked_at timestamp with time zone,
    revoked_by text,
    CONSTRAINT api_key_admin CHECK (((tenant_id IS NULL) = (scopes = ARRAY['admin'::text]))),
    CONSTRAINT api_key_key_id_check CHECK ((key_id ~ '^fk_[0-9a-f]{16}$'::text)),
    CONSTRAINT api_key_name_check CHECK ((octet_length(name) <= 128)),
    CONSTRAINT api_key_requests_per_minute_check CHECK ((requests_per_minute > 0)),
    CONSTRAINT api_key_revoked CHECK (((revoked_at IS NULL) = (revoked_by IS NULL))),
    CONSTRAINT api_key_scopes_check CHECK (((scopes <@ ARRAY['run'::text, 'read'::text, 'cancel'::text, 'audit'::text, 'admin'::text]) AND (cardinality(scopes) > 0))),
    CONSTRAINT api_key_secret_sha256_check CHECK ((octet_length(secret_sha256) = 32))
);

COMMENT ON TABLE fanout.api_key IS 'API keys fanout issued: the secret is kept only as its SHA-256. tenant_id NULL: an admin key.';

CREATE TABLE fanout.ledger_entry (
    entry_id bigint NOT NULL,
    tenant_id text NOT NULL,
    run_id text,
    task_id text,
    account_id bigint NOT NULL,
    chain bigint[] NOT NULL,
    reservation_id bigint,
    kind text NOT NULL,
    delta_limit bigint DEFAULT 0 NOT NULL,
    delta_reserved bigint DEFAULT 0 NOT NULL,
    delta_spent bigint DEFAULT 0 NOT NULL,
    actual bigint,
    overrun bigint DEFAULT 0 NOT NULL,
    estimated boolean DEFAULT false NOT NULL,
    holder text,
    note text DEFAULT ''::text NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    model text,
    input_tokens bigint,
    output_tokens bigint,
    CONSTRAINT ledger_entry_input_tokens_check CHECK ((input_tokens >= 0)),
    CONSTRAINT ledger_entry_kind_check CHECK ((kind = ANY (ARRAY['open'::text, 'reserve'::text, 'settle'::text, 'void'::text, 'expire'::text, 'exhaust'::text, 'cancel'::text, 'close'::text, 'period'::text, 'adjust'::text]))),
    CONSTRAINT ledger_entry_output_tokens_check CHECK ((output_tokens >= 0))
);

CREATE TABLE fanout.audit_role (
    role_name text NOT NULL,
    tenant_id text NOT NULL,
    granted_at timestamp with time zone DEFAULT now() NOT NULL,
    granted_by text NOT NULL,
    CONSTRAINT audit_role_granted_by_check CHECK ((granted_by <> ''::text)),
    CONSTRAINT audit_role_role_name_check CHECK ((role_name ~ '^[a-z_][a-z0-9_]{0,62}$'::text))
);

COMMENT ON TABLE fanout.audit_role IS 'Per-tenant auditors: role_name (a member of fanout_tenant_auditor) reads the rows of tenant_id.';

ALTER TABLE fanout.ledger_entry ALTER COLUMN entry_id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME fanout.ledger_entry_entry_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE fanout.rate_bucket (
    bucket text NOT NULL,
    rpm bigint NOT NULL,
    tpm bigint NOT NULL,
    burst interval NOT NULL,
    requests double precision DEFAULT 0 NOT NULL,
    tokens double precision DEFAULT 0 NOT NULL,
    refilled_at timestamp with time zone DEFAULT now() NOT NULL,
    taken bigint DEFAULT 0 NOT NULL,
    CONSTRAINT rate_bucket_bucket_check CHECK (((bucket <> ''::text) AND (octet_length(bucket) <= 128))),
    CONSTRAINT rate_bucket_burst_check CHECK ((burst > '00:00:00'::interval)),
    CONSTRAINT rate_bucket_rpm_check CHECK ((rpm >= 0)),
    CONSTRAINT rate_bucket_taken_check CHECK ((taken >= 0)),
    CONSTRAINT rate_bucket_tpm_check CHECK ((tpm >= 0))
);

ALTER TABLE fanout.reservation ALTER COLUMN reservation_id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME fanout.reservation_reservation_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE fanout.run (
    run_id text NOT NULL,
    tenant_id text NOT NULL,
    idempotency_key text NOT NULL,
    state text DEFAULT 'RUNNING'::text NOT NULL,
    cancel_cause text DEFAULT ''::text NOT NULL,
    labels jsonb DEFAULT '{}'::jsonb NOT NULL,
    owner text DEFAULT ''::text NOT NULL,
    last_sequence bigint DEFAULT 0 NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    finished_at timestamp with time zone,
    owner_heartbeat timestamp with time zone DEFAULT now() NOT NULL,
    spec jsonb NOT NULL,
    result jsonb,
    adoptions integer DEFAULT 0 NOT NULL,
    CONSTRAINT run_adoptions_check CHECK ((adoptions >= 0)),
    CONSTRAINT run_finished CHECK (((state = 'RUNNING'::text) = (finished_at IS NULL))),
    CONSTRAINT run_idempotency_key_check CHECK (((idempotency_key <> ''::text) AND (octet_length(idempotency_key) <= 128))),
    CONSTRAINT run_last_sequence_check CHECK ((last_sequence >= 0)),
    CONSTRAINT run_result_object CHECK ((jsonb_typeof(result) = 'object'::text)),
    CONSTRAINT run_run_id_check CHECK ((run_id <> ''::text)),
    CONSTRAINT run_spec_object CHECK ((jsonb_typeof(spec) = 'object'::text)),
    CONSTRAINT run_state_check CHECK ((state = ANY (ARRAY['RUNNING'::text, 'SUCCEEDED'::text, 'FAILED'::text, 'CANCELLED'::text, 'BUDGET_EXHAUSTED'::text, 'TIMED_OUT'::text]))),
    CONSTRAINT run_tenant_id_check CHECK (((tenant_id <> ''::text) AND (length(tenant_id) <= 128)))
);

COMMENT ON COLUMN fanout.run.spec IS 'The RunSpec as submitted, as protojson with the proto field names: spec->>''goal''.';

COMMENT ON COLUMN fanout.run.result IS 'The JoinedResult as protojson; NULL while the run is RUNNING, or if it ended without one.';

CREATE TABLE fanout.run_event (
    run_id text NOT NULL,
    sequence bigint NOT NULL,
    tenant_id text NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    event jsonb NOT NULL,
    event_key uuid,
    CONSTRAINT run_event_event_object CHECK ((jsonb_typeof(event) = 'object'::text)),
    CONSTRAINT run_event_sequence_check CHECK ((sequence >= 1))
);

COMMENT ON COLUMN fanout.run_event.event IS 'The RunEvent as protojson, without run_id, sequence and time (the columns hold them).';

COMMENT ON COLUMN fanout.run_event.event_key IS 'key of the append that wrote the event (NULL for RunFinished and older rows): a retried append finds its events by it';

CREATE TABLE fanout.semaphore_slot (
    key text NOT NULL,
    slot integer NOT NULL,
    lease_id bigint,
    holder text DEFAULT ''::text NOT NULL,
    acquired_at timestamp with time zone,
    expires_at timestamp with time zone DEFAULT '-infinity'::timestamp with time zone NOT NULL,
    CONSTRAINT semaphore_slot_key_check CHECK (((key <> ''::text) AND (octet_length(key) <= 256))),
    CONSTRAINT semaphore_slot_slot_check CHECK (((slot >= 0) AND (slot < 10000)))
);

COMMENT ON TABLE fanout.semaphore_slot IS 'Fleet-wide semaphores: slot N of key is held while expires_at > now() (database time).';

CREATE TABLE fanout.task (
    run_id text NOT NULL,
    task_id text NOT NULL,
    tenant_id text NOT NULL,
    dispatch_index integer NOT NULL,
    status text DEFAULT 'PENDING'::text NOT NULL,
    tokens_spent bigint DEFAULT 0 NOT NULL,
    worker text DEFAULT ''::text NOT NULL,
    started_at timestamp with time zone,
    finished_at timestamp with time zone,
    outcome jsonb,
    outcome_error text GENERATED ALWAYS AS (((outcome -> 'summary'::text) ->> 'error'::text)) STORED,
    CONSTRAINT task_dispatch_index_check CHECK ((dispatch_index >= 0)),
    CONSTRAINT task_outcome_object CHECK ((jsonb_typeof(outcome) = 'object'::text)),
    CONSTRAINT task_status_check CHECK ((status = ANY (ARRAY['PENDING'::text, 'RUNNING'::text, 'SUCCEEDED'::text, 'FAILED'::text, 'TIMED_OUT'::text, 'CANCELLED'::text, 'BUDGET_EXHAUSTED'::text, 'ITERATION_LIMIT'::text, 'SKIPPED'::text]))),
    CONSTRAINT task_task_id_check CHECK (((task_id <> ''::text) AND (octet_length(task_id) <= 64))),
    CONSTRAINT task_tokens_spent_check CHECK ((tokens_spent >= 0))
);

COMMENT ON COLUMN fanout.task.outcome IS 'The TaskOutcome as protojson once the task has ended; started_at and finished_at are columns only.';

COMMENT ON COLUMN fanout.task.outcome_error IS 'outcome->''summary''->>''error'', kept so that task_outcome need not read outcome.';

CREATE TABLE fanout.tenant_period (
    account_id bigint NOT NULL,
    tenant_id text NOT NULL,
    period_kind text NOT NULL,
    period_start timestamp with time zone NOT NULL,
    period_end timestamp with time zone,
    first_entry_id bigint NOT NULL
);

CREATE TABLE fanout.tool_call (
    key text NOT NULL,
    tenant_id text NOT NULL,
    run_id text NOT NULL,
    task_id text NOT NULL,
    attempt bigint NOT NULL,
    iteration integer NOT NULL,
    call_index integer NOT NULL,
    server text DEFAULT ''::text NOT NULL,
    tool text NOT NULL,
    args_digest text NOT NULL,
    state text DEFAULT 'issued'::text NOT NULL,
    result text DEFAULT ''::text NOT NULL,
    error text DEFAULT ''::text NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    resolved_at timestamp with time zone,
    result_bytes integer GENERATED ALWAYS AS (octet_length(result)) STORED,
    CONSTRAINT tool_call_args_digest_check CHECK ((args_digest ~ '^[0-9a-f]{64}$'::text)),
    CONSTRAINT tool_call_attempt_check CHECK ((attempt >= 1)),
    CONSTRAINT tool_call_call_index_check CHECK ((call_index >= 0)),
    CONSTRAINT tool_call_iteration_check CHECK ((iteration >= 0)),
    CONSTRAINT tool_call_key_check CHECK (((key <> ''::text) AND (octet_length(key) <= 256))),
    CONSTRAINT tool_call_resolved CHECK (((state = 'issued'::text) = (resolved_at IS NULL))),
    CONSTRAINT tool_call_run_id_check CHECK ((run_id <> ''::text)),
    CONSTRAINT tool_call_server_check CHECK ((octet_length(server) <= 256)),
    CONSTRAINT tool_call_state_check CHECK ((state = ANY (ARRAY['issued'::text, 'done'::text, 'failed'::text, 'unknown'::text]))),
    CONSTRAINT tool_call_task_id_check CHECK (((task_id <> ''::text) AND (octet_length(task_id) <= 64))),
    CONSTRAINT tool_call_tenant_id_check CHECK (((tenant_id <> ''::text) AND (octet_length(tenant_id) <= 128))),
    CONSTRAINT tool_call_tool_check CHECK (((tool <> ''::text) AND (octet_length(tool) <= 256)))
);

COMMENT ON TABLE fanout.tool_call IS 'Tool calls with effect write, recorded issued before they are sent and resolved once (done, failed, unknown).';

COMMENT ON COLUMN fanout.tool_call.key IS 'The idempotency key sent in the call''s _meta.';

COMMENT ON COLUMN fanout.tool_call.args_digest IS 'Hex SHA-256 of the call''s JSON arguments as the model sent them.';

COMMENT ON COLUMN fanout.tool_call.result IS 'A resolved write''s result as the model was shown it.';

COMMENT ON COLUMN fanout.tool_call.result_bytes IS 'octet_length(result), kept so that tool_calls need not read result.';

ALTER TABLE ONLY fanout.account
    ADD CONSTRAINT account_pkey PRIMARY KEY (account_id);

ALTER TABLE ONLY fanout.admin_action
    ADD CONSTRAINT admin_action_pkey PRIMARY KEY (action_id);

ALTER TABLE ONLY fanout.api_key
    ADD CONSTRAINT api_key_pkey PRIMARY KEY (key_id);

ALTER TABLE ONLY fanout.audit_role
    ADD CONSTRAINT audit_role_pkey PRIMARY KEY (role_name, tenant_id);

ALTER TABLE ONLY fanout.ledger_entry
    ADD CONSTRAINT ledger_entry_pkey PRIMARY KEY (entry_id);

ALTER TABLE ONLY fanout.price
    ADD CONSTRAINT price_pkey PRIMARY KEY (model, effective_from);

ALTER TABLE ONLY fanout.rate_bucket
    ADD CONSTRAINT rate_bucket_pkey PRIMARY KEY (bucket);

ALTER TABLE ONLY fanout.reservation
    ADD CONSTRAINT reservation_account_id_reserve_key_key UNIQUE (account_id, reserve_key);

ALTER TABLE ONLY fanout.reservation
    ADD CONSTRAINT reservation_pkey PRIMARY KEY (reservation_id);

ALTER TABLE ONLY fanout.run_event
    ADD CONSTRAINT run_event_pkey PRIMARY KEY (run_id, sequence);

ALTER TABLE ONLY fanout.run
    ADD CONSTRAINT run_idempotency_key UNIQUE (tenant_id, idempotency_key);

ALTER TABLE ONLY fanout.run
    ADD CONSTRAINT run_pkey PRIMARY KEY (run_id);

ALTER TABLE ONLY fanout.semaphore_slot
    ADD CONSTRAINT semaphore_slot_pkey PRIMARY KEY (key, slot);

ALTER TABLE ONLY fanout.task
    ADD CONSTRAINT task_dispatch_index UNIQUE (run_id, dispatch_index);

ALTER TABLE ONLY fanout.task
    ADD CONSTRAINT task_pkey PRIMARY KEY (run_id, task_id);

ALTER TABLE ONLY fanout.tenant_period
    ADD CONSTRAINT tenant_period_pkey PRIMARY KEY (account_id, first_entry_id);

ALTER TABLE ONLY fanout.tenant
    ADD CONSTRAINT tenant_pkey PRIMARY KEY (tenant_id);

ALTER TABLE ONLY fanout.tool_call
    ADD CONSTRAINT tool_call_pkey PRIMARY KEY (key);

CREATE INDEX account_parent_open_run ON fanout.account USING btree (parent_id) WHERE ((kind = 'run'::text) AND (state = 'open'::text));

CREATE UNIQUE INDEX account_run_key ON fanout.account USING btree (run_id) WHERE (kind = 'run'::text);

CREATE UNIQUE INDEX account_task_key ON fanout.account USING btree (run_id, task_id) WHERE (kind = 'task'::text);

CREATE UNIQUE INDEX account_tenant_key ON fanout.account USING btree (tenant_id) WHERE (kind = 'tenant'::text);

CREATE INDEX admin_action_tenant ON fanout.admin_action USING btree (tenant_id, at);

CREATE INDEX api_key_tenant ON fanout.api_key USING btree (tenant_id, created_at);

CREATE INDEX ledger_entry_run ON fanout.ledger_entry USING btree (run_id);

CREATE INDEX ledger_entry_tenant_time ON fanout.ledger_entry USING btree (tenant_id, created_at);

CREATE INDEX reservation_held_lease ON fanout.reservation USING btree (lease_expires_at) WHERE (state = 'held'::text);

CREATE INDEX reservation_run ON fanout.reservation USING btree (run_id, state);

CREATE UNIQUE INDEX run_event_key ON fanout.run_event USING btree (run_id, event_key);

CREATE INDEX run_running_heartbeat ON fanout.run USING btree (owner_heartbeat) WHERE (state = 'RUNNING'::text);

CREATE INDEX run_tenant_newest ON fanout.run USING btree (tenant_id, created_at DESC, run_id DESC);

CREATE INDEX semaphore_slot_lease ON fanout.semaphore_slot USING btree (lease_id) WHERE (lease_id IS NOT NULL);

CREATE INDEX tool_call_task ON fanout.tool_call USING btree (tenant_id, run_id, task_id, created_at);

ALTER TABLE ONLY fanout.account
    ADD CONSTRAINT account_parent_id_fkey FOREIGN KEY (parent_id) REFERENCES fanout.account(account_id);

ALTER TABLE ONLY fanout.account
    ADD CONSTRAINT account_tenant_id_fkey FOREIGN KEY (tenant_id) REFERENCES fanout.tenant(tenant_id);

ALTER TABLE ONLY fanout.api_key
    ADD CONSTRAINT api_key_tenant_id_fkey FOREIGN KEY (tenant_id) REFERENCES fanout.tenant(tenant_id);

ALTER TABLE ONLY fanout.audit_role
    ADD CONSTRAINT audit_role_tenant_id_fkey FOREIGN KEY (tenant_id) REFERENCES fanout.tenant(tenant_id);

ALTER TABLE ONLY fanout.reservation
    ADD CONSTRAINT reservation_account_id_fkey FOREIGN KEY (account_id) REFERENCES fanout.account(account_id);

ALTER TABLE ONLY fanout.reservation
    ADD CONSTRAINT reservation_tenant_id_fkey FOREIGN KEY (tenant_id) REFERENCES fanout.tenant(tenant_id);

ALTER TABLE ONLY fanout.run_event
    ADD CONSTRAINT run_event_run_id_fkey FOREIGN KEY (run_id) REFERENCES fanout.run(run_id) ON DELETE CASCADE;

ALTER TABLE ONLY fanout.task
    ADD CONSTRAINT task_run_id_fkey FOREIGN KEY (run_id) REFERENCES fanout.run(run_id) ON DELETE CASCADE;

ALTER TABLE ONLY fanout.tenant_period
    ADD CONSTRAINT tenant_period_account_id_fkey FOREIGN KEY (account_id) REFERENCES fanout.account(account_id);

GRANT USAGE ON SCHEMA fanout TO fanout_app;
GRANT USAGE ON SCHEMA fanout TO fanout_auditor;
GRANT USAGE ON SCHEMA fanout TO fanout_tenant_auditor;

GRANT USAGE ON SCHEMA public TO fanout_auditor;
GRANT USAGE ON SCHEMA public TO fanout_app;

GRANT SELECT ON TABLE fanout.tenant TO fanout_app;

GRANT SELECT ON TABLE fanout.account TO fanout_app;

GRANT SELECT(account_id) ON TABLE fanout.account TO fanout_auditor;
GRANT SELECT(account_id) ON TABLE fanout.account TO fanout_tenant_auditor;

GRANT SELECT(tenant_id) ON TABLE fanout.account TO fanout_auditor;
GRANT SELECT(tenant_id) ON TABLE fanout.account TO fanout_tenant_auditor;

GRANT SELECT(kind) ON TABLE fanout.account TO fanout_auditor;
GRANT SELECT(kind) ON TABLE fanout.account TO fanout_tenant_auditor;

GRANT SELECT(run_id) ON TABLE fanout.account TO fanout_auditor;
GRANT SELECT(run_id) ON TABLE fanout.account TO fanout_tenant_auditor;

GRANT SELECT(task_id) ON TABLE fanout.account TO fanout_auditor;
GRANT SELECT(task_id) ON TABLE fanout.account TO fanout_tenant_auditor;

GRANT SELECT(limit_tokens) ON TABLE fanout.account TO fanout_auditor;
GRANT SELECT(limit_tokens) ON TABLE fanout.account TO fanout_tenant_auditor;

GRANT SELECT(reserved) ON TABLE fanout.account TO fanout_auditor;
GRANT SELECT(reserved) ON TABLE fanout.account TO fanout_tenant_auditor;

GRANT SELECT(spent) ON TABLE fanout.account TO fanout_auditor;
GRANT SELECT(spent) ON TABLE fanout.account TO fanout_tenant_auditor;

GRANT SELECT(min_reservation) ON TABLE fanout.account TO fanout_auditor;
GRANT SELECT(min_reservation) ON TABLE fanout.account TO fanout_tenant_auditor;

GRANT SELECT(state) ON TABLE fanout.account TO fanout_auditor;
GRANT SELECT(state) ON TABLE fanout.account TO fanout_tenant_auditor;

GRANT SELECT(cause) ON TABLE fanout.account TO fanout_auditor;
GRANT SELECT(cause) ON TABLE fanout.account TO fanout_tenant_auditor;

GRANT SELECT(created_at) ON TABLE fanout.account TO fanout_auditor;
GRANT SELECT(created_at) ON TABLE fanout.account TO fanout_tenant_auditor;

GRANT SELECT(updated_at) ON TABLE fanout.account TO fanout_auditor;
GRANT SELECT(updated_at) ON TABLE fanout.account TO fanout_tenant_auditor;

GRANT SELECT(period_kind) ON TABLE fanout.account TO fanout_auditor;
GRANT SELECT(period_kind) ON TABLE fanout.account TO fanout_tenant_auditor;

GRANT SELECT(period_every) ON TABLE fanout.account TO fanout_auditor;
GRANT SELECT(period_every) ON TABLE fanout.account TO fanout_tenant_auditor;

GRANT SELECT(period_limit) ON TABLE fanout.account TO fanout_auditor;
GRANT SELECT(period_limit) ON TABLE fanout.account TO fanout_tenant_auditor;

GRANT SELECT(period_base) ON TABLE fanout.account TO fanout_auditor;
GRANT SELECT(period_base) ON TABLE fanout.account TO fanout_tenant_auditor;

GRANT SELECT(period_end) ON TABLE fanout.account TO fanout_auditor;
GRANT SELECT(period_end) ON TABLE fanout.account TO fanout_tenant_auditor;

GRANT SELECT ON TABLE fanout.reservation TO fanout_app;

GRANT SELECT(reservation_id) ON TABLE fanout.reservation TO fanout_auditor;
GRANT SELECT(reservation_id) ON TABLE fanout.reservation TO fanout_tenant_auditor;

GRANT SELECT(tenant_id) ON TABLE fanout.reservation TO fanout_auditor;
GRANT SELECT(tenant_id) ON TABLE fanout.reservation TO fanout_tenant_auditor;

GRANT SELECT(run_id) ON TABLE fanout.reservation TO fanout_auditor;
GRANT SELECT(run_id) ON TABLE fanout.reservation TO fanout_tenant_auditor;

GRANT SELECT(account_id) ON TABLE fanout.reservation TO fanout_auditor;
GRANT SELECT(account_id) ON TABLE fanout.reservation TO fanout_tenant_auditor;

GRANT SELECT(chain) ON TABLE fanout.reservation TO fanout_auditor;
GRANT SELECT(chain) ON TABLE fanout.reservation TO fanout_tenant_auditor;

GRANT SELECT(amount) ON TABLE fanout.reservation TO fanout_auditor;
GRANT SELECT(amount) ON TABLE fanout.reservation TO fanout_tenant_auditor;

GRANT SELECT(holder) ON TABLE fanout.reservation TO fanout_auditor;
GRANT SELECT(holder) ON TABLE fanout.reservation TO fanout_tenant_auditor;

GRANT SELECT(generation) ON TABLE fanout.reservation TO fanout_auditor;
GRANT SELECT(generation) ON TABLE fanout.reservation TO fanout_tenant_auditor;

GRANT SELECT(lease_expires_at) ON TABLE fanout.reservation TO fanout_auditor;
GRANT SELECT(lease_expires_at) ON TABLE fanout.reservation TO fanout_tenant_auditor;

GRANT SELECT(state) ON TABLE fanout.reservation TO fanout_auditor;
GRANT SELECT(state) ON TABLE fanout.reservation TO fanout_tenant_auditor;

GRANT SELECT(spent) ON TABLE fanout.reservation TO fanout_auditor;
GRANT SELECT(spent) ON TABLE fanout.reservation TO fanout_tenant_auditor;

GRANT SELECT(overrun) ON TABLE fanout.reservation TO fanout_auditor;
GRANT SELECT(overrun) ON TABLE fanout.reservation TO fanout_tenant_auditor;

GRANT SELECT(estimated) ON TABLE fanout.reservation TO fanout_auditor;
GRANT SELECT(estimated) ON TABLE fanout.reservation TO fanout_tenant_auditor;

GRANT SELECT(created_at) ON TABLE fanout.reservation TO fanout_auditor;
GRANT SELECT(created_at) ON TABLE fanout.reservation TO fanout_tenant_auditor;

GRANT SELECT ON TABLE fanout.price TO fanout_auditor;
GRANT SELECT ON TABLE fanout.price TO fanout_app;

GRANT SELECT(model) ON TABLE fanout.price TO fanout_auditor;
GRANT SELECT(model) ON TABLE fanout.price TO fanout_tenant_auditor;

GRANT SELECT(effective_from) ON TABLE fanout.price TO fanout_auditor;
GRANT SELECT(effective_from) ON TABLE fanout.price TO fanout_tenant_auditor;

GRANT SELECT(input_per_million) ON TABLE fanout.price TO fanout_auditor;
GRANT SELECT(input_per_million) ON TABLE fanout.price TO fanout_tenant_auditor;

GRANT SELECT(output_per_million) ON TABLE fanout.price TO fanout_auditor;
GRANT SELECT(output_per_million) ON TABLE fanout.price TO fanout_tenant_auditor;

GRANT SELECT(currency) ON TABLE fanout.price TO fanout_auditor;
GRANT SELECT(currency) ON TABLE fanout.price TO fanout_tenant_auditor;

GRANT SELECT(set_at) ON TABLE fanout.price TO fanout_auditor;
GRANT SELECT(set_at) ON TABLE fanout.price TO fanout_tenant_auditor;

GRANT SELECT ON TABLE fanout.admin_action TO fanout_app;

GRANT SELECT(action_id) ON TABLE fanout.admin_action TO fanout_auditor;
GRANT SELECT(action_id) ON TABLE fanout.admin_action TO fanout_tenant_auditor;

GRANT SELECT(at) ON TABLE fanout.admin_action TO fanout_auditor;
GRANT SELECT(at) ON TABLE fanout.admin_action TO fanout_tenant_auditor;

GRANT SELECT(actor) ON TABLE fanout.admin_action TO fanout_auditor;
GRANT SELECT(actor) ON TABLE fanout.admin_action TO fanout_tenant_auditor;

GRANT SELECT(action) ON TABLE fanout.admin_action TO fanout_auditor;
GRANT SELECT(action) ON TABLE fanout.admin_action TO fanout_tenant_auditor;

GRANT SELECT(tenant_id) ON TABLE fanout.admin_action TO fanout_auditor;
GRANT SELECT(tenant_id) ON TABLE fanout.admin_action TO fanout_tenant_auditor;

GRANT SELECT(detail) ON TABLE fanout.admin_action TO fanout_auditor;
GRANT SELECT(detail) ON TABLE fanout.admin_action TO fanout_tenant_auditor;

GRANT SELECT ON TABLE fanout.api_key TO fanout_app;

GRANT SELECT ON TABLE fanout.ledger_entry TO fanout_app;

GRANT SELECT(entry_id) ON TABLE fanout.ledger_entry TO fanout_auditor;
GRANT SELECT(entry_id) ON TABLE fanout.ledger_entry TO fanout_tenant_auditor;

GRANT SELECT(tenant_id) ON TABLE fanout.ledger_entry TO fanout_auditor;
GRANT SELECT(tenant_id) ON TABLE fanout.ledger_entry TO fanout_tenant_auditor;

GRANT SELECT(run_id) ON TABLE fanout.ledger_entry TO fanout_auditor;
GRANT SELECT(run_id) ON TABLE fanout.ledger_entry TO fanout_tenant_auditor;

GRANT SELECT(task_id) ON TABLE fanout.ledger_entry TO fanout_auditor;
GRANT SELECT(task_id) ON TABLE fanout.ledger_entry TO fanout_tenant_auditor;

GRANT SELECT(account_id) ON TABLE fanout.ledger_entry TO fanout_auditor;
GRANT SELECT(account_id) ON TABLE fanout.ledger_entry TO fanout_tenant_auditor;

GRANT SELECT(chain) ON TABLE fanout.ledger_entry TO fanout_auditor;
GRANT SELECT(chain) ON TABLE fanout.ledger_entry TO fanout_tenant_auditor;

GRANT SELECT(reservation_id) ON TABLE fanout.ledger_entry TO fanout_auditor;
GRANT SELECT(reservation_id) ON TABLE fanout.ledger_entry TO fanout_tenant_auditor;

GRANT SELECT(kind) ON TABLE fanout.ledger_entry TO fanout_auditor;
GRANT SELECT(kind) ON TABLE fanout.ledger_entry TO fanout_tenant_auditor;

GRANT SELECT(delta_limit) ON TABLE fanout.ledger_entry TO fanout_auditor;
GRANT SELECT(delta_limit) ON TABLE fanout.ledger_entry TO fanout_tenant_auditor;

GRANT SELECT(delta_reserved) ON TABLE fanout.ledger_entry TO fanout_auditor;
GRANT SELECT(delta_reserved) ON TABLE fanout.ledger_entry TO fanout_tenant_auditor;

GRANT SELECT(delta_spent) ON TABLE fanout.ledger_entry TO fanout_auditor;
GRANT SELECT(delta_spent) ON TABLE fanout.ledger_entry TO fanout_tenant_auditor;

GRANT SELECT(actual) ON TABLE fanout.ledger_entry TO fanout_auditor;
GRANT SELECT(actual) ON TABLE fanout.ledger_entry TO fanout_tenant_auditor;

GRANT SELECT(overrun) ON TABLE fanout.ledger_entry TO fanout_auditor;
GRANT SELECT(overrun) ON TABLE fanout.ledger_entry TO fanout_tenant_auditor;

GRANT SELECT(estimated) ON TABLE fanout.ledger_entry TO fanout_auditor;
GRANT SELECT(estimated) ON TABLE fanout.ledger_entry TO fanout_tenant_auditor;

GRANT SELECT(holder) ON TABLE fanout.ledger_entry TO fanout_auditor;
GRANT SELECT(holder) ON TABLE fanout.ledger_entry TO fanout_tenant_auditor;

GRANT SELECT(note) ON TABLE fanout.ledger_entry TO fanout_auditor;
GRANT SELECT(note) ON TABLE fanout.ledger_entry TO fanout_tenant_auditor;

GRANT SELECT(created_at) ON TABLE fanout.ledger_entry TO fanout_auditor;
GRANT SELECT(created_at) ON TABLE fanout.ledger_entry TO fanout_tenant_auditor;

GRANT SELECT(model) ON TABLE fanout.ledger_entry TO fanout_auditor;
GRANT SELECT(model) ON TABLE fanout.ledger_entry TO fanout_tenant_auditor;

GRANT SELECT(input_tokens) ON TABLE fanout.ledger_entry TO fanout_auditor;
GRANT SELECT(input_tokens) ON TABLE fanout.ledger_entry TO fanout_tenant_auditor;

GRANT SELECT(output_tokens) ON TABLE fanout.ledger_entry TO fanout_auditor;
GRANT SELECT(output_tokens) ON TABLE fanout.ledger_entry TO fanout_tenant_auditor;

GRANT SELECT,INSERT,UPDATE ON TABLE fanout.rate_bucket TO fanout_app;

GRANT SELECT,INSERT,UPDATE ON TABLE fanout.run TO fanout_app;

GRANT SELECT,INSERT ON TABLE fanout.run_event TO fanout_app;

GRANT SELECT ON TABLE fanout.semaphore_slot TO fanout_app;

GRANT SELECT,INSERT,UPDATE ON TABLE fanout.task TO fanout_app;

GRANT SELECT(run_id) ON TABLE fanout.task TO fanout_auditor;
GRANT SELECT(run_id) ON TABLE fanout.task TO fanout_tenant_auditor;

GRANT SELECT(task_id) ON TABLE fanout.task TO fanout_auditor;
GRANT SELECT(task_id) ON TABLE fanout.task TO fanout_tenant_auditor;

GRANT SELECT(tenant_id) ON TABLE fanout.task TO fanout_auditor;
GRANT SELECT(tenant_id) ON TABLE fanout.task TO fanout_tenant_auditor;

GRANT SELECT(dispatch_index) ON TABLE fanout.task TO fanout_auditor;
GRANT SELECT(dispatch_index) ON TABLE fanout.task TO fanout_tenant_auditor;

GRANT SELECT(status) ON TABLE fanout.task TO fanout_auditor;
GRANT SELECT(status) ON TABLE fanout.task TO fanout_tenant_auditor;

GRANT SELECT(tokens_spent) ON TABLE fanout.task TO fanout_auditor;
GRANT SELECT(tokens_spent) ON TABLE fanout.task TO fanout_tenant_auditor;

GRANT SELECT(worker) ON TABLE fanout.task TO fanout_auditor;
GRANT SELECT(worker) ON TABLE fanout.task TO fanout_tenant_auditor;

GRANT SELECT(started_at) ON TABLE fanout.task TO fanout_auditor;
GRANT SELECT(started_at) ON TABLE fanout.task TO fanout_tenant_auditor;

GRANT SELECT(finished_at) ON TABLE fanout.task TO fanout_auditor;
GRANT SELECT(finished_at) ON TABLE fanout.task TO fanout_tenant_auditor;

GRANT SELECT(outcome_error) ON TABLE fanout.task TO fanout_auditor;
GRANT SELECT(outcome_error) ON TABLE fanout.task TO fanout_tenant_auditor;

GRANT SELECT ON TABLE fanout.tenant_period TO fanout_app;

GRANT SELECT(account_id) ON TABLE fanout.tenant_period TO fanout_auditor;
GRANT SELECT(account_id) ON TABLE fanout.tenant_period TO fanout_tenant_auditor;

GRANT SELECT(tenant_id) ON TABLE fanout.tenant_period TO fanout_auditor;
GRANT SELECT(tenant_id) ON TABLE fanout.tenant_period TO fanout_tenant_auditor;

GRANT SELECT(period_kind) ON TABLE fanout.tenant_period TO fanout_auditor;
GRANT SELECT(period_kind) ON TABLE fanout.tenant_period TO fanout_tenant_auditor;

GRANT SELECT(period_start) ON TABLE fanout.tenant_period TO fanout_auditor;
GRANT SELECT(period_start) ON TABLE fanout.tenant_period TO fanout_tenant_auditor;

GRANT SELECT(period_end) ON TABLE fanout.tenant_period TO fanout_auditor;
GRANT SELECT(period_end) ON TABLE fanout.tenant_period TO fanout_tenant_auditor;

GRANT SELECT(first_entry_id) ON TABLE fanout.tenant_period TO fanout_auditor;
GRANT SELECT(first_entry_id) ON TABLE fanout.tenant_period TO fanout_tenant_auditor;

GRANT SELECT ON TABLE fanout.tool_call TO fanout_app;

GRANT SELECT(key) ON TABLE fanout.tool_call TO fanout_auditor;
GRANT SELECT(key) ON TABLE fanout.tool_call TO fanout_tenant_auditor;

GRANT SELECT(tenant_id) ON TABLE fanout.tool_call TO fanout_auditor;
GRANT SELECT(tenant_id) ON TABLE fanout.tool_call TO fanout_tenant_auditor;

GRANT SELECT(run_id) ON TABLE fanout.tool_call TO fanout_auditor;
GRANT SELECT(run_id) ON TABLE fanout.tool_call TO fanout_tenant_auditor;

GRANT SELECT(task_id) ON TABLE fanout.tool_call TO fanout_auditor;
GRANT SELECT(task_id) ON TABLE fanout.tool_call TO fanout_tenant_auditor;

GRANT SELECT(attempt) ON TABLE fanout.tool_call TO fanout_auditor;
GRANT SELECT(attempt) ON TABLE fanout.tool_call TO fanout_tenant_auditor;

GRANT SELECT(iteration) ON TABLE fanout.tool_call TO fanout_auditor;
GRANT SELECT(iteration) ON TABLE fanout.tool_call TO fanout_tenant_auditor;

GRANT SELECT(call_index) ON TABLE fanout.tool_call TO fanout_auditor;
GRANT SELECT(call_index) ON TABLE fanout.tool_call TO fanout_tenant_auditor;

GRANT SELECT(server) ON TABLE fanout.tool_call TO fanout_auditor;
GRANT SELECT(server) ON TABLE fanout.tool_call TO fanout_tenant_auditor;

GRANT SELECT(tool) ON TABLE fanout.tool_call TO fanout_auditor;
GRANT SELECT(tool) ON TABLE fanout.tool_call TO fanout_tenant_auditor;

GRANT SELECT(args_digest) ON TABLE fanout.tool_call TO fanout_auditor;
GRANT SELECT(args_digest) ON TABLE fanout.tool_call TO fanout_tenant_auditor;

GRANT UPDATE(state) ON TABLE fanout.tool_call TO fanout_app;
GRANT SELECT(state) ON TABLE fanout.tool_call TO fanout_auditor;
GRANT SELECT(state) ON TABLE fanout.tool_call TO fanout_tenant_auditor;

GRANT UPDATE(result) ON TABLE fanout.tool_call TO fanout_app;

GRANT UPDATE(error) ON TABLE fanout.tool_call TO fanout_app;
GRANT SELECT(error) ON TABLE fanout.tool_call TO fanout_auditor;
GRANT SELECT(error) ON TABLE fanout.tool_call TO fanout_tenant_auditor;

GRANT SELECT(created_at) ON TABLE fanout.tool_call TO fanout_auditor;
GRANT SELECT(created_at) ON TABLE fanout.tool_call TO fanout_tenant_auditor;

GRANT SELECT(resolved_at) ON TABLE fanout.tool_call TO fanout_auditor;
GRANT SELECT(resolved_at) ON TABLE fanout.tool_call TO fanout_tenant_auditor;

GRANT SELECT(result_bytes) ON TABLE fanout.tool_call TO fanout_auditor;
GRANT SELECT(result_bytes) ON TABLE fanout.tool_call TO fanout_tenant_auditor;

