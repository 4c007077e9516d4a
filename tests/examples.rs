//! The SMS example's PHP handler (examples/sms/send-sms.php, docs/migrating.md), run by a real worker against a
//! small HTTP gateway on localhost: sent, retried on a 503 until failed, failed at once on a
//! bad payload. Needs `php` (tests/run installs php-cli when it is missing).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use crate::common::{TestDb, Worker};

/// Answers 503 for the phone number +1503 and 200 for any other; keeps every request.
fn gateway() -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/send", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut reader = BufReader::new(stream);
            let mut head = String::new();
            let mut length = 0;
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    length = v.trim().parse().unwrap_or(0);
                }
                head.push_str(&line);
            }
            let mut body = vec![0; length];
            let _ = reader.read_exact(&mut body);
            let body = String::from_utf8_lossy(&body).into_owned();
            let status = if body.contains("+1503") {
                "503 Service Unavailable"
            } else {
                "200 OK"
            };
            let _ = write!(
                reader.get_mut(),
                "HTTP/1.1 {status}\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
            );
            log.lock().unwrap().push(format!("{head}\n{body}"));
        }
    });
    (url, seen)
}

#[tokio::test(flavor = "multi_thread")]
async fn the_php_sms_handler_sends_retries_and_fails() {
    assert!(
        std::process::Command::new("php")
            .arg("--version")
            .output()
            .is_ok(),
        "php is not installed (tests/run installs php-cli)"
    );
    let db = TestDb::new("php_sms").await;
    let (url, seen) = gateway();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/sms/send-sms.php");
    let config = db.path("sms.toml");
    std::fs::write(
        &config,
        format!(
            "[metrics]\nlisten = \"\"\n\n[database]\nurl = \"{}\"\n[worker]\npoll_interval = \"100ms\"\n\
             [[queue]]\nname = \"sms\"\ncommand = [\"{script}\"]\nmax_attempts = 2\n\
             backoff = \"100ms\"\nbackoff_max = \"100ms\"\npass_env = [\"SMS_GATEWAY_URL\"]\n",
            db.url
        ),
    )
    .unwrap();
    let ids = db
        .insert(
            "sms",
            &[
                r#"{"phone": "+15550100", "content": "hello"}"#,
                "not json",
                r#"{"phone": "+1503", "content": "x"}"#,
            ],
        )
        .await;
    let w = Worker::start_with_env(&config, "1", &[("SMS_GATEWAY_URL", &url)]);
    db.wait_count("status IN ('done', 'failed')", 3, 60).await;

    let (status, attempts, _, _, _) = db.job(ids[0]).await;
    assert_eq!((status.as_str(), attempts), ("done", 1));
    let (status, attempts, _, _, error) = db.job(ids[1]).await;
    assert_eq!(
        (status.as_str(), attempts),
        ("failed", 1),
        "a bad payload is not retried"
    );
    assert!(error.unwrap().contains("payload is not"));
    let (status, attempts, _, _, error) = db.job(ids[2]).await;
    assert_eq!((status.as_str(), attempts), ("failed", 2));
    assert!(error.unwrap().contains("503 Service Unavailable"));

    let seen = seen.lock().unwrap();
    let sent = seen
        .iter()
        .find(|r| r.contains("+15550100"))
        .expect("the gateway got the SMS");
    assert!(
        sent.contains(&format!("Idempotency-Key: myjob-{}", ids[0])),
        "{sent}"
    );
    assert!(sent.contains(r#""text":"hello""#), "{sent}");
    assert_eq!(
        seen.iter().filter(|r| r.contains("+1503")).count(),
        2,
        "one request per attempt"
    );
    assert!(w.log_text().contains("sent to +15550100"));
}
