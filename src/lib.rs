//! myjob: a MySQL/MariaDB-backed job worker. `main.rs` only calls [`cli::main`]; tests drive
//! the same code through the binary or through [`daemon::run`].
//!
//! - [`daemon`]: `myjob run`, which starts an instance's four tasks (the consumer, the reaper,
//!   the stager and the scheduler), reports to systemd, reloads, and stops them in order;
//! - [`worker`]: the consumer and its parts, and how a handler runs;
//! - [`reaper`]: puts back the claims of dead workers, and deletes finished jobs past their
//!   retention;
//! - [`stager`]: moves scheduled jobs that came due to where claims find them, and admits
//!   blocked jobs into their concurrency keys' slots (its gate);
//! - [`scheduler`]: enqueues the ticks of the config's `[[schedule]]`s, each once;
//! - [`store`]: every SQL statement, one file per table (`jobs` one per caller);
//! - [`db`]: connections and what a server's errors mean;
//! - [`config`]: the file, one section per file, checked into typed settings;
//! - [`cli`]: the commands; [`metrics`] and [`logging`]: what an instance tells the operator;
//!   [`error`]: exit codes.

pub mod cli;
pub mod config;
pub mod daemon;
pub mod db;
pub mod error;
pub mod logging;
pub mod metrics;
pub mod reaper;
pub mod scheduler;
pub mod stager;
pub mod store;
pub mod worker;
