//! The stager: moves due `scheduled` jobs to `pending`, where claims find them, and a
//! `pending` job whose run_at an UPDATE moved later back to `scheduled` (see
//! [`jobs::stage`]). Every `poll_interval`, on a connection of its own.
//!
//! Why a task of its own: staging a large batch that comes due at once (a campaign
//! scheduled for 09:00) takes a while, and on the claim's connection it held the claims up
//! for as long. Why one stager per server: they would all find the same rows, lock them in
//! turn and repeat each other's work; a named lock, held for as long as the connection
//! lives, lets one instance stage for every instance, and the others try to take it over
//! every few polls, so a dead holder is replaced within seconds.
//!
//! A holder that is alive to the server but does nothing (a frozen process, a host cut off
//! without a FIN, whose connection the server lists for hours) keeps the lock. So each try to
//! take it over also stages, without the lock, the jobs due for longer than [`OVERDUE`]: a
//! working holder leaves none, and each move is fenced by the row's own status and run_at.
//!
//! The same task runs the gate (see [`gate`]), lock or not: each instance admits the
//! blocked jobs of the queues it serves, with their `key_limit`. It runs at once when the
//! consumer's probe saw blocked jobs in those queues, and every few polls besides (a busy
//! consumer does not probe), so that an idle instance pays no statement of its own for it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::config::{DatabaseSettings, Settings};
use crate::db::{self, Failed, NamedLock, ServerId, Session};

use crate::metrics::{Metrics, Op};
use crate::store::jobs::{self, keys};

pub mod gate;

use gate::{Gate, Wakes};

/// The stager lock: one stager acts at a time across all instances on the server.
const LOCK: &str = "myjob_stager";
/// A stager without the lock tries to take it over once per this many polls.
const STANDBY_POLLS: u32 = 4;
/// A job due for longer than this has been left by the stager that holds the lock.
const OVERDUE: Duration = Duration::from_secs(5);
/// How many reads a queue a pass of the gate woken by the consumer makes: enough for the
/// keys that just came (up to 256 a read), not a sweep of long lines.
const WOKEN_READS: usize = 4;
/// The shortest session `wait_timeout` the stager's connection gets.
const MIN_WAIT_TIMEOUT: Duration = Duration::from_secs(60);

pub struct Stager {
    settings: watch::Receiver<Arc<Settings>>,
    /// The connection, and this instance's part among those on the server while it lasts.
    session: Session<Role>,
    /// Admits blocked jobs, at every poll.
    gate: Gate,
    /// Shared with the consumer: told when the gate admitted jobs, and woken when the
    /// consumer's probe saw blocked ones.
    wakes: Arc<Wakes>,
    /// Polls since the gate last ran.
    gate_polls: u32,
    /// Passes timed.
    metrics: Arc<Metrics>,
}

/// The stager's part among the instances on the server, for as long as its connection lives.
enum Role {
    /// Another instance holds the stager lock: tries to take it over once per
    /// [`STANDBY_POLLS`] polls, `polls` counting since the last try.
    Standby { polls: u32 },
    /// Staging for every instance on the server: this connection holds the lock, or the
    /// server has no lock functions and every stager acts.
    Lead,
}

impl Role {
    /// A new connection's, which tries to take the lock at its first pass.
    fn connected() -> Role {
        Role::Standby {
            polls: STANDBY_POLLS,
        }
    }
}

/// What a pass did, and so when the next is due.
#[derive(Debug, PartialEq, Eq)]
enum Pass {
    /// Another instance stages: try to take over later.
    Standby,
    /// Staged; `more` when it stopped at its bound with rows left.
    Staged { more: bool },
}

impl Stager {
    pub fn new(
        db: DatabaseSettings,
        settings: watch::Receiver<Arc<Settings>>,
        metrics: Arc<Metrics>,
        wakes: Arc<Wakes>,
    ) -> Self {
        Stager {
            wakes,
            gate_polls: 0,
            metrics,
            settings,
            session: Session::new("stager", db),
            gate: Gate::default(),
        }
    }

