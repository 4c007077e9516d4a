<?php
// Exactly-once effects for a handler that writes to the database holding myjob_jobs: its
// work and the job's completion commit in one transaction, or not at all.
//
//     require __DIR__ . '/complete.php';
//     // per-job handler:    $id = (int) getenv('MYJOB_JOB_ID'); $batch = getenv('MYJOB_BATCH_ID');
//     // persistent handler: $id = $job->id;                     $batch = $job->batchId;
//     myjob_complete_in($db, $id, $batch, function (PDO $db) use ($order) {
//         $db->prepare('INSERT INTO orders (item) VALUES (?)')->execute([$order['item']]);
//     });
//
// The job's row is marked done only while it is still claimed under this run's batch. A run
// whose claim was reaped (its worker died, and the job was put back for another run) matches
// no row, and its work is rolled back with it: however often a job runs, its effects commit
// once. myjob sees the job done under its batch and writes nothing more about it.

/**
 * Runs $work($db) and marks job $jobId done, in one transaction fenced by $batchId. Returns
 * true when it committed, false when it rolled back because the job is no longer this run's.
 *
 * A deadlock (1213), which is also how a Galera cluster reports a transaction that lost to
 * another node's write, rolls the whole transaction back: it is run again, $work included,
 * up to $tries times in all, the waits between growing from about 10 ms to about 1 s (2 to
 * 3.5 s over the default's 10 tries). So $work must only write to this database. On a
 * Galera node each try after the first waits for the node to apply what the cluster
 * committed before it (wsrep_sync_wait): a node that lags would otherwise hand the next try
 * the same stale rows, and it would lose again. Each retry is said on stderr.
 */
function myjob_complete_in(PDO $db, int $jobId, string $batchId, callable $work, int $tries = 10): bool
{
    $db->setAttribute(PDO::ATTR_ERRMODE, PDO::ERRMODE_EXCEPTION);
    $syncWait = null;
    try {
        for ($try = 1; ; $try++) {
            $db->beginTransaction();
            try {
                $work($db);
                $done = $db->prepare(
                    "UPDATE myjob_jobs SET status = 'done', finished_at = NOW(6) "
                    . "WHERE id = ? AND batch_id = ? AND status = 'claimed'"
                );
                $done->execute([$jobId, $batchId]);
                if ($done->rowCount() !== 1) {
                    $db->rollBack();
                    return false;
                }
                $db->commit();
                return true;
            } catch (Throwable $e) {
                if ($db->inTransaction()) {
                    $db->rollBack();
                }
                $deadlock = $e instanceof PDOException && (int) ($e->errorInfo[1] ?? 0) === 1213;
                if (!$deadlock || $try >= $tries) {
                    throw $e;
                }
                $syncWait ??= myjob_sync_reads($db);
                $wait = random_int(5, 10) * min(100, 1 << ($try - 1));
                fwrite(STDERR, "job $jobId: try $try of $tries lost to a deadlock (1213); again in $wait ms\n");
                usleep($wait * 1000);
            }
        }
    } finally {
        if ($syncWait !== null && $syncWait !== false) {
            try {
                $db->exec('SET SESSION wsrep_sync_wait = ' . (int) $syncWait);
            } catch (Throwable $e) {
                // The connection is gone: the session and its setting with it.
            }
        }
    }
}

/**
 * On a Galera node, makes the session's transactions start from all the cluster committed
 * (wsrep_sync_wait = 1: BEGIN and SELECT wait for the node to apply it). Returns the value to
 * restore, or false where the server is no Galera node (MySQL has no such variable).
 */
function myjob_sync_reads(PDO $db)
{
    $on = $db->query("SHOW VARIABLES LIKE 'wsrep_on'")->fetch(PDO::FETCH_NUM);
    if ($on === false || $on[1] !== 'ON') {
        return false;
    }
    $old = (int) $db->query('SELECT @@SESSION.wsrep_sync_wait')->fetchColumn();
    $db->exec('SET SESSION wsrep_sync_wait = ' . ($old | 1));
    return $old;
}
