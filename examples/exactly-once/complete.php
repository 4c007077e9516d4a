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
 * up to $tries times in all, with waits between that grow from about 10 ms to about 1 s
 * (1.6 to 3.3 s in all over the default's 10 tries, plus each try's own time and, on
 * Galera, its BEGIN's wait, below: size the queue's `timeout` for it). So $work must only write to this database. Each lost try is
 * said on stderr.
 *
 * On a Galera node every try starts from all the cluster had committed when it began
 * (wsrep_sync_wait at its BEGIN, for that statement alone): the handler's node may not yet
 * have applied the claim that the worker made through another node, and would find the job
 * not this run's; and a node that lags would hand a retry the same stale rows to lose with.
 */
function myjob_complete_in(PDO $db, int $jobId, string $batchId, callable $work, int $tries = 10): bool
{
    $db->setAttribute(PDO::ATTR_ERRMODE, PDO::ERRMODE_EXCEPTION);
    $tries = max(1, $tries);
    for ($try = 1; ; $try++) {
        myjob_begin_synced($db);
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
            try {
                if ($db->inTransaction()) {
                    $db->rollBack();
                }
            } catch (Throwable $ignored) {
                // The connection is gone (a COMMIT whose answer was lost among them): what
                // the caller needs is the first error, thrown below.
            }
            $deadlock = $e instanceof PDOException && (int) ($e->errorInfo[1] ?? 0) === 1213;
            if (!$deadlock || $try >= $tries) {
                throw $e;
            }
            $wait = random_int(5, 10) * min(100, 1 << min($try - 1, 7));
            fwrite(STDERR, "job $jobId: try $try of $tries lost to a deadlock (1213); again in $wait ms\n");
            usleep($wait * 1000);
        }
    }
}

/**
 * Begins a transaction; on a Galera node, one that waits at its BEGIN for the node to apply
 * what the cluster committed before it (wsrep_sync_wait bit 1 for the BEGIN alone: the
 * session's own setting is back before $work runs). Whether $db is a Galera node is asked
 * once per connection.
 */
function myjob_begin_synced(PDO $db): void
{
    static $nodes = null;
    $nodes ??= new WeakMap();
    if (!isset($nodes[$db])) {
        $on = $db->query("SHOW VARIABLES LIKE 'wsrep_on'")->fetch(PDO::FETCH_NUM);
        $nodes[$db] = $on !== false && $on[1] === 'ON';
    }
    if (!$nodes[$db]) {
        $db->beginTransaction();
        return;
    }
    $old = (int) $db->query('SELECT @@SESSION.wsrep_sync_wait')->fetchColumn();
    if ($old & 1) {
        $db->beginTransaction();
        return;
    }
    $db->exec('SET SESSION wsrep_sync_wait = ' . ($old | 1));
    try {
        $db->beginTransaction();
    } finally {
        try {
            $db->exec('SET SESSION wsrep_sync_wait = ' . $old);
        } catch (Throwable $e) {
            // No transaction may outlive this on a connection that persists.
            if ($db->inTransaction()) {
                $db->rollBack();
            }
            throw $e;
        }
    }
}
