-- Only the culprit is convicted. A worker that dies (kill -9, the OOM killer, a crash) leaves
-- its jobs claimed, and the reaper cannot tell which of them brought it down. So a death
-- charges none of them, and raises each one's suspicion instead:
-- - suspicion 0: never held by a worker that died;
-- - suspicion 1: held at one death (a crash beside it, a kill -9 by an operator): it runs
--   again as any job does, at once, with the rest of its instance's jobs;
-- - suspicion 2: held at two deaths: a suspect. It waits as status 'suspect', out of the
--   claim's range, and an instance claims one suspect at a time into a slot of its own,
--   beside its plain jobs. A death of that instance now names its suspect: only a death of
--   a suspect in that slot counts as a rescue, and max_rescues of those fail the job. A
--   suspect that finishes, or fails by itself and is retried, is cleared.
-- A poison pill then runs at most max_rescues + 2 times, and jobs that were merely running
-- beside it are never failed for it.
-- - 'suspect' goes at the end of the ENUM, which both servers change in place; a suspect
--   keeps its unique key, so unique_live's expression changes, which rebuilds the table
--   (online, but on Galera a schema change holds every node's writes while it runs).
ALTER TABLE myjob_jobs
  ADD COLUMN suspicion TINYINT UNSIGNED NOT NULL DEFAULT 0 AFTER rescues,
  MODIFY status ENUM('pending', 'claimed', 'done', 'failed', 'scheduled', 'cancelled', 'suspect')
    NOT NULL DEFAULT (IF(run_at > NOW(6), 'scheduled', 'pending')),
  MODIFY unique_live VARCHAR(191)
    AS (IF(status IN ('pending', 'scheduled', 'claimed', 'suspect'), unique_key, NULL)) VIRTUAL;
