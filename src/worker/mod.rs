//! The worker side of an instance: the [`Consumer`] and the parts it is made of, and how one
//! handler runs and what its exit means.

mod consumer;
pub mod guard;
pub mod handler;
mod handoff;
mod lanes;
mod link;
pub mod name;
mod outbox;
mod output;
mod pool;
mod prefetch;
mod process;
mod protocol;
mod rate;
pub mod retry;
mod slots;

pub use consumer::Consumer;
/// How often an instance reads the lanes again: a test waits this long for every instance to
/// have read a change of them.
pub use lanes::REFRESH as LANES_REFRESH;
pub use link::session_wait_timeout;
