//! HAProxy in TCP mode in front of a primary and its replica, as users run it for a failover:
//! connections go to the first server until [`HaProxy::switch`] sends new ones to the second
//! and closes those left on the first. A real `haproxy` (Debian's), run in the foreground with
//! a config and an admin socket of its own.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct HaProxy {
    pub port: u16,
    child: Child,
    socket: PathBuf,
    _dir: tempfile::TempDir,
}

impl HaProxy {
    /// HAProxy on a free port of 127.0.0.1, sending connections to the server of `primary`,
    /// with the server of `replica` in maintenance until [`HaProxy::switch`].
    pub fn start(primary: &str, replica: &str) -> HaProxy {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("admin.sock");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr = |url: &str| {
            let opts = mysql_async::Opts::from_url(url).unwrap();
            format!("{}:{}", opts.ip_or_hostname(), opts.tcp_port())
        };
        // Idle timeouts of an hour: the sessions are myjob's to keep alive, as in production.
        let config = format!(
            "global\n    stats socket {socket} mode 600 level admin\n\n\
             defaults\n    mode tcp\n    timeout connect 2s\n    timeout client 1h\n    timeout server 1h\n\n\
             frontend db\n    bind 127.0.0.1:{port}\n    default_backend servers\n\n\
             backend servers\n    server db1 {primary}\n    server db2 {replica} disabled\n",
            socket = socket.display(),
            primary = addr(primary),
            replica = addr(replica),
        );
        let cfg = dir.path().join("haproxy.cfg");
        std::fs::write(&cfg, config).unwrap();
        let child = Command::new("haproxy")
            .args(["-db", "-f", cfg.to_str().unwrap()])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("haproxy.log")).unwrap())
            .spawn()
            .expect("haproxy (tests/run installs it)");
        let proxy = HaProxy {
            port,
            child,
            socket,
            _dir: dir,
        };
        let start = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() || !proxy.socket.exists() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "haproxy did not start"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        proxy
    }

    /// `url` with its host and port replaced by HAProxy's.
    pub fn url(&self, url: &str) -> String {
        let (scheme_and_account, rest) = url.split_once('@').unwrap();
        let tail = rest.find(['/', '?']).map_or("", |i| &rest[i..]);
        format!("{scheme_and_account}@127.0.0.1:{}{tail}", self.port)
    }

    /// The failover of the proxy: the first server out, the second in, the sessions left on
    /// the first closed.
    pub fn switch(&self) {
        self.switcher().switch();
    }

    /// What [`HaProxy::switch`] needs, to move into a task of its own.
    pub fn switcher(&self) -> Switcher {
        Switcher(self.socket.clone())
    }
}

/// HAProxy's admin socket.
pub struct Switcher(PathBuf);

impl Switcher {
    /// See [`HaProxy::switch`].
    pub fn switch(&self) {
        self.admin("disable server servers/db1");
        self.admin("enable server servers/db2");
        self.admin("shutdown sessions server servers/db1");
    }

    /// One command on the admin socket; returns its answer.
    fn admin(&self, command: &str) -> String {
        let mut s = UnixStream::connect(&self.0).unwrap();
        s.write_all(format!("{command}\n").as_bytes()).unwrap();
        let mut answer = String::new();
        s.read_to_string(&mut answer).unwrap();
        assert!(
            !answer.contains("Unknown") && !answer.contains("No such"),
            "haproxy: {command}: {answer}"
        );
        answer
    }
}

impl Drop for HaProxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
