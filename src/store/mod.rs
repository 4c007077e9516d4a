//! Every SQL statement myjob sends, one file per table. Values are always bound as
//! parameters, and each statement says which index serves it.

pub mod jobs;
pub mod lanes;
pub mod locks;
pub mod queues;
pub mod schedules;
pub mod schema;
pub mod servers;
