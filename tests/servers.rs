//! What differs between the servers of the MySQL family, tested on whichever the suite runs
//! against (tests/run runs every test file on MariaDB 10.11, MariaDB 11.8 and MySQL 9.7): TLS,
//! the schema's shape, session settings, a multiplexing proxy, and claims made through a
//! server that is gone.
//!
//! `MYJOB_TEST_TLS_CA` names the CA of the server under test when it has TLS (MySQL's own
//! self-signed one, or the test CA tests/db-server.sh starts MariaDB 11.8 with).

use std::time::{Duration, Instant};

use crate::common::proxy::{Fault, Proxy};
use crate::common::{edited, myjob, TestDb, Worker};
use mysql_async::prelude::*;

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The last line of stderr, without the log prefix: the error `main` printed.
fn error_line(out: &std::process::Output) -> String {
    let text = stderr(out);
    let line = text.lines().last().unwrap_or("").to_owned();
    line.split_once("ERROR ")
        .map_or(line.clone(), |(_, rest)| rest.to_owned())
}

/// `db.config` with the url given TLS `params` and `extra` lines in `[database]`.
fn tls_config(db: &TestDb, name: &str, params: &str, extra: &str) -> std::path::PathBuf {
    let base = db.config("", "");
    let path = db.path(name);
    let from = format!("url = \"{}\"", db.url);
    let to = format!("url = \"{}?{params}\"\n{extra}", db.url);
    edited(&base, &path, &[(from.as_str(), to.as_str())]);
    path
}

/// `migrate` with `config` fails for TLS: exit 69, one line naming the url, no password.
fn assert_tls_fails(config: &std::path::Path) {
    let out = myjob(&["--config", config.to_str().unwrap(), "migrate"], b"");
    assert_eq!(out.status.code(), Some(69), "{}", stderr(&out));
    let line = error_line(&out);
    assert!(
        line.starts_with("database mysql://myjob_test@") && line.contains("TLS failed"),
        "{line}"
    );
    assert_eq!(stderr(&out).lines().count(), 1, "{}", stderr(&out));
    assert!(!stderr(&out).contains(":myjob_test@"));
}

