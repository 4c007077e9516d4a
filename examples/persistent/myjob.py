"""myjob's persistent handler protocol, version 1, for Python 3.8+.

Import it and hand serve() a function that handles one job::

    import myjob

    db = connect(...)                  # set-up runs once, not once per job

    def handle(job):
        sms = json.loads(job.payload)
        send_sms(db, sms)              # returns: the job is done
        # raise myjob.Retry("gateway said 503")   retried with backoff
        # raise myjob.Fail("no such number")      failed for good

    myjob.serve(handle)

Any other exception is retried, with its text as the reason. Whatever the handler prints, and
whatever its child processes write to stdout, goes to stderr, which myjob logs tagged with the
job: stdout carries only the protocol. serve() returns when myjob closes stdin (a recycle, an
idle timeout, a reload or a stop): let the program end then.
"""

import os
import re
import sys

__all__ = ["Job", "Retry", "Fail", "serve"]


class Retry(Exception):
    """A failure worth retrying later: RETRY <text>."""


class Fail(Exception):
    """A job that can never succeed: FAIL <text>."""


class Job:
    """One job: its id, this attempt (from 1), the attempts allowed, the claim's batch id and
    the payload as bytes."""

    __slots__ = ("id", "attempt", "max_attempts", "batch_id", "payload")

    def __init__(self, id, attempt, max_attempts, batch_id, payload):
        self.id = id
        self.attempt = attempt
        self.max_attempts = max_attempts
        self.batch_id = batch_id
        self.payload = payload


def serve(handle):
    """Answers READY, then runs handle(job) for each job until stdin ends."""
    stdin = sys.stdin.buffer
    # The protocol keeps the real stdout; fd 1 becomes stderr for everything else.
    out = os.fdopen(os.dup(1), "wb", buffering=0)
    sys.stdout.flush()
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    out.write(b"READY\n")
    while True:
        header = stdin.readline()
        if not header:
            return  # EOF: myjob wants this process to exit
        f = header.split(b" ")
        if len(f) != 6 or f[0] != b"JOB" or not header.endswith(b"\n"):
            sys.stderr.write("myjob.py: not a job header: %r\n" % header)
            sys.exit(1)
        length = int(f[5])
        payload = stdin.read(length)
        if len(payload) < length:
            sys.exit(1)  # stdin ended inside a payload: myjob is gone
        job = Job(int(f[1]), int(f[2]), int(f[3]), int(f[4]), payload)
        try:
            handle(job)
            answer = b"OK"
        except Fail as e:
            answer = b"FAIL " + _reason(e)
        except Exception as e:
            answer = b"RETRY " + _reason(e)
        sys.stderr.flush()
        out.write(answer + b"\n")


def _reason(e):
    """An exception's text as one line for last_error."""
    text = str(e) or type(e).__name__
    text = re.sub(r"[\x00-\x1f\x7f]+", " ", text).strip()
    return text[:2000].encode("utf-8", "replace")
