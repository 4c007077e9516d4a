//! `GET /metrics` on the instance's own port, served from the daemon's tokio runtime by
//! hyper. Any other path is 404, any other method 405.
//!
//! The port is open to every local user (127.0.0.1 by default), so it is bounded as a
//! neighbour's port must be: it may never cost the worker its handlers' descriptors, its CPU
//! or its memory. A connection has [`HEADER_READ_TIMEOUT`] to send each request's head (and
//! no longer to sit idle between requests), [`CONNECTION_LIFETIME`] in all, and
//! [`MAX_HEADER_BYTES`] of head; at most [`max_connections`] are open at once, and one more is
//! closed as soon as it is accepted, which keeps the kernel's queue of them short; a failed
//! accept (out of descriptors) pauses the port rather than spin.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{ACCEPT, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::Metrics;

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
const CLASSIC: &str = "text/plain; version=0.0.4; charset=utf-8";
/// The most a scrape waits for the queue gauges' reading.
const GAUGES_WAIT: Duration = Duration::from_secs(2);

/// How long a connection has to send a request's head. hyper starts the same timer when it
/// waits for the next request of a kept-alive connection, so it is the idle timeout too; a
/// scraper sends its request at once, and reconnects for its next scrape.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// The most a connection lives, whatever it does: one that reads its answer a byte at a
/// time is closed all the same.
const CONNECTION_LIFETIME: Duration = Duration::from_secs(30);
/// The most bytes of a request's head (a scrape's is a few hundred); a longer one gets 431.
const MAX_HEADER_BYTES: usize = 8 * 1024;
/// hyper's read buffer, at the least hyper allows: the head, and a little of what follows.
const MAX_BUFFER_BYTES: usize = 16 * 1024;
/// The most connections open at once, with descriptors to spare.
const MAX_CONNECTIONS: usize = 64;
/// How often a line about a full port or a failing accept may be said.
const SAY_EVERY: Duration = Duration::from_secs(60);
/// The pauses after failed accepts: from the first to the last, doubling.
const PAUSE_FIRST: Duration = Duration::from_millis(10);
const PAUSE_LAST: Duration = Duration::from_secs(1);

/// Binds the endpoint's address. At start, so that a port in use is an error before READY=1.
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// The most connections the port holds open: [`MAX_CONNECTIONS`], or a sixteenth of the
/// descriptors the process may open when that is fewer (16 under `ulimit -n 256`), and at
/// least 4. The rest are the handlers': each job's process takes three pipes.
pub fn max_connections() -> usize {
    use nix::sys::resource::{getrlimit, Resource};
    let soft = getrlimit(Resource::RLIMIT_NOFILE).map_or(1024, |(soft, _)| soft);
    let share = usize::try_from(soft / 16).unwrap_or(usize::MAX);
    share.clamp(4, MAX_CONNECTIONS)
}

/// A line said at most once per [`SAY_EVERY`].
#[derive(Default)]
struct Said(Option<Instant>);

impl Said {
    /// Whether to say it now; if so, the next time is a [`SAY_EVERY`] away.
    fn due(&mut self) -> bool {
        let due = self.0.is_none_or(|at| at.elapsed() >= SAY_EVERY);
        if due {
            self.0 = Some(Instant::now());
        }
        due
    }
}

/// The pause after a failed accept: doubling while they fail, from nothing after a success.
#[derive(Default)]
struct Pause(Option<Duration>);

impl Pause {
    fn failed(&mut self) -> Duration {
        let next = self.0.map_or(PAUSE_FIRST, |p| (p * 2).min(PAUSE_LAST));
        self.0 = Some(next);
        next
    }

    fn accepted(&mut self) {
        self.0 = None;
    }
}

/// Serves scrapes until `shutdown` fires.
pub async fn serve(listener: TcpListener, metrics: Arc<Metrics>, shutdown: CancellationToken) {
    let most = max_connections();
    let open = Arc::new(Semaphore::new(most));
    let (mut full, mut failing, mut pause) = (Said::default(), Said::default(), Pause::default());
    // The loop's one exit is the shutdown token.
    loop {
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _)) => {
                pause.accepted();
                stream
            }
            Err(e) => {
                // Out of descriptors (EMFILE), or of kernel memory: accepting again at once
                // would fail again, and spin. A connection that died in the queue
                // (ECONNABORTED) costs one short pause.
                let wait = pause.failed();
                if failing.due() {
                    warn!(
                        "metrics: cannot accept a connection ({e}): the port pauses up to {}ms at a time until it can",
                        PAUSE_LAST.as_millis()
                    );
                }
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(wait) => {}
                }
                continue;
            }
        };
        let Ok(permit) = open.clone().try_acquire_owned() else {
            if full.due() {
                warn!(
                    "metrics: {most} connections are open, the most the port takes: new ones are closed until some end (a scraper that keeps its connections open, or a local user holding the port)"
                );
            }
            drop(stream);
            continue;
        };
        tokio::spawn(connection(stream, permit, metrics.clone()));
    }
}

