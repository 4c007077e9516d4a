//! Hosts for the fault harness: each a network namespace of its own (`myjob-hN`), joined to
//! this machine's root namespace by a veth pair on 10.213.N.0/24, with a hostname and a
//! machine id of its own, so that instances on it are another machine's to myjob. Nothing
//! routes between hosts, or from a host anywhere else: a host reaches the servers through a
//! relay on its gateway (10.213.N.1), which the root namespace runs.
//!
//! Cutting a host sets the root side of its link down: its packets are dropped both ways,
//! and nothing is reset or closed on either side, as when a switch fails, a partition
//! happens, or a host loses power. The server hears nothing more from the host's
//! connections (the relay's, on its side); the host's instances get no answer.
//!
//! Needs root, `ip` (iproute2) and `unshare` (util-linux).

use std::net::IpAddr;
use std::path::PathBuf;
use std::process::Command;

use super::proxy::Proxy;

pub struct Host {
    /// The namespace, `myjob-hN`.
    pub ns: String,
    pub hostname: String,
    n: u8,
    /// The root side of the veth pair, `myjobhN`.
    link: String,
    /// One relay per server the host reaches, on its gateway.
    relays: Vec<Proxy>,
}

/// The block of host numbers of the server under test: the suite runs the servers' stages
/// side by side, and each needs namespaces, links and addresses of its own.
fn block() -> u8 {
    let server = std::env::var("MYJOB_TEST_SERVER_NAME").unwrap_or_default();
    match server.as_str() {
        "mariadb11" => 1,
        "mysql" => 2,
        "galera" => 3,
        "replicas" => 4,
        _ => 0,
    }
}

impl Host {
    /// Makes host `n` (1 to 49) afresh, named `hostname`: host `n` of the server's block of
    /// 50 (see [`block`]), so that the suites of two servers run side by side.
    pub fn new(n: u8, hostname: &str) -> Host {
        assert!((1..50).contains(&n), "host {n}: 1 to 49");
        let n = n + 50 * block();
        let ns = format!("myjob-h{n}");
        let link = format!("myjobh{n}");
        // What an earlier run that was killed left behind.
        let _ = Command::new("ip").args(["netns", "del", &ns]).output();
        let _ = Command::new("ip").args(["link", "del", &link]).output();
        let gateway = format!("10.213.{n}.1/24");
        let address = format!("10.213.{n}.2/24");
        ip(&["netns", "add", &ns]);
        ip(&[
            "link", "add", &link, "type", "veth", "peer", "name", "eth0", "netns", &ns,
        ]);
        ip(&["addr", "add", &gateway, "dev", &link]);
        ip(&["link", "set", &link, "up"]);
        ip(&["-n", &ns, "addr", "add", &address, "dev", "eth0"]);
        ip(&["-n", &ns, "link", "set", "eth0", "up"]);
        ip(&["-n", &ns, "link", "set", "lo", "up"]);
        // `ip netns exec` binds each file of /etc/netns/NS over its namesake in /etc.
        let etc = Self::etc(&ns);
        std::fs::create_dir_all(&etc).unwrap();
        let machine_id = format!(
            "{:016x}{:016x}\n",
            rand::random::<u64>(),
            rand::random::<u64>()
        );
        std::fs::write(etc.join("machine-id"), machine_id).unwrap();
        Host {
            ns,
            hostname: hostname.to_owned(),
            n,
            link,
            relays: Vec::new(),
        }
    }

    /// Host `n`, reaching the server of `url` (see [`Host::reach`]); returns the host and the
    /// url to use on it.
    pub async fn reaching(n: u8, hostname: &str, url: &str) -> (Host, String) {
        let mut host = Host::new(n, hostname);
        let url = host.reach(url).await;
        (host, url)
    }

    /// The root namespace's address on the host's link.
    pub fn gateway(&self) -> IpAddr {
        format!("10.213.{}.1", self.n).parse().unwrap()
    }

    /// Starts a relay on the gateway to the server of `url` and returns `url` as the host
    /// reaches it: through the relay, with the same account, database and options.
    pub async fn reach(&mut self, url: &str) -> String {
        let relay = Proxy::between(self.gateway(), url);
        relay.up().await;
        let (scheme_and_account, rest) = url.split_once('@').unwrap();
        let tail = rest.find(['/', '?']).map_or("", |i| &rest[i..]);
        let reached = format!(
            "{scheme_and_account}@{}:{}{tail}",
            self.gateway(),
            relay.port
        );
        self.relays.push(relay);
        reached
    }

    /// A command that runs `program` on the host: in its namespace, with its hostname and
    /// machine id.
    pub fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.ns, "unshare", "--uts", "sh", "-c"])
            .arg(r#"hostname "$0" && exec "$@""#)
            .arg(&self.hostname)
            .arg(program);
        cmd
    }

    /// Drops every packet to and from the host, closing nothing.
    pub fn cut(&self) {
        ip(&["link", "set", &self.link, "down"]);
    }

    /// Lets the host's packets through again.
    pub fn heal(&self) {
        ip(&["link", "set", &self.link, "up"]);
    }

    fn etc(ns: &str) -> PathBuf {
        PathBuf::from("/etc/netns").join(ns)
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        // The veth pair goes with the namespace.
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).output();
        let _ = Command::new("ip")
            .args(["link", "del", &self.link])
            .output();
        let _ = std::fs::remove_dir_all(Self::etc(&self.ns));
    }
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}
