//! The two ids a claimed job is known by, as types of their own: a job id can never be bound
//! where a batch id belongs, nor the other way round, and neither is a bare number in a
//! signature.

use std::fmt;

use mysql_async::Value;
use serde::Serialize;

/// A job: `myjob_jobs.id`. A number in JSON (`myjob list --json`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct JobId(u64);

/// A claim: `myjob_jobs.batch_id`, stamped on every job one claim takes, and what every later
/// write about them is fenced by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BatchId(u64);

impl JobId {
    pub const fn new(id: u64) -> JobId {
        JobId(id)
    }

    /// The number, for a log field or a test.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl BatchId {
    /// A fresh batch id: random, so claimers on different hosts need no coordination, and
    /// never 0 so it cannot be mistaken for a missing one.
    pub fn random() -> BatchId {
        loop {
            let id = rand::random::<u64>();
            if id != 0 {
                return BatchId(id);
            }
        }
    }

    /// A batch id read from a row.
    pub const fn new(id: u64) -> BatchId {
        BatchId(id)
    }

    /// The number, for a log field, a handler's header or a test.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl fmt::Display for BatchId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl From<JobId> for Value {
    fn from(id: JobId) -> Value {
        Value::from(id.0)
    }
}

impl From<BatchId> for Value {
    fn from(id: BatchId) -> Value {
        Value::from(id.0)
    }
}
