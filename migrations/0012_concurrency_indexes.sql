-- The indexes of concurrency keys (migration 11), and the unique index again, now over a
-- unique_live that counts blocked jobs. Built in place while writes go on; a migration of its
-- own, so that one that finds two live jobs with one unique key (a producer that ran between
-- the two) can be run again once one of them is cancelled.
-- - myjob_jobs_slot: at most one holder of each slot of a (queue, concurrency_key).
-- - myjob_jobs_blocked: a key's blocked jobs in the order they are admitted.
ALTER TABLE myjob_jobs
  ADD UNIQUE KEY myjob_jobs_unique (queue, unique_live),
  ADD UNIQUE KEY myjob_jobs_slot (queue, concurrency_key, slot_live),
  ADD KEY myjob_jobs_blocked (queue, blocked_key, priority DESC, id),
  ALGORITHM = INPLACE, LOCK = NONE;
