//! The instance's long-lived tasks: the consumer, the reaper, the stager and the scheduler
//! (`daemon::run` spawns them). Each runs until the shutdown. One that ends before it (a
//! panic: a bug) must end the process with an error, so that systemd restarts it, rather than
//! leave a process that looks alive and does nothing: a dead reaper puts back no claim, and a
//! dead consumer claims nothing while the watchdog, if there is one, takes a whole period to
//! notice.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;

use tokio::task::{Id, JoinError, JoinSet};

#[derive(Default)]
pub struct Tasks {
    set: JoinSet<()>,
    names: HashMap<Id, &'static str>,
}

/// A task that ended, and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ended {
    pub name: &'static str,
    /// The panic's message, when it panicked.
    pub panic: Option<String>,
}

impl fmt::Display for Ended {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.panic {
            Some(message) => write!(f, "the {} task panicked: {message}", self.name),
            None => write!(f, "the {} task ended before the shutdown", self.name),
        }
    }
}

impl Tasks {
    pub fn spawn<F>(&mut self, name: &'static str, task: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let handle = self.set.spawn(task);
        self.names.insert(handle.id(), name);
    }

    /// Waits for the next task to end; pending for ever when none runs.
    pub async fn ended(&mut self) -> Ended {
        match self.set.join_next_with_id().await {
            Some(result) => self.describe(result),
            None => std::future::pending().await,
        }
    }

    /// Waits for every task to end (after the shutdown), and returns the first that panicked.
    pub async fn join(mut self) -> Result<(), Ended> {
        let mut first = None;
        while let Some(result) = self.set.join_next_with_id().await {
            let ended = self.describe(result);
            if ended.panic.is_some() && first.is_none() {
                first = Some(ended);
            }
        }
        first.map_or(Ok(()), Err)
    }

    fn describe(&self, result: Result<(Id, ()), JoinError>) -> Ended {
        let (id, panic) = match result {
            Ok((id, ())) => (id, None),
            Err(e) => {
                let id = e.id();
                let message = match e.try_into_panic() {
                    Ok(payload) => payload
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| payload.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "(no message)".into()),
                    Err(e) => e.to_string(),
                };
                (id, Some(message))
            }
        };
        Ended {
            name: self.names.get(&id).copied().unwrap_or("unnamed"),
            panic,
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio_util::sync::CancellationToken;

    use super::*;

    #[tokio::test]
    async fn a_task_that_panics_is_told_by_name_at_once() {
        let mut tasks = Tasks::default();
        let stop = CancellationToken::new();
        let s = stop.clone();
        tasks.spawn("reaper", async move { s.cancelled().await });
        tasks.spawn("consumer", async { panic!("a bug") });
        let ended = tasks.ended().await;
        assert_eq!(ended.to_string(), "the consumer task panicked: a bug");
        // The others stop with the shutdown, and end well.
        stop.cancel();
        assert_eq!(tasks.join().await, Ok(()));
    }

    #[tokio::test]
    async fn the_join_reports_a_panic_during_the_stop() {
        let mut tasks = Tasks::default();
        tasks.spawn("consumer", async {});
        tasks.spawn("reaper", async {
            tokio::task::yield_now().await;
            panic!("{}", String::from("in the drain"))
        });
        let err = tasks.join().await.unwrap_err();
        assert_eq!(err.to_string(), "the reaper task panicked: in the drain");
    }

    #[tokio::test]
    async fn a_task_that_returns_early_is_told_too() {
        let mut tasks = Tasks::default();
        tasks.spawn("consumer", async {});
        assert_eq!(
            tasks.ended().await.to_string(),
            "the consumer task ended before the shutdown"
        );
    }
}
