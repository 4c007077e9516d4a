//! A TCP proxy in front of the test server that a test can cut and restore. The database
//! "goes away" for the clients behind it (their connections are closed, new ones refused)
//! while the server itself keeps running for every other test.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// A fault the proxy applies once, to the first packet from a client that holds a pattern
/// (a statement's text, say): a network that holds one packet back, or breaks one connection.
#[derive(Clone, Debug)]
pub enum Fault {
    /// Forward it only after this long.
    Stall(&'static str, Duration),
    /// Close that connection instead of forwarding it.
    Cut(&'static str),
    /// Forward it, then close that connection before the server's answer comes back: a
    /// statement that ran, whose client never learns it. The first `n` packets that match
    /// pass untouched.
    CutAfter(&'static str, usize),
}

pub struct Proxy {
    /// Where it listens: 127.0.0.1, or a host's gateway (see `common::hosts`).
    pub listen: std::net::IpAddr,
    pub port: u16,
    upstream: String,
    /// Hand clients a connection id of the proxy's own in the server's greeting, as a proxy
    /// that multiplexes client sessions over server connections does (ProxySQL, say).
    own_ids: bool,
    /// Applied once, then gone (see [`Fault`]).
    fault: Arc<Mutex<Option<Fault>>>,
    /// Closes a connection whose client sent nothing for this long, as proxies and load
    /// balancers with an idle timeout do.
    idle: Option<Duration>,
    /// While set, nothing passes either way and nothing is closed: a network partition, or a
    /// host gone without a reset, as both ends see it.
    frozen: Arc<AtomicBool>,
    /// Cancelled by `down`: stops accepting and closes every connection made while up.
    up: Arc<Mutex<Option<CancellationToken>>>,
}

impl Proxy {
    /// A proxy on a free port of its own, down (nothing listens) until [`Proxy::up`].
    pub fn new() -> Proxy {
        Proxy::between("127.0.0.1".parse().unwrap(), &super::server_url())
    }

    /// A proxy listening on `listen` (an address of this machine's) for the server of `url`.
    pub fn between(listen: std::net::IpAddr, url: &str) -> Proxy {
        let port = std::net::TcpListener::bind((listen, 0))
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let opts = mysql_async::Opts::from_url(url).unwrap();
        Proxy {
            listen,
            port,
            upstream: format!("{}:{}", opts.ip_or_hostname(), opts.tcp_port()),
            own_ids: false,
            fault: Arc::new(Mutex::new(None)),
            idle: None,
            frozen: Arc::new(AtomicBool::new(false)),
            up: Arc::new(Mutex::new(None)),
        }
    }

    /// A proxy that gives clients connection ids of its own (see `own_ids`).
    pub fn multiplexing() -> Proxy {
        let mut proxy = Proxy::new();
        proxy.own_ids = true;
        proxy
    }

    /// A proxy that closes connections idle for `idle` (see `idle`).
    pub fn idle_timeout(idle: Duration) -> Proxy {
        let mut proxy = Proxy::new();
        proxy.idle = Some(idle);
        proxy
    }

    /// Stops every byte, both ways, on every connection, without closing any (see `frozen`).
    pub fn freeze(&self) {
        self.frozen.store(true, Ordering::SeqCst);
    }

    /// Lets bytes pass again.
    pub fn thaw(&self) {
        self.frozen.store(false, Ordering::SeqCst);
    }

    /// Arms a fault for the next packet that matches it (see [`Fault`]).
    pub fn arm(&self, fault: Fault) {
        *self.fault.lock().unwrap() = Some(fault);
    }

    /// Whether the armed fault has been applied.
    pub fn fired(&self) -> bool {
        self.fault.lock().unwrap().is_none()
    }

    /// The test database's url, through the proxy.
    pub fn url(&self, db: &super::TestDb) -> String {
        let opts = mysql_async::Opts::from_url(&db.url).unwrap();
        format!(
            "mysql://{}:{}@{}:{}/{}",
            opts.user().unwrap(),
            opts.pass().unwrap_or(""),
            self.listen,
            self.port,
            opts.db_name().unwrap()
        )
    }

    /// Starts listening and forwarding.
    pub async fn up(&self) {
        let listener = TcpListener::bind((self.listen, self.port)).await.unwrap();
        let token = CancellationToken::new();
        *self.up.lock().unwrap() = Some(token.clone());
        let upstream = self.upstream.clone();
        let own_ids = self.own_ids;
        let fault = self.fault.clone();
        let idle = self.idle;
        let frozen = self.frozen.clone();
        tokio::spawn(async move {
            loop {
                let (client, _) = tokio::select! {
                    _ = token.cancelled() => return,
                    accepted = listener.accept() => match accepted {
                        Ok(a) => a,
                        Err(_) => continue,
                    },
                };
                let token = token.clone();
                let upstream = upstream.clone();
                let fault = fault.clone();
                let frozen = frozen.clone();
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(&upstream).await else {
                        return;
                    };
                    let (mut client, mut server) = (client, server);
                    if own_ids
                        && pass_greeting_with_own_id(&mut server, &mut client)
                            .await
                            .is_err()
                    {
                        return;
                    }
                    let (from_server, to_server) = server.into_split();
                    let (from_client, to_client) = client.into_split();
                    let none = Mutex::new(None);
                    tokio::select! {
                        _ = token.cancelled() => {}
                        _ = forward(from_server, to_client, &none, None, &frozen) => {}
                        _ = forward(from_client, to_server, &fault, idle, &frozen) => {}
                    }
                });
            }
        });
    }

    /// Closes every connection through the proxy and refuses new ones.
    pub fn down(&self) {
        if let Some(token) = self.up.lock().unwrap().take() {
            token.cancel();
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.down();
    }
}

/// Copies one direction's bytes, applying the armed fault to the first packet that matches
/// it, and holding them while the proxy is frozen.
async fn forward(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    fault: &Mutex<Option<Fault>>,
    idle: Option<Duration>,
    frozen: &AtomicBool,
) -> std::io::Result<()> {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        while frozen.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let read = from.read(&mut buf);
        let n = match idle {
            None => read.await?,
            Some(idle) => match tokio::time::timeout(idle, read).await {
                Ok(n) => n?,
                Err(_) => return Ok(()),
            },
        };
        if n == 0 {
            return Ok(());
        }
        let chunk = &buf[..n];
        let fired = {
            let mut armed = fault.lock().unwrap();
            let hit = match armed.as_mut() {
                Some(Fault::Stall(p, _)) | Some(Fault::Cut(p)) => contains(chunk, p.as_bytes()),
                Some(Fault::CutAfter(p, skip)) if contains(chunk, p.as_bytes()) => {
                    if *skip == 0 {
                        true
                    } else {
                        *skip -= 1;
                        false
                    }
                }
                Some(Fault::CutAfter(..)) | None => false,
            };
            if hit {
                armed.take()
            } else {
                None
            }
        };
        match fired {
            Some(Fault::Stall(_, delay)) => tokio::time::sleep(delay).await,
            Some(Fault::Cut(_)) => return Ok(()),
            Some(Fault::CutAfter(..)) => {
                // Closed at once, so that the answer is not passed back: the server has read
                // the statement whole and runs it all the same.
                to.write_all(chunk).await?;
                return Ok(());
            }
            None => {}
        }
        // Read just as the proxy froze: held too.
        while frozen.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        to.write_all(chunk).await?;
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// Reads the server's greeting (protocol 10: header, version byte, version string and NUL,
/// then the 4-byte connection id) and forwards it with the id changed.
async fn pass_greeting_with_own_id(
    server: &mut TcpStream,
    client: &mut TcpStream,
) -> std::io::Result<()> {
    let mut header = [0u8; 4];
    server.read_exact(&mut header).await?;
    let len = u32::from_le_bytes([header[0], header[1], header[2], 0]) as usize;
    let mut payload = vec![0u8; len];
    server.read_exact(&mut payload).await?;
    if let Some(nul) = payload.iter().skip(1).position(|&b| b == 0) {
        let at = 1 + nul + 1;
        if payload.len() >= at + 4 {
            let id = u32::from_le_bytes(payload[at..at + 4].try_into().unwrap());
            payload[at..at + 4].copy_from_slice(&id.wrapping_add(1000).to_le_bytes());
        }
    }
    client.write_all(&header).await?;
    client.write_all(&payload).await
}