#[tokio::test(flavor = "multi_thread")]
async fn tls_is_used_when_asked_and_its_failures_are_one_line() {
    let db = TestDb::new("tls").await;
    let Ok(ca) = std::env::var("MYJOB_TEST_TLS_CA") else {
        // A server without TLS: asking for it is a one-line error naming the database, 69.
        let config = tls_config(&db, "tls.toml", "require_ssl=true", "");
        assert_tls_fails(&config);
        return;
    };

    // Encrypted without checking the certificate: what managed services' urls ask for.
    let config = tls_config(
        &db,
        "no-verify.toml",
        "require_ssl=true&verify_ca=false",
        "",
    );
    let c = config.to_str().unwrap();
    let out = myjob(&["--config", c, "migrate"], b"");
    assert!(out.status.success(), "{}", stderr(&out));
    let out = myjob(&["--config", c, "enqueue", "--queue", "q", "over tls"], b"");
    assert!(out.status.success(), "{}", stderr(&out));
    let url = format!("{}?require_ssl=true&verify_ca=false", db.url);
    let settings = myjob::config::DatabaseSettings::from_url(&url).unwrap();
    assert!(settings.tls);
    let mut conn = myjob::db::connect(&settings).await.unwrap();
    let cipher: Option<(String, String)> = conn
        .query_first("SHOW SESSION STATUS LIKE 'Ssl_cipher'")
        .await
        .unwrap();
    assert!(
        cipher.is_some_and(|(_, c)| !c.is_empty()),
        "the session is not encrypted"
    );

    // Verified against a CA the system does not know: a one-line error, 69.
    let config = tls_config(&db, "verify.toml", "require_ssl=true", "");
    assert_tls_fails(&config);

    // With the server's CA in tls_ca, it verifies. The test CA's certificate names
    // 127.0.0.1; MySQL's self-signed one names no host, so its identity does not verify.
    let with_ca = format!("tls_ca = \"{ca}\"");
    let config = tls_config(&db, "ca.toml", "require_ssl=true", &with_ca);
    let out = myjob(&["--config", config.to_str().unwrap(), "migrate"], b"");
    if db.is_mariadb().await {
        assert!(out.status.success(), "{}", stderr(&out));
    } else {
        assert_eq!(out.status.code(), Some(69), "{}", stderr(&out));
        assert!(error_line(&out).contains("TLS failed"), "{}", stderr(&out));
    }
    // verify_identity=false beside a verified CA is refused with a reason (see config.rs).
    let config = tls_config(
        &db,
        "no-identity.toml",
        "require_ssl=true&verify_identity=false",
        &with_ca,
    );
    let out = myjob(&["--config", config.to_str().unwrap(), "migrate"], b"");
    assert_eq!(out.status.code(), Some(78), "{}", stderr(&out));
    assert!(error_line(&out).contains("database.url: verify_identity=false"));
    // tls_ca alone turns TLS on, fully verified; the worker runs a job over it (on MySQL,
    // whose certificate names no host, encrypted without verification).
    let config = if db.is_mariadb().await {
        tls_config(&db, "worker.toml", "", &with_ca)
    } else {
        tls_config(&db, "worker.toml", "require_ssl=true&verify_ca=false", "")
    };
    let worker = Worker::start(&config, "1");
    db.wait_count("status = 'done'", 1, 20).await;
    assert!(worker.log_text().contains("job done"));
    drop(worker);

    // A CA file that is not there is a config error naming the key, 78.
    let config = tls_config(
        &db,
        "no-ca.toml",
        "require_ssl=true",
        "tls_ca = \"/nonexistent/ca.pem\"",
    );
    let out = myjob(&["--config", config.to_str().unwrap(), "migrate"], b"");
    assert_eq!(out.status.code(), Some(78), "{}", stderr(&out));
    assert!(error_line(&out).contains("database.tls_ca: cannot read /nonexistent/ca.pem"));
}

