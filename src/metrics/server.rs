//! `GET /metrics` on the instance's own port, served from the daemon's tokio runtime by
//! hyper. Any other path is 404, any other method 405.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{ACCEPT, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::Metrics;

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
const CLASSIC: &str = "text/plain; version=0.0.4; charset=utf-8";
/// The most a scrape waits for the queue gauges' reading.
const GAUGES_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Binds the endpoint's address. At start, so that a port in use is an error before READY=1.
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// Serves scrapes until `shutdown` fires.
pub async fn serve(listener: TcpListener, metrics: Arc<Metrics>, shutdown: CancellationToken) {
    // The loop's one exit is the shutdown token; a failed accept is tried again.
    loop {
        let (stream, _) = tokio::select! {
            _ = shutdown.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    debug!("metrics: accept failed: {e}");
                    continue;
                }
            },
        };
        let metrics = metrics.clone();
        tokio::spawn(async move {
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
            if let Err(e) = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                debug!("metrics: a scrape's connection failed: {e}");
            }
        });
    }
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
