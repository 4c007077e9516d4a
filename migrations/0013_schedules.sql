-- Recurring jobs (`[[schedule]]` in the config): a row per tick a schedule enqueued. Its key
-- (schedule, tick) is unique, and the row is inserted in the transaction that inserts the
-- tick's job, so that however many instances and hosts serve the schedule, each tick is
-- enqueued once: the others' INSERT of the same key fails (1062; on Galera, the second
-- commit fails certification) and rolls their job back with it.
-- - tick: the tick's instant, in UTC (sessions run in UTC).
-- - definition: the schedule's `cron`/`every` when it enqueued the tick. A schedule whose
--   definition has changed since its latest tick starts afresh (the ticks of a new period
--   are not missed ticks of the old one).
-- - job_id: the job it enqueued.
-- The latest row of a schedule says which tick it is on, and so which ticks a restart
-- missed; rows older than a day are deleted, but for each schedule's latest (that of a
-- schedule no longer in the config too).
CREATE TABLE IF NOT EXISTS myjob_schedule_ticks (
  schedule    VARBINARY(64)   NOT NULL,
  tick        TIMESTAMP(6)    NOT NULL,
  definition  VARBINARY(255)  NOT NULL DEFAULT '',
  job_id      BIGINT UNSIGNED NULL DEFAULT NULL,
  enqueued_at TIMESTAMP(6)    NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  PRIMARY KEY (schedule, tick)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;
