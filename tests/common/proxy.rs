//! A TCP proxy in front of the test server that a test can cut and restore. The database
//! "goes away" for the clients behind it (their connections are closed, new ones refused)
//! while the server itself keeps running for every other test.

use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

pub struct Proxy {
    pub port: u16,
    upstream: String,
    /// Cancelled by `down`: stops accepting and closes every connection made while up.
    up: Arc<Mutex<Option<CancellationToken>>>,
}

impl Proxy {
    /// A proxy on a free port of its own, down (nothing listens) until [`Proxy::up`].
    pub fn new() -> Proxy {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let opts = mysql_async::Opts::from_url(&super::server_url()).unwrap();
        Proxy {
            port,
            upstream: format!("{}:{}", opts.ip_or_hostname(), opts.tcp_port()),
            up: Arc::new(Mutex::new(None)),
        }
    }

    /// The test database's url, through the proxy.
    pub fn url(&self, db: &super::TestDb) -> String {
        let opts = mysql_async::Opts::from_url(&db.url).unwrap();
        format!(
            "mysql://{}:{}@127.0.0.1:{}/{}",
            opts.user().unwrap(),
            opts.pass().unwrap_or(""),
            self.port,
            opts.db_name().unwrap()
        )
    }

    /// Starts listening and forwarding.
    pub async fn up(&self) {
        let listener = TcpListener::bind(("127.0.0.1", self.port)).await.unwrap();
        let token = CancellationToken::new();
        *self.up.lock().unwrap() = Some(token.clone());
        let upstream = self.upstream.clone();
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
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(&upstream).await else {
                        return;
                    };
                    let (mut client, mut server) = (client, server);
                    tokio::select! {
                        _ = token.cancelled() => {}
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
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