    /// Stages until `shutdown` fires. An error is logged and the next pass comes after the
    /// usual wait; a broken connection is replaced (and the lock taken again) at that pass.
    pub async fn run(mut self, shutdown: CancellationToken) {
        // The next full pass: staging, and the gate every few polls. A wake by the consumer
        // runs the gate alone in between and never moves it, so that staging and the lock's
        // takeover keep their pace however often the consumer wakes the gate.
        let mut next_pass = tokio::time::Instant::now();
        // No gate on a wake before then: one that admitted nothing is woken at most as often
        // as it runs anyway.
        let mut gate_after = tokio::time::Instant::now();
        loop {
            let woken = tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep_until(next_pass) => false,
                _ = self.wakes.blocked.notified() => true,
            };
            let poll = self.settings.borrow().worker.poll_interval;
            let now = tokio::time::Instant::now();
            if woken {
                // Without a connection, the next full pass connects first.
                if !self.session.is_open() || now < gate_after {
                    continue;
                }
                let t = Instant::now();
                let gated = self.gate(WOKEN_READS).await;
                self.metrics
                    .statement(Op::Gate, t.elapsed(), gated.as_ref().err());
                gate_after = match gated {
                    Ok(0) => now + poll * STANDBY_POLLS,
                    Ok(_) => now + poll,
                    Err(e) => {
                        self.session.failed(&e, "the next poll").await;
                        now + poll
                    }
                };
                continue;
            }
            let t = Instant::now();
            let pass = self.pass().await;
            self.metrics
                .statement(Op::Stage, t.elapsed(), pass.as_ref().err());
            if pass.is_ok() {
                self.session.succeeded();
            }
            let wait = match pass {
                Ok(Pass::Staged { more: true }) => Duration::ZERO,
                Ok(Pass::Staged { more: false } | Pass::Standby) => poll,
                // A read-only server is asked again after a growing pause, not every poll.
                Err(e) => match self.session.failed(&e, "the next poll").await {
                    Failed::ReadOnly => self.session.backoff().max(poll),
                    Failed::Kept | Failed::Dropped => poll,
                },
            };
            next_pass = tokio::time::Instant::now() + wait;
        }
        self.session.close().await;
    }

    async fn pass(&mut self) -> anyhow::Result<Pass> {
        // The stager lock lives as long as this connection: a host gone without a reset must
        // not keep it for the server's default of 8 hours. A pass comes at least every few
        // polls, so this never closes a live one.
        let poll = self.settings.borrow().worker.poll_interval;
        let idle = (poll * STANDBY_POLLS * 3).max(MIN_WAIT_TIMEOUT);
        let gate = &mut self.gate;
        self.session
            .open(idle, async |conn| {
                let server = ServerId::of(conn).await?;
                gate.connected(keys::Referee::of(&server));
                Ok(Role::connected())
            })
            .await?;
        let pass = self.stage().await?;
        self.gate_polls += 1;
        if self.gate_polls >= STANDBY_POLLS {
            self.gate(gate::READS_PER_PASS).await?;
        }
        Ok(pass)
    }

    /// A pass of the gate of at most `reads` reads a queue, on this connection (none before
    /// the first pass connects); returns how many jobs it admitted.
    async fn gate(&mut self, reads: usize) -> anyhow::Result<u64> {
        self.gate_polls = 0;
        let settings = self.settings.borrow().clone();
        let Some((conn, _)) = self.session.get() else {
            return Ok(0);
        };
        let admitted = self.gate.pass(conn, &settings, reads).await?;
        if admitted > 0 {
            self.wakes.admitted.notify_one();
            self.session.wrote();
            debug!(
                jobs = admitted,
                "gate: blocked jobs admitted into free slots of their keys"
            );
        }
        Ok(admitted)
    }

    /// Stages, when this instance holds the stager lock; without it, tries to take it over
    /// once per [`STANDBY_POLLS`] polls.
    async fn stage(&mut self) -> anyhow::Result<Pass> {
        let Some((conn, role)) = self.session.get() else {
            return Ok(Pass::Standby);
        };
        if let Role::Standby { polls } = role {
            *polls += 1;
            if *polls < STANDBY_POLLS {
                return Ok(Pass::Standby);
            }
            *polls = 0;
            // Held until the connection ends: no release, no take again at each pass.
            match db::try_lock(conn, LOCK).await? {
                NamedLock::Held => {
                    info!("stager: this instance stages scheduled jobs for every instance on the server");
                    *role = Role::Lead;
                }
                // Every stager acts: each move is fenced by the row's own status and run_at.
                NamedLock::Unsupported => *role = Role::Lead,
                NamedLock::Busy => {
                    let staged = jobs::stage(conn, OVERDUE).await?;
                    if staged.moved > 0 {
                        warn!(
                            jobs = staged.moved,
                            "stager: the instance that holds the stager lock left jobs due for over {}s; staged them here",
                            OVERDUE.as_secs()
                        );
                    }
                    return Ok(Pass::Standby);
                }
            }
        }
        let staged = jobs::stage(conn, Duration::ZERO).await?;
        if staged.moved > 0 {
            self.session.wrote();
            debug!(
                jobs = staged.moved,
                "stager: jobs moved between scheduled and pending"
            );
        }
        Ok(Pass::Staged { more: staged.more })
    }
}