/// The schema `migrate` creates has the same columns everywhere, and a plain INSERT of a queue
/// alone works in the server's own SQL mode (MySQL's is strict).
#[tokio::test(flavor = "multi_thread")]
async fn the_schema_is_the_same_on_every_server() {
    let db = TestDb::new("schema_shape").await;
    let mut conn = db.conn().await;
    let columns: Vec<(String, String, String)> = conn
        .exec(
            "SELECT COLUMN_NAME, DATA_TYPE, IS_NULLABLE FROM information_schema.COLUMNS \
             WHERE TABLE_SCHEMA = ? AND TABLE_NAME = 'myjob_jobs' ORDER BY ORDINAL_POSITION",
            (&db.name,),
        )
        .await
        .unwrap();
    let columns: Vec<String> = columns
        .into_iter()
        .map(|(n, t, null)| format!("{n} {} {null}", t.to_lowercase()))
        .collect();
    assert_eq!(
        columns,
        [
            "id bigint NO",
            "queue varbinary NO",
            "priority smallint NO",
            "payload mediumblob NO",
            "attempts int NO",
            "rescues int NO",
            "suspicion tinyint NO",
            "max_attempts int YES",
            "run_at timestamp NO",
            // After run_at: its default reads run_at (migration 7).
            "status enum NO",
            "unique_key varchar YES",
            "unique_live varchar YES",
            "batch_id bigint YES",
            "owner_conn bigint YES",
            "owner_server varchar YES",
            "worker varchar YES",
            "claimed_at timestamp YES",
            "finished_at timestamp YES",
            "created_at timestamp NO",
            "last_error text YES",
            // Concurrency keys (migration 11), added at the end: no rebuild.
            "concurrency_key varbinary YES",
            "slot smallint YES",
            "slot_live smallint YES",
            "blocked_key varbinary YES",
            // What a Galera node certifies (migration 14), INSTANT at the end.
            "unique_queue varbinary YES",
            "slot_queue varbinary YES",
            "slot_key varbinary YES",
            // The reaper's cancelled claims (migration 17), INSTANT at the end.
            "cancel_owner tinyint YES",
        ]
    );
    conn.query_drop("INSERT INTO myjob_jobs (queue) VALUES ('q')")
        .await
        .unwrap();
    let row: Option<(Vec<u8>, String, u32)> = conn
        .query_first("SELECT payload, status, attempts FROM myjob_jobs")
        .await
        .unwrap();
    assert_eq!(row, Some((Vec::new(), "pending".to_owned(), 0)));
    // A plain INSERT with a future run_at is scheduled; one due now, or past, is pending; a
    // status given is kept.
    conn.query_drop(
        "INSERT INTO myjob_jobs (queue, run_at) VALUES \
         ('f', NOW(6) + INTERVAL 1 MINUTE), ('p', NOW(6) - INTERVAL 1 MINUTE), ('n', NOW(6))",
    )
    .await
    .unwrap();
    conn.query_drop(
        "INSERT INTO myjob_jobs (queue, run_at, status) VALUES ('s', NOW(6) + INTERVAL 1 DAY, 'pending')",
    )
    .await
    .unwrap();
    let statuses: Vec<(Vec<u8>, String)> = conn
        .query("SELECT queue, status FROM myjob_jobs WHERE queue <> 'q' ORDER BY id")
        .await
        .unwrap();
    let statuses: Vec<(&str, &str)> = statuses
        .iter()
        .map(|(q, s)| (std::str::from_utf8(q).unwrap(), s.as_str()))
        .collect();
    assert_eq!(
        statuses,
        [
            ("f", "scheduled"),
            ("p", "pending"),
            ("n", "pending"),
            ("s", "pending")
        ]
    );

    // A plain INSERT with a concurrency key waits for a slot, blocked; with a future run_at
    // it is scheduled first. A slot holds one job: a second holder of slot 1 is refused by
    // the unique index, a holder of slot 2 is not, and a job that ends frees its slot.
    conn.query_drop(
        "INSERT INTO myjob_jobs (queue, concurrency_key, run_at) VALUES \
         ('k', 'sku-1', NOW(6)), ('k', 'sku-1', NOW(6)), ('k', 'sku-1', NOW(6)), \
         ('k', 'sku-1', NOW(6) + INTERVAL 1 DAY)",
    )
    .await
    .unwrap();
    let keyed: Vec<(u64, String)> = conn
        .query("SELECT id, status FROM myjob_jobs WHERE queue = 'k' ORDER BY id")
        .await
        .unwrap();
    let got: Vec<&str> = keyed.iter().map(|k| k.1.as_str()).collect();
    assert_eq!(got, ["blocked", "blocked", "blocked", "scheduled"]);
    let admit = |id: u64, slot: u16| {
        format!("UPDATE myjob_jobs SET status = 'pending', slot = {slot} WHERE id = {id}")
    };
    conn.query_drop(admit(keyed[0].0, 1)).await.unwrap();
    let twice = conn.query_drop(admit(keyed[1].0, 1)).await.unwrap_err();
    assert!(twice.to_string().contains("1062"), "{twice}");
    conn.query_drop(admit(keyed[1].0, 2)).await.unwrap();
    conn.query_drop(format!(
        "UPDATE myjob_jobs SET status = 'done' WHERE id = {}",
        keyed[0].0
    ))
    .await
    .unwrap();
    conn.query_drop(admit(keyed[2].0, 1)).await.unwrap();
}

