-- The cancels index over cancel_owner (migration 17) in place of the stale index: one
-- statement, built in place while writes go on, so that a failure (a lock wait, the online
-- log's limit) changes nothing and `myjob migrate` can be run again. Instances of an earlier
-- version read the stale index: stop them first, as every upgrade does.
ALTER TABLE myjob_jobs
  ADD KEY myjob_jobs_cancels (cancel_owner),
  DROP INDEX myjob_jobs_stale,
  ALGORITHM = INPLACE, LOCK = NONE;
