-- A job's claim and its end each moved its entry in the stale index (status, claimed_at), and
-- InnoDB's purge then removed the old one: a quarter of the server's CPU per job went to
-- rewriting and purging that index's entries. The reaper now reads claimed jobs through the
-- claim index, whose 'claimed' range holds them already (as many as the fleet runs), and jobs
-- cancelled while they ran through an index of their own, over virtual columns that are NULL
-- for every other job: a job that is never cancelled keeps one entry there, the same all its
-- life.
--   cancel_owner: for a cancelled job, whether it still names a claimer (its worker has not
--                 seen the handler stop); NULL for every job not cancelled.
--   cancel_at:    for a cancelled job, its claim's time; NULL for every job not cancelled.
-- Adding a virtual column at the end is instant; the index is built in place while writes go
-- on, and the old one dropped in place.
ALTER TABLE myjob_jobs
  ADD COLUMN cancel_owner BOOLEAN
    AS (IF(status = 'cancelled', owner_conn IS NOT NULL OR claimed_at IS NOT NULL, NULL)) VIRTUAL,
  ADD COLUMN cancel_at TIMESTAMP(6)
    AS (IF(status = 'cancelled', claimed_at, NULL)) VIRTUAL,
  ALGORITHM = INSTANT;
ALTER TABLE myjob_jobs
  ADD KEY myjob_jobs_cancels (cancel_owner, cancel_at),
  ALGORITHM = INPLACE, LOCK = NONE;
ALTER TABLE myjob_jobs
  DROP INDEX myjob_jobs_stale,
  ALGORITHM = INPLACE, LOCK = NONE;
