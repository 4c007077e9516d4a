#!/bin/bash
# A persistent myjob handler in plain bash, no library: protocol version 1.
echo READY                                   # ready for the first job
while read -r word id attempt max_attempts batch_id length; do
  [ "$word" = JOB ] || exit 1                # never happens: the header is always a JOB line
  payload=$(mktemp)
  head -c "$length" > "$payload"             # exactly <length> bytes, any bytes
  if send-sms < "$payload" >&2; then         # its output to stderr: stdout is the protocol's
    echo OK
  else
    echo "RETRY send-sms failed on attempt $attempt of $max_attempts"
  fi
  rm -f "$payload"
done                                         # EOF on stdin: time to exit
