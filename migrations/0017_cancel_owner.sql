-- The reaper's index of claims by time, (status, claimed_at), goes (migration 18): each claim
-- and each end of a job moved its entry there, and InnoDB's purge then removed the old one.
-- The reaper reads claimed jobs through the claim index, whose 'claimed' range holds them
-- already (as many as the fleet runs), and the jobs cancelled while they ran through an
-- index over this column, which is NULL for every job not cancelled: a job that is never
-- cancelled keeps one entry there, the same all its life.
--   cancel_owner: for a cancelled job, whether it still names a claimer or a claim time (its
--                 worker has not seen the handler stop); NULL for every other job.
-- Adding a virtual column at the end is instant.
ALTER TABLE myjob_jobs
  ADD COLUMN cancel_owner BOOLEAN
    AS (IF(status = 'cancelled', owner_conn IS NOT NULL OR claimed_at IS NOT NULL, NULL)) VIRTUAL,
  ALGORITHM = INSTANT;
