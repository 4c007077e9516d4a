-- The unique indexes of myjob_jobs over migration 14's columns: all NULL in a row that holds
-- no live unique key, or no slot, so that a Galera node certifies no key for it and writes of
-- different jobs through different nodes stop conflicting. What each index allows is as
-- before: each new column is the queue, or the key, exactly when unique_live or slot_live is
-- not NULL. One statement, built in place while writes go on: the old indexes hold until it
-- commits, and it can be run again if it fails.
ALTER TABLE myjob_jobs
  DROP INDEX myjob_jobs_unique,
  ADD UNIQUE KEY myjob_jobs_unique (unique_queue, unique_live),
  DROP INDEX myjob_jobs_slot,
  ADD UNIQUE KEY myjob_jobs_slot (slot_queue, slot_key, slot_live),
  ALGORITHM = INPLACE, LOCK = NONE;
