-- Columns for the unique indexes of myjob_jobs that migration 15 rebuilds over them: each is
-- NULL in a row that holds no live unique key, or no concurrency-key slot. A Galera node
-- certifies a write by the values of the unique indexes of the rows it changes, and takes a
-- value as a key unless every column of it is NULL: over (queue, unique_live) every job of a
-- queue without a live unique key had the same key, (queue, NULL), so two writes of any two
-- of a queue's jobs through two nodes at nearly the same time conflicted, and one of them
-- failed with 1213 (claims, outcomes, hand-offs, a handler's completion in the exactly-once
-- recipe).
-- - unique_queue: the queue of a job whose unique key is live (unique_live not NULL).
-- - slot_queue, slot_key: the queue and concurrency key of a job that holds a slot
--   (slot_live not NULL).
-- They read unique_live and slot_live, so that one expression says when a key or a slot is
-- held: a later change of either must drop these first. A migration of its own, added
-- INSTANT, so that 15, which builds indexes, can be run again alone if it fails.
ALTER TABLE myjob_jobs
  ADD COLUMN unique_queue VARBINARY(64) AS (IF(unique_live IS NULL, NULL, queue)) VIRTUAL,
  ADD COLUMN slot_queue VARBINARY(64) AS (IF(slot_live IS NULL, NULL, queue)) VIRTUAL,
  ADD COLUMN slot_key VARBINARY(191) AS (IF(slot_live IS NULL, NULL, concurrency_key)) VIRTUAL,
  ALGORITHM = INSTANT;
