-- The unique indexes of myjob_jobs over migration 14's columns, all NULL in a row that holds
-- no live unique key or no slot, so that a Galera node certifies no key for such a row and
-- writes of different jobs through different nodes stop conflicting. Uniqueness is as
-- before: each new column holds the queue, or the key, exactly when unique_live or slot_live
-- is not NULL. One statement: the old indexes hold until it commits, and it can be run again
-- if it fails. It reads the whole table: on a Galera cluster every node's writes wait while
-- it runs, so apply it when the table is small (after `myjob purge`) or the queue can wait.
-- A worker of an earlier release still running reads the slot index by its old columns and
-- scans the table at each gate pass: stop the workers first, as for every migration.
ALTER TABLE myjob_jobs
  DROP INDEX myjob_jobs_unique,
  ADD UNIQUE KEY myjob_jobs_unique (unique_queue, unique_live),
  DROP INDEX myjob_jobs_slot,
  ADD UNIQUE KEY myjob_jobs_slot (slot_queue, slot_key, slot_live),
  ALGORITHM = INPLACE, LOCK = NONE;
