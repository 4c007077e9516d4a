-- The unique indexes of myjob_jobs again, each over columns that are all NULL in a row that
-- holds no live unique key, or no concurrency-key slot. A Galera node certifies a write by
-- the values of the unique indexes of the rows it changes, and takes a value as a key unless
-- every column of it is NULL: over (queue, unique_live) every job of a queue without a live
-- unique key had the same key, (queue, NULL), so two writes of any two of a queue's jobs
-- through two nodes at nearly the same time conflicted, and one of them failed with 1213
-- (claims, outcomes, hand-offs, and a handler's completion in the exactly-once recipe).
-- Uniqueness is as before: each new column holds the queue, or the key, exactly when
-- unique_live or slot_live is not NULL.
-- - unique_queue: the queue of a job whose unique key is live.
-- - slot_queue, slot_key: the queue and concurrency key of a job that holds a slot.
ALTER TABLE myjob_jobs
  ADD COLUMN unique_queue VARBINARY(64) AS (IF(unique_live IS NULL, NULL, queue)) VIRTUAL,
  ADD COLUMN slot_queue VARBINARY(64) AS (IF(slot_live IS NULL, NULL, queue)) VIRTUAL,
  ADD COLUMN slot_key VARBINARY(191) AS (IF(slot_live IS NULL, NULL, concurrency_key)) VIRTUAL,
  ALGORITHM = INSTANT;
ALTER TABLE myjob_jobs
  DROP INDEX myjob_jobs_unique,
  ADD UNIQUE KEY myjob_jobs_unique (unique_queue, unique_live),
  DROP INDEX myjob_jobs_slot,
  ADD UNIQUE KEY myjob_jobs_slot (slot_queue, slot_key, slot_live),
  ALGORITHM = INPLACE, LOCK = NONE;
