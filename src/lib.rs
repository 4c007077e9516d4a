//! myjob: a MySQL/MariaDB-backed job worker. `main.rs` only calls [`cli::main`]; tests drive
//! the same code through the binary or through [`daemon::run`].
//!
//! - [`worker`]: the consumer and its parts, and how a handler runs;
//! - [`reaper`]: puts back the claims of dead workers, and deletes finished jobs past their
//!   retention ([`purge`]);
//! - [`stager`]: moves scheduled jobs that came due to where claims find them;
//! - [`scheduler`]: enqueues the ticks of the config's `[[schedule]]`s, each once;
//! - [`store`]: every SQL statement, one file per table;
//! - [`daemon`]: `myjob run`, which starts the consumer, the reaper, the stager and the
//!   scheduler as [`tasks`] and stops them in order.

pub mod cli;
pub mod config;
pub mod daemon;
pub mod db;
pub mod enqueue;
pub mod error;
pub mod fds;
pub mod gate;
pub mod logging;
pub mod metrics;
pub mod notify;
pub mod purge;
pub mod reaper;
pub mod schedule;
pub mod scheduler;
pub mod stager;
pub mod stats;
pub mod store;
pub mod tasks;
pub mod worker;
