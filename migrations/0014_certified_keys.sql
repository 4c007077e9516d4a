-- What a Galera node certifies, made exact (issue: writers of different jobs conflicted).
-- A node certifies a write by the row's primary key and by every unique key of the rows it
-- changes whose columns are not all NULL. Over (queue, unique_live) and (queue,
-- concurrency_key, slot_live), every job of a queue without a live unique key or a slot had
-- the same key, (queue, NULL): two writes of any two jobs of one queue, made through two
-- nodes at nearly the same time, conflicted and one failed (a claim, an outcome, a
-- producer's INSERT, a handler's completion in the exactly-once recipe).
-- - unique_queue: the queue of a job whose unique key is live, NULL otherwise.
-- - slot_queue, slot_key: the queue and concurrency key of a job that holds a slot, NULL
--   otherwise.
-- Each is computed from stored columns alone, with the same condition as unique_live or
-- slot_live, so that the three parts of an index are NULL together. Added INSTANT; migration
-- 15 builds the indexes over them.
--
-- myjob_slots: a row per slot of a concurrency key admitted into on a Galera node, touched by
-- each such admission in its transaction. Its primary key is the slot itself, NOT NULL, so two
-- admissions into one slot made through two nodes always share a certification key and one
-- of them fails, whatever the secondary indexes give. The row holds no state (the unique
-- index over slot_live referees on each server): admitted_at and turn change at each
-- admission so that the row is written even when it exists, and the reaper deletes rows not
-- admitted into for a day.
CREATE TABLE IF NOT EXISTS myjob_slots (
  queue            VARBINARY(64)     NOT NULL,
  concurrency_key  VARBINARY(191)    NOT NULL,
  slot             SMALLINT UNSIGNED NOT NULL,
  admitted_at      TIMESTAMP(6)      NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  turn             BOOLEAN           NOT NULL DEFAULT FALSE,
  PRIMARY KEY (queue, concurrency_key, slot),
  KEY myjob_slots_age (admitted_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;
ALTER TABLE myjob_jobs
  ADD COLUMN unique_queue VARBINARY(64)
    AS (IF(status IN ('pending', 'scheduled', 'claimed', 'suspect', 'blocked')
           AND unique_key IS NOT NULL, queue, NULL)) VIRTUAL,
  ADD COLUMN slot_queue VARBINARY(64)
    AS (IF(slot IS NOT NULL AND (status IN ('pending', 'claimed', 'suspect')
           OR (status = 'cancelled' AND owner_conn IS NOT NULL)), queue, NULL)) VIRTUAL,
  ADD COLUMN slot_key VARBINARY(191)
    AS (IF(slot IS NOT NULL AND (status IN ('pending', 'claimed', 'suspect')
           OR (status = 'cancelled' AND owner_conn IS NOT NULL)), concurrency_key, NULL)) VIRTUAL,
  ALGORITHM = INSTANT;
