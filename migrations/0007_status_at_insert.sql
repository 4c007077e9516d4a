-- A job inserted with a future run_at is 'scheduled' from its INSERT on, by plain SQL too:
-- status's default reads run_at. Before, such a row was 'pending' until a stager moved it,
-- and a producer's bulk INSERT of future jobs (a campaign for tomorrow) sat in the claim's
-- range, to be read past by every claim and moved by the stager ahead of due work.
-- - MariaDB computes a default from columns defined before it, so status moves after run_at
--   (MySQL 8.0.13+ and MariaDB 10.2+ both allow an expression default; the move rebuilds the
--   table, online, but on Galera a schema change holds every node's writes while it runs).
-- - An INSERT that names status, as `myjob enqueue` does, is unchanged; the stager still
--   moves due 'scheduled' rows to 'pending', and a row whose run_at an UPDATE moved later
--   the other way.
ALTER TABLE myjob_jobs
  MODIFY status ENUM('pending', 'claimed', 'done', 'failed', 'scheduled', 'cancelled') NOT NULL
    DEFAULT (IF(run_at > NOW(6), 'scheduled', 'pending')) AFTER run_at;
