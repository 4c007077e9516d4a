#!/usr/bin/env php
<?php
// myjob handler for the "sms" queue. It replaces the body of a `while (true)` polling
// loop: myjob claims the row, runs this script once per job, and records the outcome.
//
// Contract: the payload (JSON {"phone": "...", "content": "..."}) arrives on stdin; the
// job's id and attempt are in the environment. Exit 0 = sent (the job is done), exit 65 =
// the payload can never be sent (the job fails at once), any other exit = try again later
// with backoff. Whatever is printed goes to the journal, tagged with the job id.

$jobId = getenv('MYJOB_JOB_ID');
$attempt = getenv('MYJOB_ATTEMPT');
$sms = json_decode(stream_get_contents(STDIN), true);

if (!is_array($sms) || empty($sms['phone']) || !isset($sms['content'])) {
    fwrite(STDERR, "job $jobId: payload is not {\"phone\": …, \"content\": …}\n");
    exit(65);
}

// The SMS gateway's address comes from the unit's environment through `pass_env`.
$gateway = getenv('SMS_GATEWAY_URL');
if ($gateway === false) {
    fwrite(STDERR, "SMS_GATEWAY_URL is not set (add it to pass_env)\n");
    exit(1);
}

$context = stream_context_create(['http' => [
    'method' => 'POST',
    'header' => "Content-Type: application/json\r\nIdempotency-Key: myjob-$jobId\r\n",
    'content' => json_encode(['to' => $sms['phone'], 'text' => $sms['content']]),
    'timeout' => 10,
    'ignore_errors' => true,
]]);
$body = @file_get_contents($gateway, false, $context);
$status = isset($http_response_header[0]) ? $http_response_header[0] : 'no response';

if ($body === false || !preg_match('#^HTTP/\S+ 2\d\d#', $status)) {
    // A timeout or a 5xx: myjob retries with backoff, up to max_attempts.
    fwrite(STDERR, "attempt $attempt: gateway said: $status\n");
    exit(1);
}
echo "sent to {$sms['phone']}\n";
exit(0);
