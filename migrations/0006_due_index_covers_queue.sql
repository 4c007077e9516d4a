-- myjob stats reads the due jobs of each queue from the due index alone: with the queue in
-- it, the oldest due job of a queue is found without reading a row, however large the
-- backlog of the other queues. The id stays right after run_at, where InnoDB put it before
-- (a secondary index ends with the primary key): the stager, the reaper's retention and
-- myjob purge read the index in (status, run_at, id) order, and the purge's cursor is a range
-- on all three.
ALTER TABLE myjob_jobs
  DROP INDEX myjob_jobs_due,
  ADD INDEX myjob_jobs_due (status, run_at, id, queue);
