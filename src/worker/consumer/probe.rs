//! The probe: which served queues have pending jobs, which are paused, and whether a suspect
//! or a blocked job waits; one statement at each poll, so an idle instance's cost does not
//! grow with its queues.

use super::*;

/// While the account may not read the paused queues, the probe asks again once in this many.
const PAUSES_RETRY: u32 = 20;

/// Whether the probe reads which queues are paused: an account without SELECT on
/// `myjob_queues` (GRANTs from before the table existed) is told once, and asked again only
/// every [`PAUSES_RETRY`] probes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) enum PauseReads {
    #[default]
    Allowed,
    /// Refused; `probes` since.
    Denied { probes: u32 },
}

impl PauseReads {
    /// Whether this probe asks for the paused queues.
    fn ask(&mut self) -> bool {
        match self {
            PauseReads::Allowed => true,
            PauseReads::Denied { probes } => {
                *probes += 1;
                *probes % PAUSES_RETRY == 0
            }
        }
    }

    /// The read was refused; true the first time, when it is to be said.
    fn denied(&mut self) -> bool {
        let first = *self == PauseReads::Allowed;
        if first {
            *self = PauseReads::Denied { probes: 0 };
        }
        first
    }
}

impl Consumer {
    /// Asks which served queues have pending jobs, and which queues are paused (one statement
    /// for all of them), and makes the busy ones that are not paused the ones claims go to.
    /// On an error the claims wait for the next poll, and the last paused list stands. An
    /// account without SELECT on `myjob_queues` (GRANTs from before the table existed) gets
    /// one error line and goes on claiming every queue: the jobs run, though pauses go unseen.
    pub(super) async fn probe(&mut self, settings: &Settings) {
        self.busy.clear();
        let quarantine_free = self.quarantine_free();
        let limit = self.link.limit();
        let Some(conn) = self.link.conn() else {
            return;
        };
        let served: Vec<&str> = settings.queues.iter().map(|q| q.name.as_str()).collect();
        // Suspects only for a free quarantine slot, and of the queues not known paused.
        let suspects: Vec<&str> = match quarantine_free {
            true => served
                .iter()
                .copied()
                .filter(|q| !self.paused.iter().any(|p| p == q))
                .collect(),
            false => Vec::new(),
        };
        let pauses = self.pause_reads.ask();
        let mut found = self
            .metrics
            .within(
                Op::Probe,
                limit,
                jobs::probe(conn, &served, pauses, &suspects),
            )
            .await;
        if let Err(e) = &found {
            if db::classify(e) == Failure::Denied {
                if self.pause_reads.denied() {
                    error!("consumer: {}; claiming every queue, paused or not (GRANT SELECT ON the database's myjob_queues to this account)", chain(&**e));
                }
                self.paused.clear();
                found = self
                    .metrics
                    .within(
                        Op::Probe,
                        limit,
                        jobs::probe(conn, &served, false, &suspects),
                    )
                    .await;
            }
        }
        match found {
            Ok(probe) => {
                self.link.succeeded();
                if let Some(paused) = probe.paused {
                    self.pause_reads = PauseReads::Allowed;
                    if paused != self.paused {
                        info!(paused = ?paused, "paused queues changed");
                        self.paused = paused;
                    }
                }
                let paused = &self.paused;
                let rate_wait = &self.rate_wait;
                self.busy = probe.busy;
                self.busy.retain(|q| {
                    !paused.contains(q) && !rate_wait.iter().any(|(held, _)| held == q)
                });
                self.quarantine
                    .seen(probe.suspects.filter(|q| !paused.contains(q)));
                if probe.blocked {
                    self.wakes.blocked.notify_one();
                }
            }
            Err(e) => self.db_error(e).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{PauseReads, PAUSES_RETRY};

    #[test]
    fn refused_pause_reads_are_said_once_and_asked_again_now_and_then() {
        let mut reads = PauseReads::default();
        assert!(reads.ask());
        assert!(reads.denied(), "said the first time");
        assert!(!reads.denied(), "and not again");
        let asked = (0..PAUSES_RETRY * 3).filter(|_| reads.ask()).count();
        assert_eq!(asked, 3);
    }
}
