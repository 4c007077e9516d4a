//! The worker side of an instance: the [`Consumer`] and the parts it is made of
//! ([`consumer`]), how one handler runs and what its exit means ([`handler`]), and the
//! [`guard`] that kills the handlers when the worker dies without stopping them.

pub mod consumer;
pub mod guard;
pub mod handler;
pub mod name;

/// How often an instance reads the lanes again: a test waits this long for every instance to
/// have read a change of them.
pub use consumer::lanes::REFRESH as LANES_REFRESH;
pub use consumer::link::session_wait_timeout;
pub use consumer::Consumer;
