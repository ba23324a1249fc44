DROP TABLE IF EXISTS run_event, task, run;
