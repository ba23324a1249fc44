DROP VIEW fanout.task_outcome;
