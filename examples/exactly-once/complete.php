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
 * up to $tries times. So $work must only write to this database.
 */
function myjob_complete_in(PDO $db, int $jobId, string $batchId, callable $work, int $tries = 5): bool
{
    $db->setAttribute(PDO::ATTR_ERRMODE, PDO::ERRMODE_EXCEPTION);
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
            usleep(random_int(5000, 50000));
        }
    }
}
