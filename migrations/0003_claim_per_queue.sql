-- The claim, second pass: it reads about as many index entries as it claims, whatever else
-- the table holds.
-- - status 'scheduled': a job not yet due (enqueued with a delay, or a retry waiting out its
--   backoff). The consumer's stager promotes it to 'pending' when due, and moves a plain
--   INSERT with a future run_at the other way, so pending rows are (nearly) all due.
-- - queue is VARBINARY: names match byte for byte, in SQL as in the config ('SMS' and 'sms '
--   are other queues, not claimed by a worker of 'sms').
-- - rescues: how often the reaper put the job back because its worker vanished while it ran;
--   past reaper.max_rescues the job fails (a job that brings its worker down).
-- - the claim index leads with status and queue: one claim per queue walks only that queue's
--   pending rows, in run order. The stager's index finds due or future rows by run_at.
ALTER TABLE myjob_jobs
  MODIFY queue        VARBINARY(64) NOT NULL DEFAULT 'default',
  MODIFY status       ENUM('pending', 'claimed', 'done', 'failed', 'scheduled') NOT NULL DEFAULT 'pending',
  ADD COLUMN rescues  INT UNSIGNED  NOT NULL DEFAULT 0 AFTER attempts,
  MODIFY unique_live  VARCHAR(191)  AS (IF(status IN ('pending', 'scheduled', 'claimed'), unique_key, NULL)) VIRTUAL,
  DROP INDEX myjob_jobs_claim,
  ADD INDEX myjob_jobs_claim (status, queue, priority DESC, id),
  ADD INDEX myjob_jobs_due (status, run_at);
UPDATE myjob_jobs SET status = 'scheduled' WHERE status = 'pending' AND run_at > NOW(6);