/// One connection, until it closes or its time is up; `permit` is its place among the open.
async fn connection(stream: TcpStream, permit: OwnedSemaphorePermit, metrics: Arc<Metrics>) {
    let service = service_fn(move |req| {
        let metrics = metrics.clone();
        async move {
            // The leader's queue gauges are read from the database before the scrape
            // is encoded (cached: see `queues`).
            // In a task of its own: a scraper that hangs up mid-reading must not
            // leave the leader's connection in the middle of a statement. A slow
            // reading (a database away) is not waited for past GAUGES_WAIT: the
            // scrape gets the last one, and the instance's own figures in time.
            if req.uri().path() == "/metrics" && req.method() == Method::GET {
                if let Some(g) = metrics.queue_gauges.clone() {
                    let m = metrics.clone();
                    let reading = tokio::spawn(async move { g.refresh(&m).await });
                    let _ = tokio::time::timeout(GAUGES_WAIT, reading).await;
                }
            }
            Ok::<_, Infallible>(answer(&metrics, &req))
        }
    });
    let served = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .max_header_size(MAX_HEADER_BYTES)
        .max_buf_size(MAX_BUFFER_BYTES)
        .serve_connection(TokioIo::new(stream), service);
    match tokio::time::timeout(CONNECTION_LIFETIME, served).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => debug!("metrics: a scrape's connection failed: {e}"),
        Err(_) => debug!("metrics: a connection open for {CONNECTION_LIFETIME:?} was closed"),
    }
    drop(permit);
}

fn answer(metrics: &Metrics, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    let reply = |status: StatusCode, kind: &str, body: String| {
        let mut r = Response::new(Full::new(Bytes::from(body)));
        *r.status_mut() = status;
        if let Ok(v) = kind.parse() {
            r.headers_mut().insert(CONTENT_TYPE, v);
        }
        r
    };
    if req.uri().path() != "/metrics" {
        return reply(
            StatusCode::NOT_FOUND,
            "text/plain",
            "not found: try /metrics\n".into(),
        );
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "GET only\n".into(),
        );
    }
    let openmetrics = req
        .headers()
        .get(ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("application/openmetrics-text"));
    match metrics.encode(openmetrics) {
        Ok(text) => reply(
            StatusCode::OK,
            if openmetrics { OPENMETRICS } else { CLASSIC },
            text,
        ),
        Err(_) => reply(
            StatusCode::INTERNAL_SERVER_ERROR,
            "text/plain",
            "cannot encode the metrics\n".into(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/monitoring.md gives the port's bounds in words: they must be these.
    #[test]
    fn the_docs_give_the_ports_bounds() {
        let readme = include_str!("../../docs/monitoring.md").replace('\n', " ");
        for said in [
            format!(
                "a connection has {} s to send each request's head",
                HEADER_READ_TIMEOUT.as_secs()
            ),
            format!(
                "{} s in all, and {} KiB of head",
                CONNECTION_LIFETIME.as_secs(),
                MAX_HEADER_BYTES / 1024
            ),
            format!("at most {MAX_CONNECTIONS} connections are open at once"),
            format!(
                "from {} ms up to {} s",
                PAUSE_FIRST.as_millis(),
                PAUSE_LAST.as_secs()
            ),
            format!("with a warning at most once a {}", "minute"),
        ] {
            assert!(readme.contains(&said), "docs/monitoring.md lacks {said:?}");
        }
        assert_eq!(SAY_EVERY, Duration::from_secs(60));
    }

    #[test]
    fn the_pause_doubles_to_its_cap_and_starts_again_after_a_success() {
        let mut p = Pause::default();
        let waits: Vec<Duration> = (0..9).map(|_| p.failed()).collect();
        assert_eq!(waits[0], PAUSE_FIRST);
        assert_eq!(waits[1], PAUSE_FIRST * 2);
        assert_eq!(*waits.last().unwrap(), PAUSE_LAST);
        p.accepted();
        assert_eq!(p.failed(), PAUSE_FIRST);
    }
}
