-- The jobs table. Producers INSERT into it directly:
--   INSERT INTO myjob_jobs (queue, payload) VALUES ('sms', '{"to":"+15550100"}');
-- Every other column has a default. Times are TIMESTAMP(6), stored in UTC, so producers and
-- workers in different session time zones agree on when a job is due.
CREATE TABLE IF NOT EXISTS myjob_jobs (
  id            BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
  queue         VARCHAR(64)     NOT NULL DEFAULT 'default',
  -- Higher runs first; FIFO by id within a priority.
  priority      SMALLINT        NOT NULL DEFAULT 0,
  -- Up to 16 MiB (less one byte); handed to the handler on stdin as it is. The default is an
  -- expression: MySQL allows no literal default on a BLOB, and MariaDB accepts both.
  payload       MEDIUMBLOB      NOT NULL DEFAULT (''),
  status        ENUM('pending', 'claimed', 'done', 'failed') NOT NULL DEFAULT 'pending',
  -- Attempts started so far; the claim adds one.
  attempts      INT UNSIGNED    NOT NULL DEFAULT 0,
  -- NULL means the queue's configured max_attempts.
  max_attempts  INT UNSIGNED    NULL DEFAULT NULL,
  -- The job is due when run_at <= NOW(6): a later run_at delays it.
  run_at        TIMESTAMP(6)    NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  -- NULL, or unique per queue among the jobs not yet finished (pending or claimed).
  unique_key    VARCHAR(191)    NULL DEFAULT NULL,
  -- unique_key while the job is pending or claimed, NULL after: what the unique index holds.
  unique_live   VARCHAR(191)    AS (IF(status IN ('pending', 'claimed'), unique_key, NULL)) VIRTUAL,
  -- Stamped by the claim; every later write about the job is fenced by it.
  batch_id      BIGINT UNSIGNED NULL DEFAULT NULL,
  -- The claimer's CONNECTION_ID(), and which server (host:port/start time) it belongs to.
  owner_conn    BIGINT UNSIGNED NULL DEFAULT NULL,
  owner_server  VARCHAR(255)    NULL DEFAULT NULL,
  -- host:pid:instance of the worker that claimed it.
  worker        VARCHAR(255)    NULL DEFAULT NULL,
  claimed_at    TIMESTAMP(6)    NULL DEFAULT NULL,
  finished_at   TIMESTAMP(6)    NULL DEFAULT NULL,
  created_at    TIMESTAMP(6)    NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  -- Why the last attempt failed: exit status and the tail of stderr.
  last_error    TEXT            NULL DEFAULT NULL,
  PRIMARY KEY (id),
  -- The claim: pending rows in run order, without reading finished ones.
  KEY myjob_jobs_claim (status, priority DESC, id),
  -- SELECT … WHERE batch_id = ? after the claim, and the fenced writes.
  KEY myjob_jobs_batch (batch_id),
  -- The reaper's scan of old claims.
  KEY myjob_jobs_stale (status, claimed_at),
  UNIQUE KEY myjob_jobs_unique (queue, unique_live)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;
