-- Concurrency keys (`key_limit = N` on a queue): at most N jobs of one (queue,
-- concurrency_key) hold a slot at once, across every instance and host. A slot belongs to
-- the job row, and is held exactly while the row says so; no counter exists to drift from it:
-- - concurrency_key: set by the producer; NULL (the default) is a job without a limit.
-- - slot: which of the key's N slots the job was admitted into (1..N), set by the gate when it
--   moves a job from 'blocked' to 'pending'.
-- - slot_live: the slot while the job holds it (pending, claimed, a suspect waiting to run
--   again, or cancelled while its handler may still run: until its worker says the handler
--   has stopped, or the reaper finds the worker gone); a unique index on (queue, concurrency_key, slot_live) makes an N+1st holder
--   impossible, whatever two gates race: a crash cannot leak a slot, because a dead worker's
--   claim keeps it exactly until the reaper has decided, and a release is the job's own
--   fenced status write.
-- - 'blocked': a due job of a key waiting for a slot; no attempt used, no backoff. A plain
--   INSERT that names a concurrency_key lands 'blocked' (status's default reads it), and the
--   gate admits blocked jobs in priority, then arrival, order of their key.
-- - blocked_key: the key while the job is blocked, NULL otherwise; the blocked index
--   (queue, blocked_key, priority DESC, id) finds a key's next job in one entry. A job
--   without a key has NULL in both new indexes at every status, so the claim's and the
--   outcome's writes of a queue without limits change no entry of them.
-- - unique_live counts 'blocked' too: a blocked job keeps its unique key.
-- Every statement is INSTANT, or INPLACE with LOCK=NONE, on MariaDB 10.11+ and MySQL 8.0.29+:
-- no table rebuild, and no write waits while the indexes build (on Galera, a schema change
-- holds every node's writes while it runs). MariaDB changes a table with an indexed virtual
-- column only by a rebuild, so the unique index goes first and comes back in migration 12:
-- between the two, a producer's unique key is not enforced (stop producers that rely on it
-- for the few seconds the migration takes; if migration 12 then finds two live jobs with one
-- key, cancel one and run `myjob migrate` again).
ALTER TABLE myjob_jobs DROP INDEX myjob_jobs_unique, ALGORITHM = INPLACE, LOCK = NONE;
ALTER TABLE myjob_jobs
  ADD COLUMN concurrency_key VARBINARY(191) NULL DEFAULT NULL,
  ADD COLUMN slot SMALLINT UNSIGNED NULL DEFAULT NULL,
  MODIFY status ENUM('pending', 'claimed', 'done', 'failed', 'scheduled', 'cancelled', 'suspect',
                     'blocked') NOT NULL
    DEFAULT (IF(run_at > NOW(6), 'scheduled', IF(concurrency_key IS NULL, 'pending', 'blocked'))),
  ALGORITHM = INSTANT;
ALTER TABLE myjob_jobs
  DROP COLUMN unique_live,
  ADD COLUMN unique_live VARCHAR(191)
    AS (IF(status IN ('pending', 'scheduled', 'claimed', 'suspect', 'blocked'), unique_key, NULL))
    VIRTUAL AFTER unique_key,
  ADD COLUMN slot_live SMALLINT UNSIGNED
    AS (IF(status IN ('pending', 'claimed', 'suspect')
           OR (status = 'cancelled' AND owner_conn IS NOT NULL), slot, NULL)) VIRTUAL,
  ADD COLUMN blocked_key VARBINARY(191) AS (IF(status = 'blocked', concurrency_key, NULL)) VIRTUAL,
  ALGORITHM = INSTANT;