/// What myjob relies on is set per session, not inherited from the server's defaults
/// (MySQL's are REPEATABLE READ and the system time zone).
#[tokio::test(flavor = "multi_thread")]
async fn sessions_are_utc_read_committed_and_strict() {
    let db = TestDb::new("session").await;
    let settings = myjob::config::DatabaseSettings::from_url(&db.url).unwrap();
    let mut conn = myjob::db::connect(&settings).await.unwrap();
    let vars: Vec<(String, String)> = conn
        .query(
            "SHOW SESSION VARIABLES WHERE Variable_name IN \
             ('time_zone', 'sql_mode', 'transaction_isolation', 'tx_isolation')",
        )
        .await
        .unwrap();
    let var = |name: &str| {
        vars.iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    assert_eq!(var("time_zone"), "+00:00");
    let isolation = format!("{}{}", var("transaction_isolation"), var("tx_isolation"));
    assert!(isolation.starts_with("READ-COMMITTED"), "{vars:?}");
    let mode = var("sql_mode");
    assert!(mode.contains("STRICT_TRANS_TABLES"), "{mode}");
    assert!(mode.contains("NO_ENGINE_SUBSTITUTION"), "{mode}");
    assert!(
        !mode.contains("ANSI_QUOTES") && !mode.contains("PIPES_AS_CONCAT"),
        "{mode}"
    );
}

/// Behind a proxy that hands out connection ids of its own, `CONNECTION_ID()` no longer names
/// the claimer: myjob refuses to start, with a line that says why, rather than claim. A proxy
/// that passes connections through whole is fine.
#[tokio::test(flavor = "multi_thread")]
async fn a_multiplexing_proxy_is_refused() {
    let db = TestDb::new("proxied").await;
    let plain = Proxy::new();
    plain.up().await;
    let config = db.config("", "");
    let through = db.path("through.toml");
    let url = plain.url(&db);
    edited(&config, &through, &[(db.url.as_str(), url.as_str())]);
    let out = myjob(&["--config", through.to_str().unwrap(), "migrate"], b"");
    assert!(out.status.success(), "{}", stderr(&out));

    let multiplexing = Proxy::multiplexing();
    multiplexing.up().await;
    let proxied = db.path("proxied.toml");
    let url = multiplexing.url(&db);
    edited(&config, &proxied, &[(db.url.as_str(), url.as_str())]);
    let p = proxied.to_str().unwrap();
    let out = myjob(&["--config", p, "migrate"], b"");
    assert_eq!(out.status.code(), Some(78), "{}", stderr(&out));
    let line = error_line(&out);
    assert!(
        line.starts_with("database mysql://") && line.contains("a proxy answers for the server"),
        "{line}"
    );
    // `run` stops too, rather than retry for ever.
    let mut worker = Worker::start(&proxied, "1");
    assert_eq!(worker.wait(20), Some(78), "{}", worker.log_text());
    assert!(worker.log_text().contains("a proxy answers for the server"));
}

/// The server's identity is its start time, read as the time now less the uptime, in two
/// statements. A network that holds the second back for 3 s (a lost packet, a stunned VM)
/// must not make it a server no reaper stamps: its claims would look dead and run again.
#[tokio::test(flavor = "multi_thread")]
async fn a_stall_while_reading_the_identity_does_not_forge_a_server() {
    let db = TestDb::new("identity_stall").await;
    let direct = db.server_id().await;
    let proxy = Proxy::new();
    proxy.up().await;
    proxy.arm(Fault::Stall("UNIX_TIMESTAMP", Duration::from_secs(3)));
    let settings = myjob::config::DatabaseSettings::from_url(&proxy.url(&db)).unwrap();
    let mut conn = myjob::db::connect(&settings).await.unwrap();
    let through = myjob::db::ServerId::of(&mut conn).await.unwrap();
    assert!(proxy.fired(), "the proxy never held the statement back");
    assert!(
        through.same_life(&direct),
        "{through} read through a stall, {direct} directly"
    );
}

/// Claims made through a server that is gone (a primary replaced by a failover, a restart
/// under a new name: simulated by the owner_server on the rows) come back once the reaper
/// has been connected for stale_after; claims of a server that still stamps its heartbeat,
/// and the live claims of this one, are never touched.
#[tokio::test(flavor = "multi_thread")]
async fn claims_of_a_server_that_is_gone_come_back() {
    let db = TestDb::new("gone_server").await;
    // stale_after 2s, reaper every 500ms.
    let config = db.config("concurrency = 2", "");
    std::fs::write(db.path("slow"), "").unwrap();
    let live = db.insert("q", &["slow-if-flag"]).await[0];
    let gone = db.insert_abandoned_claim("gone-host:3306/12345").await;
    let elsewhere = db.insert_abandoned_claim("elsewhere:3306/777").await;
    // The other server's reapers stamp it, as long as this task runs.
    let stamping = tokio::spawn({
        let url = db.url.clone();
        async move {
            let mut conn = mysql_async::Conn::from_url(&url).await.unwrap();
            loop {
                conn.query_drop(
                    "INSERT INTO myjob_servers (server, heartbeat_at) VALUES ('elsewhere:3306/777', NOW(6)) \
                     ON DUPLICATE KEY UPDATE heartbeat_at = NOW(6)",
                )
                .await
                .unwrap();
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        }
    });

    let started = Instant::now();
    let worker = Worker::start(&config, "1");
    db.wait_count(&format!("id = {live} AND status = 'claimed'"), 1, 20)
        .await;
    let live_batch = db.job(live).await.2;
    db.wait_count(&format!("id = {gone} AND status = 'done'"), 1, 20)
        .await;
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "put back before the reaper had been connected for stale_after"
    );
    worker
        .wait_log("its server gone-host:3306/12345 has had no heartbeat", 5)
        .await;
    let (status, attempts, batch, ..) = db.job(elsewhere).await;
    assert_eq!((status.as_str(), attempts, batch), ("claimed", 1, Some(42)));
    let (status, _, batch, ..) = db.job(live).await;
    assert_eq!((status.as_str(), batch), ("claimed", live_batch));

    // Once that server stops stamping, its claims come back too.
    stamping.abort();
    db.wait_count(&format!("id = {elsewhere} AND status = 'done'"), 1, 20)
        .await;
    let (status, _, batch, ..) = db.job(live).await;
    assert_eq!((status.as_str(), batch), ("claimed", live_batch));
    std::fs::remove_file(db.path("slow")).unwrap();
    db.wait_count("status = 'done'", 3, 20).await;
    assert_eq!(
        db.runs().iter().filter(|r| r.0 == live).count(),
        1,
        "the live job ran once"
    );
}

/// A proxy closes connections idle for 3 s, and the reaper looks every 5 s: each pass finds
/// its connection closed and makes a new one to the same server. The time it has been
/// connected to that server's life counts across those reconnects, so a claim of the server's
/// earlier life (before a restart) still comes back.
#[tokio::test(flavor = "multi_thread")]
async fn a_reaper_whose_idle_connection_is_closed_still_puts_back_an_earlier_lifes_claims() {
    let db = TestDb::new("reaper_idle_closed").await;
    let proxy = Proxy::idle_timeout(Duration::from_secs(3));
    proxy.up().await;
    let config = db.config("concurrency = 1", "");
    let through = db.path("through.toml");
    let url = proxy.url(&db);
    edited(
        &config,
        &through,
        &[
            (db.url.as_str(), url.as_str()),
            ("interval = \"500ms\"", "interval = \"5s\""),
        ],
    );
    let me = db.server_id().await;
    let earlier = myjob::db::ServerId {
        started: me.started - 1000,
        ..me
    };
    let id = db.insert_abandoned_claim(&earlier.to_string()).await;
    let worker = Worker::start(&through, "1");
    db.wait_count(&format!("id = {id} AND status = 'done'"), 1, 40)
        .await;
    let log = worker.log_text();
    assert!(log.contains("reaper: stale claim put back"), "{log}");
    assert!(!log.contains("reconnecting at the next pass"), "{log}");
}
