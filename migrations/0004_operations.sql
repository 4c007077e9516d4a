-- What the operator commands need.
-- - status 'cancelled': a job `myjob cancel` ended, final like 'done' and 'failed'. It frees
--   the job's unique key (unique_live holds it only while pending, scheduled or claimed). A
--   running job is cancelled in place: its worker sees the status at its next keepalive and
--   stops the handler.
-- - myjob_queues: the queues an operator paused (`myjob pause`), kept here so that the pause
--   holds across restarts and hosts. Every consumer reads it once per poll_interval: a few
--   rows, read whole by the primary key.
ALTER TABLE myjob_jobs
  MODIFY status ENUM('pending', 'claimed', 'done', 'failed', 'scheduled', 'cancelled') NOT NULL DEFAULT 'pending';
CREATE TABLE IF NOT EXISTS myjob_queues (
  queue      VARBINARY(64) NOT NULL,
  -- NULL: running; otherwise when it was paused.
  paused_at  TIMESTAMP(6)  NULL DEFAULT NULL,
  PRIMARY KEY (queue)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;
