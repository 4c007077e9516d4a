//! The integration tests, one binary: each file of `tests/` is a module of it, named after
//! the file (`claim::…` for `tests/claim.rs`), so the crate is linked once. `tests/run` runs
//! the modules of a server's stage a few at a time, each through a filter of its own
//! (`claim::`), as separate processes; `cargo test --test it claim::` runs one by hand.

mod common;

mod certification;
mod chaos;
mod claim;
mod cli;
mod config_props;
mod db_errors;
mod db_faults;
mod docs;
mod exactly_once;
mod examples;
mod failover;
mod flow;
mod galera;
mod guard;
mod helpers;
mod hostile;
mod hostile_rows;
mod hosts;
mod lock;
mod logs;
mod metrics;
mod metrics_port;
mod operate;
mod persistent;
mod privileges;
mod prometheus;
mod queues;
mod read_only;
mod reaper;
mod schedules;
mod scheduling;
mod secrets;
mod servers;
mod worker;
