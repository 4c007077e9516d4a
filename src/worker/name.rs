//! Which worker claimed a job: `host:pid:instance`, written into every claimed row's `worker`.
//!
//! The host part names the machine: its hostname, and where the machine has one, the start
//! of its `/etc/machine-id`. Containers and cloned VMs often share a hostname (`localhost`,
//! an image's default), and the reaper's start-up pass trusts "same host, same instance" to
//! mean "the run of this instance before me", whose claims it puts back at once (see
//! `reaper`); two machines must not both be that.

use std::fmt;

/// A worker's name as written into `worker`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerName {
    pub host: String,
    pub pid: u32,
    pub instance: String,
}

impl WorkerName {
    /// This process, as instance `instance`.
    pub fn this_process(instance: &str) -> WorkerName {
        let hostname = nix::unistd::gethostname()
            .map(|h| h.to_string_lossy().into_owned())
            .unwrap_or_else(|_| "localhost".into());
        let machine = std::fs::read_to_string("/etc/machine-id").unwrap_or_default();
        WorkerName {
            host: host_name(&hostname, &machine),
            pid: std::process::id(),
            instance: instance.to_owned(),
        }
    }

    /// Reads what Display wrote. The instance name and the pid contain no `:`.
    pub fn parse(s: &str) -> Option<WorkerName> {
        let mut parts = s.rsplitn(3, ':');
        let instance = parts.next()?.to_owned();
        let pid = parts.next()?.parse().ok()?;
        let host = parts.next()?.to_owned();
        Some(WorkerName {
            host,
            pid,
            instance,
        })
    }

    /// Whether `self` is an earlier run of the instance `me`: the same instance on the same
    /// machine, in another process.
    pub fn came_before(&self, me: &WorkerName) -> bool {
        self.host == me.host && self.instance == me.instance && self.pid != me.pid
    }
}

/// `hostname/<first 12 hex digits of the machine id>`, or the hostname alone when there is no
/// machine id (an empty or missing file, as in some container images).
fn host_name(hostname: &str, machine_id: &str) -> String {
    let id: String = machine_id.trim().chars().take(12).collect();
    match id.is_empty() {
        true => hostname.to_owned(),
        false => format!("{hostname}/{id}"),
    }
}

impl fmt::Display for WorkerName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.host, self.pid, self.instance)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_tell_an_earlier_run() {
        let me = WorkerName {
            host: host_name("app1", "3d1219c7c4c5404aaa1f6d2a48adfda4\n"),
            pid: 812,
            instance: "1".into(),
        };
        assert_eq!(me.to_string(), "app1/3d1219c7c4c5:812:1");
        assert_eq!(WorkerName::parse(&me.to_string()), Some(me.clone()));
        let before = WorkerName {
            pid: 700,
            ..me.clone()
        };
        assert!(before.came_before(&me));
        assert!(!me.came_before(&me), "not itself");
        let other_instance = WorkerName {
            instance: "2".into(),
            ..before.clone()
        };
        assert!(!other_instance.came_before(&me));
        // Another machine with the same hostname (a container image's default).
        let twin = WorkerName {
            host: host_name("app1", "99aa"),
            ..before
        };
        assert!(!twin.came_before(&me));
        assert_eq!(host_name("h", ""), "h");
        assert_eq!(WorkerName::parse("no-pid"), None);
        assert_eq!(WorkerName::parse("h:x:1"), None);
    }
}
