//! Shared test helpers: a database of its own per test on the real MariaDB, the real `myjob`
//! binary as a child process, and one handler script whose behaviour the payload picks.
#![allow(dead_code)]

pub mod haproxy;
pub mod hosts;
pub mod proxy;
pub mod replicas;
pub mod scrape;
pub mod ticks;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use mysql_async::prelude::*;
use mysql_async::{Conn, Opts};

/// The server the tests use; `MYJOB_TEST_SERVER` overrides it, and [`failed_over_to`] that.
pub fn server_url() -> String {
    if let Some(url) = FAILED_OVER.lock().unwrap().clone() {
        return url;
    }
    std::env::var("MYJOB_TEST_SERVER").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306".into())
}

/// The server a test failed over to, once it has.
static FAILED_OVER: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);

/// From now on the tests' own connections (see [`server_url`], [`TestDb::conn`]) go to the
/// server of `url`: the replica a test promoted.
pub fn failed_over_to(url: &str) {
    *FAILED_OVER.lock().unwrap() = Some(url.to_owned());
}

/// The servers of a multi-primary cluster under test, one url per node (`MYJOB_TEST_NODES`,
/// space-separated, the first one `MYJOB_TEST_SERVER`'s); a single server otherwise.
pub fn nodes() -> Vec<String> {
    match std::env::var("MYJOB_TEST_NODES") {
        Ok(urls) if !urls.trim().is_empty() => urls.split_whitespace().map(str::to_owned).collect(),
        _ => vec![server_url()],
    }
}

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_myjob")
}

