-- 0034: logins in fanout_app keep everything an orchestrator or a worker
-- needs (the promise of 0023): a worker that still logs in as a member of
-- fanout_app (one login for every node, as `fanout dev` and the benchmarks
-- run) records the limits its providers state, as it takes from their
-- rate buckets. Without it such a worker's readings were refused and the
-- orchestrators never learned a limit.
GRANT INSERT, UPDATE ON TABLE fanout.provider_limit TO fanout_app;
