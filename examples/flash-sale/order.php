#!/usr/bin/env php
<?php
// The flash sale (docs/concurrency-keys.md): a handler that sells one order. The web
// request only records the order and enqueues its job, in one transaction:
//
//     INSERT INTO orders (product) VALUES (42);
//     INSERT INTO myjob_jobs (queue, concurrency_key, payload)
//       VALUES ('orders', 'product-42', LAST_INSERT_ID());
//
// With key_limit = 1 on the queue, the orders of one product are sold one at a time, in the
// order they came, on whichever instance; products sell side by side. The stock and the
// order's fate commit with the job's completion (examples/exactly-once/complete.php): a job
// that runs twice, its worker killed mid-order, sells once.
//
// The database comes from SHOP_DB (mysql://user:password@host:port/database), passed by the
// queue's pass_env.
require __DIR__ . '/../exactly-once/complete.php';

$u = parse_url(getenv('SHOP_DB'));
$db = new PDO(
    sprintf('mysql:host=%s;port=%d;dbname=%s', $u['host'], $u['port'] ?? 3306, ltrim($u['path'], '/')),
    urldecode($u['user'] ?? ''),
    urldecode($u['pass'] ?? '')
);
$order = (int) stream_get_contents(STDIN);

$sold = myjob_complete_in($db, (int) getenv('MYJOB_JOB_ID'), getenv('MYJOB_BATCH_ID'), function (PDO $db) use ($order) {
    $find = $db->prepare('SELECT product FROM orders WHERE id = ?');
    $find->execute([$order]);
    $product = $find->fetchColumn();
    if ($product === false) {
        throw new RuntimeException("order $order: no such order");
    }
    // One order of the product at a time (the concurrency key): no lock wait here, and the
    // stock cannot go below zero whatever runs beside it.
    $sell = $db->prepare('UPDATE products SET stock = stock - 1 WHERE id = ? AND stock > 0');
    $sell->execute([$product]);
    $fate = $sell->rowCount() === 1 ? 'sold' : 'sold_out';
    $db->prepare('UPDATE orders SET status = ?, handled_at = NOW(6) WHERE id = ?')->execute([$fate, $order]);
});
if (!$sold) {
    // The job is not this run's: its claim was reaped, and this run's outcome is ignored. Fail
    // rather than exit 0 all the same: were the job still this run's in the worker's eyes
    // (SHOP_DB naming another database than the worker's), it is run again, never taken for
    // done with nothing sold.
    fwrite(STDERR, "order $order: the job is not this run's claim; nothing sold\n");
    exit(1);
}
