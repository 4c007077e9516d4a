//! The handler slots: the handlers running now, each a task that ends with its job's outcome.
//! What each was started for is kept beside its task, so that a task that dies (a bug) still
//! gives its job an outcome.

use std::collections::HashMap;
use std::time::Duration;

use tokio::task::{Id, JoinError, JoinSet};
use tokio_util::sync::CancellationToken;

use crate::store::jobs::{Completion, Outcome};
use crate::worker::handler::{self, Exit};
use crate::worker::prefetch::Ready;
use crate::worker::retry;

/// A handler that ended, with its job's outcome.
#[derive(Debug)]
pub struct Finished {
    pub attempt: u32,
    pub completion: Completion,
}

/// What a slot remembers about its handler.
struct Running {
    job_id: u64,
    batch_id: u64,
    attempt: u32,
    max_attempts: u32,
    queue: std::sync::Arc<crate::config::QueueSettings>,
}

pub struct Slots {
    /// `MYJOB_INSTANCE` for the handlers.
    instance: String,
    tasks: JoinSet<Outcome>,
    running: HashMap<Id, Running>,
    /// Fired when a shutdown runs out of time: kills every handler still running.
    abort: CancellationToken,
}

impl Slots {
    pub fn new(instance: &str) -> Self {
        Slots {
            instance: instance.to_owned(),
            tasks: JoinSet::new(),
            running: HashMap::new(),
            abort: CancellationToken::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// The batches of the running jobs: still this instance's claims.
    pub fn batches(&self) -> impl Iterator<Item = u64> + '_ {
        self.running.values().map(|r| r.batch_id)
    }

    /// Starts a handler for `r`.
    pub fn start(&mut self, r: Ready, kill_grace: Duration) {
        let Ready {
            job,
            batch_id,
            queue,
        } = r;
        let max_attempts = job.max_attempts.unwrap_or(queue.max_attempts);
        let run = handler::Job {
            id: job.id,
            queue: job.queue,
            payload: job.payload.into(),
            attempt: job.attempt,
            max_attempts,
            batch_id,
            instance: self.instance.clone(),
        };
        tracing::debug!(job_id = run.id, attempt = run.attempt, queue = %run.queue, "job started");
        let abort = self.abort.clone();
        let q = queue.clone();
        let task = self.tasks.spawn(async move {
            let exit = handler::run(&run, &q, kill_grace, &abort).await;
            retry::decide(exit, run.attempt, run.max_attempts, &q)
        });
        self.running.insert(
            task.id(),
            Running {
                job_id: job.id,
                batch_id,
                attempt: job.attempt,
                max_attempts,
                queue,
            },
        );
    }

    /// A handler that has ended already, if any.
    pub fn try_finished(&mut self) -> Option<Finished> {
        loop {
            let r = self.tasks.try_join_next_with_id()?;
            if let Some(f) = self.finished(r) {
                return Some(f);
            }
        }
    }

    /// Waits for the next handler to end; pending for ever when none runs.
    pub async fn next_finished(&mut self) -> Finished {
        loop {
            match self.tasks.join_next_with_id().await {
                Some(r) => {
                    if let Some(f) = self.finished(r) {
                        return f;
                    }
                }
                None => std::future::pending().await,
            }
        }
    }

    /// Kills every handler still running (their jobs are then released).
    pub fn abort(&self) {
        self.abort.cancel();
    }

    fn finished(&mut self, result: Result<(Id, Outcome), JoinError>) -> Option<Finished> {
        let id = match &result {
            Ok((id, _)) => *id,
            Err(e) => e.id(),
        };
        let r = self.running.remove(&id)?;
        let outcome = match result {
            Ok((_, outcome)) => outcome,
            // The task died (a bug); the job must still get an outcome.
            Err(e) => {
                let exit = Exit::Failed {
                    reason: format!("internal error in myjob: {e}"),
                    code: None,
                };
                retry::decide(exit, r.attempt, r.max_attempts, &r.queue)
            }
        };
        Some(Finished {
            attempt: r.attempt,
            completion: Completion {
                job_id: r.job_id,
                batch_id: r.batch_id,
                outcome,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::config::QueueSettings;
    use crate::store::jobs::ClaimedJob;

    fn ready(id: u64, command: &[&str], timeout: Duration) -> Ready {
        Ready {
            job: ClaimedJob {
                id,
                queue: "q".into(),
                payload: b"x".to_vec(),
                attempt: 1,
                max_attempts: None,
            },
            batch_id: 7,
            queue: Arc::new(QueueSettings {
                name: "q".into(),
                command: command.iter().map(|s| s.to_string()).collect(),
                timeout,
                max_attempts: 3,
                backoff: Duration::from_secs(1),
                backoff_max: Duration::from_secs(10),
                pass_env: Vec::new(),
            }),
        }
    }

    #[tokio::test]
    async fn each_handler_ends_with_its_jobs_outcome() {
        let mut slots = Slots::new("t");
        let t = Duration::from_secs(10);
        slots.start(ready(1, &["/bin/true"], t), t);
        slots.start(ready(2, &["/bin/false"], t), t);
        assert_eq!(slots.len(), 2);
        assert_eq!(slots.batches().collect::<Vec<_>>(), [7, 7]);
        let mut got = Vec::new();
        for _ in 0..2 {
            let f = slots.next_finished().await;
            assert_eq!((f.attempt, f.completion.batch_id), (1, 7));
            got.push((f.completion.job_id, f.completion.outcome));
        }
        got.sort_by_key(|g| g.0);
        assert_eq!(got[0].1, Outcome::Done);
        assert!(matches!(got[1].1, Outcome::Retry { .. }), "{:?}", got[1]);
        assert!(slots.is_empty());
        assert!(slots.try_finished().is_none());
    }

    #[tokio::test]
    async fn an_abort_kills_the_handlers_and_releases_their_jobs() {
        let mut slots = Slots::new("t");
        let t = Duration::from_secs(60);
        slots.start(ready(1, &["/bin/sleep", "60"], t), t);
        slots.abort();
        let f = tokio::time::timeout(Duration::from_secs(10), slots.next_finished())
            .await
            .expect("the handler was killed at once");
        assert_eq!(f.completion.outcome, Outcome::Release);
    }
}
