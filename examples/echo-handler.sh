#!/bin/sh
# The smallest myjob handler: logs the job and its payload, and succeeds.
payload=$(cat)
echo "job $MYJOB_JOB_ID (queue $MYJOB_QUEUE, attempt $MYJOB_ATTEMPT of $MYJOB_MAX_ATTEMPTS): $payload"