/// On a Galera cluster ([`nodes`]), waits up to `secs` until every node is Synced in the
/// primary component with nothing queued to apply. A test before may have left a node
/// applying a large write set (the lagging node of `tests/galera.rs` gets 200,000 rows at
/// once), and a schema change then failed through a node out of the primary component for a
/// moment ("not connected to Primary Component"), or waited past its lock timeout (1205).
/// Past `secs` it says so and goes on: the test's own statements then fail as they will.
pub async fn cluster_settled(secs: u64) {
    let nodes = nodes();
    if nodes.len() < 2 {
        return;
    }
    let start = Instant::now();
    for url in &nodes {
        while !node_settled(url).await {
            if start.elapsed() > Duration::from_secs(secs) {
                eprintln!("the Galera node {url} did not settle within {secs} s");
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Whether the node of `url` is Synced, in the primary component, with an empty receive queue.
async fn node_settled(url: &str) -> bool {
    let Ok(opts) = Opts::from_url(url) else {
        return false;
    };
    let Ok(mut conn) = Conn::new(opts).await else {
        return false;
    };
    let status: Vec<(String, String)> = conn
        .query(
            "SHOW GLOBAL STATUS WHERE Variable_name IN \
             ('wsrep_cluster_status', 'wsrep_local_state_comment', 'wsrep_local_recv_queue')",
        )
        .await
        .unwrap_or_default();
    let _ = conn.disconnect().await;
    status.len() == 3
        && status.iter().all(|(name, value)| match name.as_str() {
            "wsrep_cluster_status" => value == "Primary",
            "wsrep_local_state_comment" => value == "Synced",
            _ => value == "0",
        })
}

/// Runs `ddl`, tried again a few times after a lock wait timeout: on a Galera node a DDL
/// statement waits for the whole cluster, and a node still applying or purging another test's
/// writes has made it time out (1205) where nothing of this test's held a lock.
async fn ddl_retried(conn: &mut Conn, ddl: &str) {
    for attempt in 1.. {
        match conn.query_drop(ddl).await {
            Ok(()) => return,
            Err(mysql_async::Error::Server(e)) if e.code == 1205 && attempt < 4 => {
                eprintln!("{ddl}: {e}; trying again");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => panic!("{ddl}: {e}"),
        }
    }
}

/// A database of the test's own, created empty (and migrated) and dropped at the end.
pub struct TestDb {
    pub name: String,
    pub url: String,
    pub dir: tempfile::TempDir,
}

impl TestDb {
    /// Creates `myjob_t_<tag>` afresh and applies the migrations.
    pub async fn new(tag: &str) -> TestDb {
        let db = Self::empty(tag).await;
        let mut conn = db.conn().await;
        myjob::store::schema::migrate(&mut conn)
            .await
            .expect("migrate");
        db
    }

    /// Creates `myjob_t_<tag>` afresh, without tables.
    pub async fn empty(tag: &str) -> TestDb {
        cluster_settled(120).await;
        let name = format!("myjob_t_{tag}");
        let mut root = Conn::new(Opts::from_url(&server_url()).unwrap())
            .await
            .expect("cannot reach the test server (tests/run starts it; or set MYJOB_TEST_SERVER)");
        for ddl in [
            format!("DROP DATABASE IF EXISTS {name}"),
            format!("CREATE DATABASE {name}"),
        ] {
            ddl_retried(&mut root, &ddl).await;
        }
        let _ = root.disconnect().await;
        TestDb {
            url: format!("{}/{name}", server_url()),
            name,
            dir: tempfile::tempdir().unwrap(),
        }
    }

    /// This database's url through node `i` of [`nodes`] (counted round).
    pub fn node_url(&self, i: usize) -> String {
        let nodes = nodes();
        format!("{}/{}", nodes[i % nodes.len()], self.name)
    }

    /// A connection to this database on the server under test (the new primary, after a
    /// failover: see [`failed_over_to`]).
    pub async fn conn(&self) -> Conn {
        let url = format!("{}/{}", server_url(), self.name);
        Conn::new(Opts::from_url(&url).unwrap()).await.unwrap()
    }

    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.path().join(file)
    }

    /// Writes an executable script `name` into the test's directory, with `DIR` in `text`
    /// replaced by that directory and `EXAMPLES` by the project's `examples/`, and returns its
    /// path.
    pub fn script(&self, name: &str, text: &str) -> PathBuf {
        let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
        let path = self.path(name);
        let text = text
            .replace("EXAMPLES", examples.to_str().unwrap())
            .replace("DIR", self.dir.path().to_str().unwrap());
        std::fs::write(&path, text).unwrap();
        chmod_x(&path);
        path
    }

    /// Writes the test handler (see [`HANDLER`]) and returns its path.
    pub fn handler(&self) -> PathBuf {
        self.script("handler.sh", HANDLER)
    }

    /// Writes a config with one queue `q` run by the test handler, plus `extra` TOML appended
    /// to `[worker]`. Returns its path.
    pub fn config(&self, worker_extra: &str, rest: &str) -> PathBuf {
        let handler = self.handler();
        let text = format!(
            "[database]\nurl = \"{url}\"\n\n[worker]\npoll_interval = \"100ms\"\nshutdown_timeout = \"5s\"\n{worker_extra}\n\n\
             [reaper]\ninterval = \"500ms\"\nstale_after = \"2s\"\n\n\
             [metrics]\nlisten = \"\"\n\n\
             [[queue]]\nname = \"q\"\ncommand = [\"{h}\"]\nbackoff = \"100ms\"\nbackoff_max = \"200ms\"\nmax_attempts = 3\n{rest}\n",
            url = self.url,
            h = handler.display()
        );
        let path = self.path("myjob.toml");
        std::fs::write(&path, text).unwrap();
        path
    }

    /// [`TestDb::config`] with `worker_extra`, and `database.lock_wait_timeout` set to `wait`.
    pub fn config_with_lock_wait(&self, worker_extra: &str, wait: &str) -> PathBuf {
        let config = self.config(worker_extra, "");
        let url_line = format!("url = \"{}\"", self.url);
        let with_wait = format!("{url_line}\nlock_wait_timeout = \"{wait}\"");
        edited(&config, &config, &[(url_line.as_str(), with_wait.as_str())]);
        config
    }

    /// A connection in a transaction that holds job `id`'s row locked until it commits.
    pub async fn lock_job(&self, id: u64) -> Conn {
        let mut locker = self.conn().await;
        locker.query_drop("BEGIN").await.unwrap();
        locker
            .exec_drop("SELECT id FROM myjob_jobs WHERE id = ? FOR UPDATE", (id,))
            .await
            .unwrap();
        locker
    }

    /// [`TestDb::config`] with no extras, connecting as `user` with `password`.
    pub fn config_as(&self, user: &str, password: &str) -> PathBuf {
        let config = self.config("", "");
        edited(
            &config,
            &config,
            &[(&self.url, &self.url_as(user, password))],
        );
        config
    }

    /// This database's url, connecting as `user` with `password`.
    pub fn url_as(&self, user: &str, password: &str) -> String {
        let host_and_db = self.url.split_once('@').unwrap().1;
        format!("mysql://{user}:{password}@{host_and_db}")
    }

    /// Inserts jobs as an application would: plain SQL, only queue and payload.
    pub async fn insert(&self, queue: &str, payloads: &[&str]) -> Vec<u64> {
        let mut conn = self.conn().await;
        let mut ids = Vec::new();
        for p in payloads {
            conn.exec_drop(
                "INSERT INTO myjob_jobs (queue, payload) VALUES (?, ?)",
                (queue, p),
            )
            .await
            .unwrap();
            ids.push(conn.last_insert_id().unwrap());
        }
        ids
    }

    /// The identity of the server under test, as myjob reads it for `owner_server`.
    pub async fn server_id(&self) -> myjob::db::ServerId {
        myjob::db::ServerId::of(&mut self.conn().await)
            .await
            .unwrap()
    }

    /// Whether the server under test is a MariaDB (else a MySQL).
    pub async fn is_mariadb(&self) -> bool {
        let version: String = self
            .conn()
            .await
            .query_first("SELECT VERSION()")
            .await
            .unwrap()
            .unwrap();
        version.contains("MariaDB")
    }

    /// Runs one INSERT of a single row, written out in `sql`, and returns the row's id.
    pub async fn insert_sql(&self, sql: &str) -> u64 {
        let mut conn = self.conn().await;
        conn.query_drop(sql).await.unwrap();
        conn.last_insert_id().unwrap()
    }

    /// Inserts a claim abandoned an hour ago by connection 999999999, which does not exist,
    /// through the server `owner_server`. Returns its id.
    pub async fn insert_abandoned_claim(&self, owner_server: &str) -> u64 {
        let mut conn = self.conn().await;
        conn.exec_drop(
            "INSERT INTO myjob_jobs (queue, payload, status, attempts, batch_id, owner_conn, \
                 owner_server, claimed_at) \
             VALUES ('q', 'x', 'claimed', 1, 42, 999999999, ?, NOW(6) - INTERVAL 1 HOUR)",
            (owner_server,),
        )
        .await
        .unwrap();
        conn.last_insert_id().unwrap()
    }

    /// Inserts `n` jobs of queue `keyed` by plain SQL, with `keys` keys in turn (`k0`, `k1`,
    /// …), each job's payload its key: blocked, as a producer's INSERT leaves them.
    pub async fn insert_keyed(&self, n: usize, keys: usize) {
        let values: Vec<String> = (0..n)
            .map(|i| format!("('keyed', 'k{0}', 'k{0}')", i % keys))
            .collect();
        self.conn()
            .await
            .query_drop(format!(
                "INSERT INTO myjob_jobs (queue, payload, concurrency_key) VALUES {}",
                values.join(", ")
            ))
            .await
            .unwrap();
    }

    /// Inserts `n` copies of the row `values` into `columns`, a thousand to a statement (the
    /// same on every server: MariaDB's seq_1_to_N tables are its own).
    pub async fn insert_rows(&self, columns: &str, values: &str, n: usize) {
        let mut conn = self.conn().await;
        let mut left = n;
        while left > 0 {
            let k = left.min(1000);
            let rows = vec![values; k].join(", ");
            conn.query_drop(format!("INSERT INTO myjob_jobs {columns} VALUES {rows}"))
                .await
                .unwrap();
            left -= k;
        }
    }

    pub async fn count(&self, where_: &str) -> u64 {
        let mut conn = self.conn().await;
        conn.query_first(format!("SELECT COUNT(*) FROM myjob_jobs WHERE {where_}"))
            .await
            .unwrap()
            .unwrap()
    }

    /// A job's (status, attempts, batch_id, worker, last_error).
    pub async fn job(&self, id: u64) -> (String, u32, Option<u64>, Option<String>, Option<String>) {
        let mut conn = self.conn().await;
        conn.exec_first(
            "SELECT status, attempts, batch_id, worker, last_error FROM myjob_jobs WHERE id = ?",
            (id,),
        )
        .await
        .unwrap()
        .unwrap()
    }

    /// Waits until `SELECT COUNT(*) … WHERE cond` equals `n`, or panics after `secs`.
    pub async fn wait_count(&self, cond: &str, n: u64, secs: u64) {
        self.wait_until(cond, |got| got == n, n, secs).await
    }

    /// Waits until at least `n` rows match `cond`.
    pub async fn wait_at_least(&self, cond: &str, n: u64, secs: u64) {
        self.wait_until(cond, |got| got >= n, n, secs).await
    }

    async fn wait_until(&self, cond: &str, ok: impl Fn(u64) -> bool, n: u64, secs: u64) {
        let start = Instant::now();
        loop {
            let got = self.count(cond).await;
            if ok(got) {
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(secs),
                "waited {secs}s for {n} jobs where {cond}; have {got}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The handler's record of runs: one `(job_id, attempt, instance, pid)` per line.
    pub fn runs(&self) -> Vec<(u64, u32, String, u32)> {
        let text = std::fs::read_to_string(self.path("runs")).unwrap_or_default();
        text.lines()
            .map(|l| {
                let f: Vec<&str> = l.split(' ').collect();
                (
                    f[0].parse().unwrap(),
                    f[1].parse().unwrap(),
                    f[2].to_owned(),
                    f[3].parse().unwrap(),
                )
            })
            .collect()
    }
}

impl Drop for TestDb {
    /// Drops the database when the test passed; a failed test leaves it for a look.
    ///
    /// On a Galera cluster the database is kept (the next run's `TestDb::empty` drops it, and
    /// `tests/db-server.sh reset galera` drops them all): a DROP DATABASE is a schema change
    /// that the whole cluster applies in isolation, pausing InnoDB's purge on every node while
    /// the others' tests write, the pause in which MariaDB 11.8.9's purge ran away with a
    /// node's memory (see the cluster's `innodb_purge_batch_size` in tests/db-server.sh).
    fn drop(&mut self) {
        if std::thread::panicking() || nodes().len() > 1 {
            return;
        }
        let name = self.name.clone();
        // Drop cannot await, and may run inside the test's runtime: use a thread of its own.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                if let Ok(mut root) = Conn::new(Opts::from_url(&server_url()).unwrap()).await {
                    let _ = root
                        .query_drop(format!("DROP DATABASE IF EXISTS {name}"))
                        .await;
                    let _ = root.disconnect().await;
                }
            });
        })
        .join();
    }
}

/// The README's GRANT statements for the worker account, for database `db` and account
/// `user`: the test runs what the README tells people to run.
pub fn readme_grants(db: &str, user: &str) -> Vec<String> {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let grants: Vec<String> = readme
        .lines()
        .map(str::trim_start)
        .filter(|l| l.starts_with("GRANT ") && !l.contains("mysql.wsrep_cluster_members"))
        .map(|l| {
            l.replace("app.", &format!("{db}."))
                .replace("'myjob'@'10.0.0.%'", &format!("'{user}'@'%'"))
        })
        .collect();
    assert_eq!(grants.len(), 9, "the README's GRANTs changed: {grants:?}");
    grants
}

/// A new account `myjob_<tag>_…` with a random password and the README's GRANTs that pass
/// `keep`; returns its name and password.
pub async fn account(db: &TestDb, tag: &str, keep: impl Fn(&str) -> bool) -> (String, String) {
    let token = format!("{:016x}", rand::random::<u64>());
    let user = format!("myjob_{tag}_{}", &token[..8]);
    let password = format!("Secret-{token}");
    let mut admin = create_user(db, &user, &password).await;
    for grant in readme_grants(&db.name, &user) {
        if keep(&grant) {
            admin.query_drop(grant).await.unwrap();
        }
    }
    (user, password)
}

/// Creates `user`@'%' afresh with `password` (no quote or backslash in it: CREATE USER takes
/// no placeholder), and returns the admin connection that did.
pub async fn create_user(db: &TestDb, user: &str, password: &str) -> Conn {
    let mut admin = db.conn().await;
    admin
        .query_drop(format!("DROP USER IF EXISTS '{user}'@'%'"))
        .await
        .unwrap();
    admin
        .query_drop(format!(
            "CREATE USER '{user}'@'%' IDENTIFIED BY '{password}'"
        ))
        .await
        .unwrap();
    admin
}

/// `1, 2, 3`: ids for an SQL `IN (…)`.
pub fn id_list(ids: &[u64]) -> String {
    ids.iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// `s` percent-encoded: every byte but the unreserved characters (a url's user, password or
/// query value).
pub fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A process killed and reaped when dropped, however the test ends.
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The test handler. It records each run, then does what the payload says:
/// `sleep:N` sleeps N s; `fail` fails on stderr; `perm` fails for good (exit 65); `flaky`
/// fails on attempt 1 only; `ignore-term:N` ignores SIGTERM, leaves a child behind and sleeps
/// N s; `slow-if-flag` sleeps 60 s while the file `slow` exists; `fail-on:I:N` sleeps N s
/// and fails on instance I only; anything else succeeds.
pub const HANDLER: &str = r#"#!/bin/sh
p=$(cat)
echo "$MYJOB_JOB_ID $MYJOB_ATTEMPT $MYJOB_INSTANCE $$" >> DIR/runs
case "$p" in
  sleep:*) sleep "${p#sleep:}" ;;
  fail) echo "boom on attempt $MYJOB_ATTEMPT" >&2; exit 1 ;;
  perm) echo "bad payload" >&2; exit 65 ;;
  flaky) if [ "$MYJOB_ATTEMPT" -lt 2 ]; then echo "flaky" >&2; exit 1; fi ;;
  ignore-term:*) trap '' TERM; sleep 300 & echo $! > DIR/child; sleep "${p#ignore-term:}" ;;
  slow-if-flag) while [ -e DIR/slow ]; do sleep 0.1; done ;;
  env) env > DIR/env.$MYJOB_JOB_ID ;;
  kill-worker) kill -9 "$PPID"; sleep 5 ;;
  slow-on:*) if [ "$MYJOB_INSTANCE" = "${p#slow-on:}" ]; then sleep 1; fi ;;
  fail-on:*) sleep "${p##*:}"; x=${p#fail-on:}; if [ "$MYJOB_INSTANCE" = "${x%%:*}" ]; then echo "failed on $MYJOB_INSTANCE" >&2; exit 1; fi ;;
esac
echo "handled $MYJOB_JOB_ID"
exit 0
"#;

/// A socket where systemd's NOTIFY_SOCKET would be: what the daemon reports (READY=1,
/// STATUS=…), over the real protocol.
pub struct NotifySocket {
    pub path: PathBuf,
    socket: std::os::unix::net::UnixDatagram,
    seen: std::sync::Mutex<Vec<String>>,
}

impl NotifySocket {
    pub fn new(db: &TestDb) -> NotifySocket {
        let path = db.path("notify.sock");
        let socket = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
        socket.set_nonblocking(true).unwrap();
        NotifySocket {
            path,
            socket,
            seen: Default::default(),
        }
    }

    /// Every message received so far, oldest first.
    pub fn messages(&self) -> Vec<String> {
        let mut seen = self.seen.lock().unwrap();
        let mut buf = vec![0u8; 4096];
        while let Ok(n) = self.socket.recv(&mut buf) {
            seen.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
        seen.clone()
    }

    pub fn ready(&self) -> bool {
        self.messages()
            .iter()
            .any(|m| m.lines().any(|l| l == "READY=1"))
    }
}

/// Writes `src` to `dst` (the same path edits in place) with each `(from, to)` replaced. A
/// `from` that is not in the file is a mistake in the test, not an edit to skip.
pub fn edited(src: &Path, dst: &Path, edits: &[(&str, &str)]) {
    let mut text = std::fs::read_to_string(src).unwrap();
    for (from, to) in edits {
        assert!(text.contains(from), "{} has no {from:?}", src.display());
        text = text.replace(from, to);
    }
    std::fs::write(dst, text).unwrap();
}

pub fn chmod_x(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// A `myjob run` child process, its stderr going to a file.
pub struct Worker {
    pub child: Child,
    pub log: PathBuf,
}

impl Worker {
    pub fn start(config: &Path, instance: &str) -> Worker {
        Self::start_with_env(config, instance, &[])
    }

    pub fn start_with_env(config: &Path, instance: &str, env: &[(&str, &str)]) -> Worker {
        let log = config.with_file_name(format!("worker-{instance}.log"));
        Self::spawn(config, instance, env, log, false)
    }

    /// Starts an instance whose stderr is appended to `log`, so that the logs of successive
    /// starts of one instance stay in one file.
    pub fn start_appending(config: &Path, instance: &str, log: &Path) -> Worker {
        Self::start_appending_with_env(config, instance, log, &[])
    }

    /// [`Worker::start_appending`], with `env` added to the worker's environment.
    pub fn start_appending_with_env(
        config: &Path,
        instance: &str,
        log: &Path,
        env: &[(&str, &str)],
    ) -> Worker {
        Self::spawn(config, instance, env, log.to_owned(), true)
    }

    /// Starts an instance on `host` (see [`hosts::Host`]), its stderr appended to `log`.
    pub fn start_on(host: &hosts::Host, config: &Path, instance: &str, log: &Path) -> Worker {
        Self::spawn_with(
            host.command(bin()),
            config,
            instance,
            &[],
            log.to_owned(),
            true,
        )
    }

    /// Starts an instance as the last argument of `wrapper` (such as `strace -o FILE`).
    pub fn start_under(wrapper: &[&str], config: &Path, instance: &str) -> Worker {
        let mut command = Command::new(wrapper[0]);
        command.args(&wrapper[1..]).arg(bin());
        let log = config.with_file_name(format!("worker-{instance}.log"));
        Self::spawn_with(command, config, instance, &[], log, false)
    }

    fn spawn(
        config: &Path,
        instance: &str,
        env: &[(&str, &str)],
        log: PathBuf,
        append: bool,
    ) -> Worker {
        Self::spawn_with(Command::new(bin()), config, instance, env, log, append)
    }

    fn spawn_with(
        mut command: Command,
        config: &Path,
        instance: &str,
        env: &[(&str, &str)],
        log: PathBuf,
        append: bool,
    ) -> Worker {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .append(append)
            .truncate(!append)
            .open(&log)
            .unwrap();
        let child = command
            .args([
                "--config",
                config.to_str().unwrap(),
                "run",
                "--instance",
                instance,
            ])
            .env_remove("JOURNAL_STREAM")
            .env_remove("NOTIFY_SOCKET")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .unwrap();
        Worker { child, log }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid()), sig).unwrap();
    }

    /// Waits for the process to exit and returns its exit code (None if killed by a signal).
    /// Whether the process has ended, by an exit or a signal.
    pub fn exited(&mut self) -> bool {
        self.child.try_wait().unwrap().is_some()
    }

    pub fn wait(&mut self, secs: u64) -> Option<i32> {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code();
            }
            assert!(
                start.elapsed() < Duration::from_secs(secs),
                "worker did not exit within {secs}s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the log contains `needle`.
    pub async fn wait_log(&self, needle: &str, secs: u64) {
        let start = Instant::now();
        while !self.log_text().contains(needle) {
            assert!(
                start.elapsed() < Duration::from_secs(secs),
                "log never showed {needle:?}:\n{}",
                self.log_text()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `myjob cancel <id>` with `config`, which must succeed.
pub fn cancel(config: &Path, id: u64) {
    let out = myjob(
        &[
            "--config",
            config.to_str().unwrap(),
            "cancel",
            &id.to_string(),
        ],
        b"",
    );
    assert_eq!(out.status.code(), Some(0), "{out:?}");
}

/// Runs `myjob ARGS` to completion with `stdin` as its input.
pub fn myjob(args: &[&str], stdin: &[u8]) -> Output {
    use std::io::Write;
    let mut child = Command::new(bin())
        .args(args)
        .env_remove("MYJOB_DATABASE_URL")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    let _ = input.write_all(stdin);
    drop(input);
    child.wait_with_output().unwrap()
}

/// Kills the handler processes that instance `instance` started (they run in their own
/// process groups, so a worker killed with SIGKILL leaves them behind).
pub fn kill_recorded_handlers(db: &TestDb, instance: &str) {
    for pid in db
        .runs()
        .into_iter()
        .filter(|r| r.2 == instance)
        .map(|r| r.3 as i32)
    {
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}
