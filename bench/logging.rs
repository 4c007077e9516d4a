//! Item 16: what the log costs. The no-op handler's rate at the default filter (`info`: a
//! line at each job's start and one at its end, written to a file as outside systemd)
//! against `MYJOB_LOG=warn` (neither), in turns as item 15 runs them.

use crate::harness::{mark, median, Bench};

impl Bench {
    pub(crate) async fn logging_item(&mut self) {
        let (pairs, jobs) = self.turns();
        let (mut info, mut warn, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
        for pair in 1..=pairs {
            // The order swapped at each pair, for the reason item 15 gives.
            let mut filters = ["warn", "info"];
            if pair % 2 == 0 {
                filters.reverse();
            }
            let mut rates = [0.0; 2];
            for filter in filters {
                let at = usize::from(filter == "info");
                rates[at] = self.noop_run(jobs, false, filter).await.0;
            }
            let [quiet, logged] = rates;
            eprintln!(
                "log pair {pair}: warn {quiet:.0} jobs/s, info {logged:.0} jobs/s = {:.3}",
                logged / quiet
            );
            warn.push(quiet);
            info.push(logged);
            ratios.push(logged / quiet);
        }
        let ratio = median(ratios);
        self.line(&format!(
            "| no-op handler, 1 instance × 8, log at `info` (2 lines per job, to a file), jobs/s | {:.0} | {ratio:.3} of `MYJOB_LOG=warn` ({:.0}), median of {pairs} pairs | ≥ 0.95 {} |",
            median(info),
            median(warn),
            mark(ratio >= 0.95)
        ));
    }
}
