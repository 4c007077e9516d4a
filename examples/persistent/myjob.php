<?php
// myjob's persistent handler protocol, version 1, for PHP 8.1+. Require this file and hand
// myjob_serve() a function that handles one job:
//
//     require __DIR__ . '/myjob.php';
//     $db = new PDO(...);                      // set-up runs once, not once per job
//     myjob_serve(function (MyjobJob $job) use ($db) {
//         $sms = json_decode($job->payload, true, flags: JSON_THROW_ON_ERROR);
//         send_sms($db, $sms);                 // returns: the job is done
//         // throw new MyjobRetry('gateway said 503');   retried with backoff
//         // throw new MyjobFail('no such number');      failed for good
//     });
//
// Any other exception or error is retried, with its message as the reason. Whatever the
// handler echoes or prints goes to stderr, which myjob logs tagged with the job: stdout
// carries only the protocol. myjob_serve() returns when myjob closes stdin (a recycle, an
// idle timeout, a reload or a stop): let the script end then.

final class MyjobJob
{
    public function __construct(
        public readonly int $id,
        public readonly int $attempt,
        public readonly int $maxAttempts,
        // A 64-bit unsigned number: kept as a string, PHP's int is signed.
        public readonly string $batchId,
        public readonly string $payload,
    ) {
    }
}

/** Throw it for a failure worth retrying later: RETRY <message>. */
class MyjobRetry extends Exception
{
}

/** Throw it for a job that can never succeed: FAIL <message>. */
class MyjobFail extends Exception
{
}

function myjob_serve(callable $handle): void
{
    $in = STDIN;
    $out = STDOUT;
    // echo and print from here on go to stderr, a write at a time.
    ob_start(static function (string $buffer): string {
        fwrite(STDERR, $buffer);
        return '';
    }, 1);
    fwrite($out, "READY\n");
    fflush($out);
    while (($header = fgets($in)) !== false) {
        $f = explode(' ', rtrim($header, "\n"));
        if (count($f) !== 6 || $f[0] !== 'JOB') {
            fwrite(STDERR, "myjob.php: not a job header: " . rtrim($header) . "\n");
            exit(1);
        }
        $length = (int) $f[5];
        $payload = '';
        while (strlen($payload) < $length) {
            $chunk = fread($in, min($length - strlen($payload), 1 << 20));
            if ($chunk === false || $chunk === '') {
                exit(1); // stdin ended inside a payload: myjob is gone
            }
            $payload .= $chunk;
        }
        $job = new MyjobJob((int) $f[1], (int) $f[2], (int) $f[3], $f[4], $payload);
        try {
            $handle($job);
            $answer = 'OK';
        } catch (MyjobFail $e) {
            $answer = 'FAIL ' . myjob_reason($e);
        } catch (Throwable $e) {
            $answer = 'RETRY ' . myjob_reason($e);
        }
        @ob_flush();
        fwrite($out, $answer . "\n");
        fflush($out);
    }
}

/** An exception's message as one line for last_error. */
function myjob_reason(Throwable $e): string
{
    $text = $e->getMessage() !== '' ? $e->getMessage() : get_class($e);
    $text = trim(preg_replace('/[\x00-\x1f\x7f]+/', ' ', $text));
    return substr($text, 0, 2000);
}
