//! What happens to a job after its handler ran: done, retried after a backoff, failed, or
//! released. The one place that knows the exit-code contract and the backoff curve.

use std::time::Duration;

use crate::config::QueueSettings;
use crate::store::jobs::Outcome;
use crate::worker::handler::Exit;

/// A handler that exits with this code has failed for good: the job is `failed` at once,
/// whatever attempts it has left (sysexits' EX_DATAERR: "the input data was incorrect").
pub const PERMANENT_FAILURE_EXIT: i32 = 65;

/// Decides the write for a job whose handler ended with `exit`, on attempt `attempt` of
/// `max_attempts`.
pub fn decide(exit: Exit, attempt: u32, max_attempts: u32, queue: &QueueSettings) -> Outcome {
    match exit {
        Exit::Success => Outcome::Done,
        Exit::Aborted => Outcome::Release,
        Exit::Cancelled => Outcome::Cancelled,
        Exit::Refused { reason } => Outcome::Fail {
            error: format!("permanent failure on attempt {attempt}: {reason}"),
        },
        Exit::Failed { reason, code } => {
            if code == Some(PERMANENT_FAILURE_EXIT) {
                Outcome::Fail {
                    error: format!("permanent failure on attempt {attempt}: {reason}"),
                }
            } else if attempt >= max_attempts {
                Outcome::Fail {
                    error: format!("attempt {attempt} of {max_attempts}: {reason}"),
                }
            } else {
                Outcome::Retry {
                    delay: backoff(queue, attempt),
                    error: format!("attempt {attempt} of {max_attempts}: {reason}"),
                }
            }
        }
    }
}

/// Exponential backoff with jitter: attempt n waits between half and all of
/// `backoff * 2^(n-1)`, capped at `backoff_max`. The jitter spreads the retries of jobs that
/// failed together (a downstream outage) so they do not all come back at once.
pub fn backoff(queue: &QueueSettings, attempt: u32) -> Duration {
    let exp = attempt.saturating_sub(1).min(30);
    let full = queue
        .backoff
        .saturating_mul(1u32 << exp)
        .min(queue.backoff_max);
    let half = full / 2;
    half + half.mul_f64(rand::random::<f64>())
}

/// The shortest and the longest time from a job's first failure to its last attempt's start,
/// by [`backoff`]'s jitter: an outage shorter than the shortest is ridden out by every job.
#[cfg(test)]
pub fn retry_span(queue: &QueueSettings) -> (Duration, Duration) {
    let full = (1..queue.max_attempts).map(|attempt| {
        let exp = (attempt - 1).min(30);
        queue
            .backoff
            .saturating_mul(1u32 << exp)
            .min(queue.backoff_max)
    });
    let longest: Duration = full.sum();
    (longest / 2, longest)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue() -> QueueSettings {
        QueueSettings {
            name: "q".into(),
            command: vec!["/bin/true".into()],
            timeout: Duration::from_secs(1),
            max_attempts: 3,
            backoff: Duration::from_secs(10),
            backoff_max: Duration::from_secs(60),
            pass_env: vec![],
            persistent: None,
            rate: None,
            key_limit: 1,
        }
    }

    fn failed(code: i32) -> Exit {
        Exit::Failed {
            reason: format!("exit status {code}"),
            code: Some(code),
        }
    }

    #[test]
    fn backoff_doubles_within_jitter_and_stops_at_the_cap() {
        let q = queue();
        for _ in 0..100 {
            let d1 = backoff(&q, 1);
            assert!(
                d1 >= Duration::from_secs(5) && d1 <= Duration::from_secs(10),
                "{d1:?}"
            );
            let d3 = backoff(&q, 3);
            assert!(
                d3 >= Duration::from_secs(20) && d3 <= Duration::from_secs(40),
                "{d3:?}"
            );
            let d9 = backoff(&q, 40);
            assert!(
                d9 >= Duration::from_secs(30) && d9 <= Duration::from_secs(60),
                "{d9:?}"
            );
        }
    }

    /// The SMS example says an outage of up to an hour is ridden out: every job's retries
    /// must outlast an hour, and the comment gives their span.
    #[test]
    fn the_sms_example_rides_out_an_hour() {
        let text = include_str!("../../../examples/sms/myjob.toml")
            .replace("password_file", "# password_file");
        let s = crate::config::from_text(&text).unwrap();
        let (shortest, longest) = retry_span(&s.queues[0]);
        assert!(shortest >= Duration::from_secs(3600), "{shortest:?}");
        let said = format!(
            "its retries span {} to {} minutes",
            shortest.as_secs() / 60,
            longest.as_secs() / 60
        );
        assert!(text.contains(&said), "the example should say {said:?}");
    }

    #[test]
    fn failures_retry_until_the_last_attempt() {
        let q = queue();
        assert!(matches!(decide(failed(1), 1, 3, &q), Outcome::Retry { .. }));
        assert!(matches!(decide(failed(1), 3, 3, &q), Outcome::Fail { .. }));
        assert!(matches!(
            decide(failed(PERMANENT_FAILURE_EXIT), 1, 3, &q),
            Outcome::Fail { .. }
        ));
        assert_eq!(decide(Exit::Success, 1, 3, &q), Outcome::Done);
        assert_eq!(decide(Exit::Aborted, 1, 3, &q), Outcome::Release);
    }
}
