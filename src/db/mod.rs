//! Database connections: opening a dedicated connection, reconnecting with backoff, and
//! telling which server (and which start of it) a connection id belongs to.
//!
//! myjob never uses a pool for claims: a claimer's `CONNECTION_ID()` is how the reaper knows
//! the claimer is alive, so the connection must live exactly as long as the claimer does.
//!
//! - `connect`: a connection and its session settings, and the backoff between attempts;
//! - `failure`: what a failed statement says of its connection and of the server;
//! - `identity`: which server, and which start of it, a connection belongs to;
//! - `session`: the connection of a background task (the reaper, the stager, the scheduler);
//! - `causal`: Galera's causal reads; `named_lock`: `GET_LOCK`.

mod causal;
mod connect;
mod failure;
mod identity;
mod named_lock;
mod session;

pub use causal::{causal, causal_off, Causal};
pub use connect::{
    check_not_proxied, connect, connect_retrying, set_wait_timeout, within, Backoff, ConnectError,
    ConnectFailure,
};

pub use failure::{classify, describe, is_read_only, Failure, Race, ReadOnly, Refusal};

pub use identity::ServerId;
pub use named_lock::{release_lock, try_lock, NamedLock};
pub use session::{Failed, Session};
