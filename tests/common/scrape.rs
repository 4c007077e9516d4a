//! Scrapes of an instance's metrics endpoint: a plain HTTP/1.1 GET, and the value of one
//! sample in the text that comes back.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// A free port of 127.0.0.1 at the time of asking.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `[metrics] listen` for an instance "1" on a free port: the base is one below it.
pub fn listen_for_instance_1() -> (String, u16) {
    let port = free_port();
    (format!("listen = \"127.0.0.1:{}\"", port - 1), port)
}

/// One HTTP/1.1 request; returns the status code, the headers and the body.
pub fn get(port: u16, path: &str, accept: Option<&str>) -> (u16, String, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let accept = accept.map_or(String::new(), |a| format!("Accept: {a}\r\n"));
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{accept}Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, head.to_owned(), body.to_owned())
}

/// The value of the sample `name` (with its labels, as written) in a scrape's text.
pub fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.split(' ').next()?.parse().ok())
}

/// The value of `name` in a scrape of the instance on `port`, in the classic text format.
pub fn metric(port: u16, name: &str) -> Option<f64> {
    sample(&get(port, "/metrics", None).2, name)
}
