//! myjob: a MySQL/MariaDB-backed job worker. `main.rs` only calls [`cli::main`]; tests drive
//! the same code through the binary or through [`daemon::run`].

pub mod claim;
pub mod cli;
pub mod config;
pub mod daemon;
pub mod db;
pub mod enqueue;
pub mod error;
pub mod handler;
pub mod jobs;
pub mod logging;
pub mod notify;
pub mod reaper;
pub mod retry;
pub mod schema;
pub mod servers;
pub mod stats;
