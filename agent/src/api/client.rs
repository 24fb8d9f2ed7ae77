//! A small blocking client of the state API for `top` and `run`: one GET over plain HTTP/1.1
//! (the agent serves loopback or a trusted network; TLS belongs to a proxy in front of it),
//! reading a whole JSON answer or the watch stream line by line. Chunked and close-delimited
//! bodies both work.

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::{SocketAddr, TcpStream, ToSocketAddrs},
    time::Duration,
};

use super::types::{Snapshot, WatchEvent, VERSION};

/// Why the agent could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The URL is not `http://HOST:PORT`.
    #[error(
        "{url}: not an agent address; give it as http://HOST:PORT (e.g. http://127.0.0.1:9617)"
    )]
    Url {
        /// What was given.
        url: String,
    },
    /// No connection.
    #[error("cannot reach the agent at {addr}")]
    Connect {
        /// Where.
        addr: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The connection broke or the answer is not HTTP.
    #[error("reading from the agent at {addr} failed")]
    Io {
        /// Where.
        addr: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// An answer other than 200.
    #[error("the agent at {addr} answered {status} to {path}: {body}")]
    Status {
        /// Where.
        addr: String,
        /// What was asked.
        path: String,
        /// HTTP status.
        status: u16,
        /// The body's first line (the API's messages say what to do).
        body: String,
    },
    /// The body is not the API's JSON.
    #[error(
        "the agent at {addr} did not answer with state API version {VERSION} JSON ({source}); \
         is it an slo-probe agent of this version?"
    )]
    Json {
        /// Where.
        addr: String,
        /// The parse error.
        #[source]
        source: serde_json::Error,
    },
    /// The stream ended.
    #[error("the agent at {addr} closed the watch stream")]
    Closed {
        /// Where.
        addr: String,
    },
}

/// An agent's address: `http://host:port`, `host:port`, with or without a trailing `/`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// `host:port` as given (the `Host` header).
    pub authority: String,
}

impl Endpoint {
    /// Parses `http://host:port[/]` or `host:port`.
    pub fn parse(url: &str) -> Result<Self, ClientError> {
        let err = || ClientError::Url {
            url: url.to_owned(),
        };
        let rest = url.strip_prefix("http://").unwrap_or(url);
        if rest.contains("://") {
            return Err(err());
        }
        let authority = rest.trim_end_matches('/');
        let (host, port) = authority.rsplit_once(':').ok_or_else(err)?;
        if host.is_empty() || port.parse::<u16>().is_err() || authority.contains('/') {
            return Err(err());
        }
        Ok(Self {
            authority: authority.to_owned(),
        })
    }

    /// The endpoint of a listen address.
    pub fn of(addr: SocketAddr) -> Self {
        Self {
            authority: addr.to_string(),
        }
    }

    /// `http://host:port`.
    pub fn url(&self) -> String {
        format!("http://{}", self.authority)
    }

    fn connect(&self, timeout: Duration) -> Result<TcpStream, ClientError> {
        let connect_err = |source| ClientError::Connect {
            addr: self.authority.clone(),
            source,
        };
        let addrs: Vec<SocketAddr> = self
            .authority
            .to_socket_addrs()
            .map_err(connect_err)?
            .collect();
        let mut last = std::io::Error::new(std::io::ErrorKind::NotFound, "no address");
        for a in addrs {
            match TcpStream::connect_timeout(&a, timeout) {
                Ok(s) => return Ok(s),
                Err(e) => last = e,
            }
        }
        Err(connect_err(last))
    }

    /// Sends `GET path` and reads the head; returns the body's reader.
    fn get(&self, path: &str, timeout: Duration) -> Result<Body, ClientError> {
        let io = |source| ClientError::Io {
            addr: self.authority.clone(),
            source,
        };
        let mut s = self.connect(timeout)?;
        s.set_read_timeout(Some(timeout)).map_err(io)?;
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: {}\r\nAccept: application/json\r\nConnection: \
             close\r\n\r\n",
            self.authority
        )
        .map_err(io)?;
        let mut r = BufReader::new(s);
        let mut line = String::new();
        r.read_line(&mut line).map_err(io)?;
        let status: u16 = line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| {
                io(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("not an HTTP answer: {:?}", line.trim_end()),
                ))
            })?;
        let mut chunked = false;
        let mut length = None;
        loop {
            line.clear();
            if r.read_line(&mut line).map_err(io)? == 0 || line.trim_end().is_empty() {
                break;
            }
            if let Some((k, v)) = line.split_once(':') {
                let (k, v) = (k.trim().to_ascii_lowercase(), v.trim());
                if k == "transfer-encoding" && v.eq_ignore_ascii_case("chunked") {
                    chunked = true;
                } else if k == "content-length" {
                    length = v.parse::<u64>().ok();
                }
            }
        }
        let mut body = Body {
            r,
            chunked,
            left: if chunked {
                0
            } else {
                length.unwrap_or(u64::MAX)
            },
            done: false,
        };
        if status != 200 {
            let mut text = String::new();
            let _ = body.by_ref().take(4096).read_to_string(&mut text);
            return Err(ClientError::Status {
                addr: self.authority.clone(),
                path: path.to_owned(),
                status,
                body: text.lines().next().unwrap_or_default().to_owned(),
            });
        }
        Ok(body)
    }

    /// `GET /api/v1/snapshot`.
    pub fn snapshot(&self, timeout: Duration) -> Result<Snapshot, ClientError> {
        let mut body = self.get("/api/v1/snapshot", timeout)?;
        let mut text = Vec::new();
        body.read_to_end(&mut text)
            .map_err(|source| ClientError::Io {
                addr: self.authority.clone(),
                source,
            })?;
        serde_json::from_slice(&text).map_err(|source| ClientError::Json {
            addr: self.authority.clone(),
            source,
        })
    }

    /// `GET /api/v1/watch`: the stream of events. `timeout` bounds the connection and each
    /// read (the agent sends a line every tick).
    pub fn watch(&self, timeout: Duration) -> Result<Watch, ClientError> {
        Ok(Watch {
            body: BufReader::new(self.get("/api/v1/watch", timeout)?),
            addr: self.authority.clone(),
        })
    }
}

/// A response body: plain (up to a length or the end of the connection) or chunked.
struct Body {
    r: BufReader<TcpStream>,
    chunked: bool,
    /// Bytes left in the body (plain) or in the current chunk (chunked).
    left: u64,
    done: bool,
}

impl Read for Body {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.done || buf.is_empty() {
            return Ok(0);
        }
        if self.chunked && self.left == 0 {
            let mut line = String::new();
            // The CRLF after the previous chunk, then the size line.
            while line.trim().is_empty() {
                line.clear();
                if self.r.read_line(&mut line)? == 0 {
                    self.done = true;
                    return Ok(0);
                }
            }
            let size = line.trim().split(';').next().unwrap_or_default();
            self.left = u64::from_str_radix(size, 16).map_err(|_| {
                std::io::Error::new(std::io::ErrorKind::InvalidData, "bad chunk size")
            })?;
            if self.left == 0 {
                self.done = true;
                return Ok(0);
            }
        }
        let want = buf
            .len()
            .min(usize::try_from(self.left).unwrap_or(usize::MAX));
        let n = self.r.read(&mut buf[..want])?;
        if n == 0 {
            self.done = true;
        }
        self.left = self.left.saturating_sub(n as u64);
        if !self.chunked && self.left == 0 {
            self.done = true;
        }
        Ok(n)
    }
}

/// The watch stream of one agent.
pub struct Watch {
    body: BufReader<Body>,
    addr: String,
}

impl Watch {
    /// The next event (events of a type this client does not know are skipped).
    pub fn next_event(&mut self) -> Result<WatchEvent, ClientError> {
        let mut line = String::new();
        loop {
            line.clear();
            let n = self
                .body
                .read_line(&mut line)
                .map_err(|source| ClientError::Io {
                    addr: self.addr.clone(),
                    source,
                })?;
            if n == 0 {
                return Err(ClientError::Closed {
                    addr: self.addr.clone(),
                });
            }
            if line.trim().is_empty() {
                continue;
            }
            match serde_json::from_str(&line) {
                Ok(WatchEvent::Unknown) => continue,
                Ok(e) => return Ok(e),
                Err(source) => {
                    return Err(ClientError::Json {
                        addr: self.addr.clone(),
                        source,
                    })
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        for ok in [
            "http://127.0.0.1:9617",
            "http://node-3:9617/",
            "localhost:1",
            "[::1]:9617",
        ] {
            assert!(Endpoint::parse(ok).is_ok(), "{ok}");
        }
        for bad in ["https://x:1", "http://x", "x:port", "http://x:1/api", ":1"] {
            let e = Endpoint::parse(bad).expect_err(bad).to_string();
            assert!(e.contains("http://HOST:PORT"), "{e}");
        }
        assert_eq!(
            Endpoint::parse("http://a:1/").expect("ok").url(),
            "http://a:1"
        );
    }

    /// One HTTP answer from a thread, for the reader.
    fn serve_once(answer: Vec<u8>) -> SocketAddr {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = l.local_addr().expect("addr");
        std::thread::spawn(move || {
            if let Ok((mut s, _)) = l.accept() {
                // The whole request first: answering and closing after its first part left the
                // client writing the rest into a closed socket (EPIPE, seen once in CI).
                let mut req = Vec::new();
                let mut buf = [0u8; 1024];
                while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => req.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = s.write_all(&answer);
            }
        });
        addr
    }

    #[test]
    fn chunked_watch_lines_and_errors_are_read() {
        let mut answer = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
        // A line split over two chunks, a type this client does not know, two lines in one.
        for chunk in [
            "{\"type\":\"full\",",
            "\"version\":1}\n",
            "{\"type\":\"new-kind\",\"x\":1}\n",
            "{\"type\":\"delta\",\"version\":1,\"taken_at_ns\":5}\n\n",
        ] {
            answer.extend(format!("{:x}\r\n{chunk}\r\n", chunk.len()).bytes());
        }
        answer.extend(b"0\r\n\r\n");
        let addr = serve_once(answer);
        let mut w = Endpoint::of(addr)
            .watch(Duration::from_secs(2))
            .expect("watch");
        assert!(matches!(w.next_event(), Ok(WatchEvent::Full(_))));
        match w.next_event() {
            Ok(WatchEvent::Delta(d)) => assert_eq!(d.taken_at_ns, 5),
            other => panic!("{other:?}"),
        }
        assert!(matches!(w.next_event(), Err(ClientError::Closed { .. })));

        let body = "{\"message\":\"nope\"}\n";
        let addr = serve_once(
            format!(
                "HTTP/1.1 403 Forbidden\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            )
            .into_bytes(),
        );
        let e = Endpoint::of(addr)
            .snapshot(Duration::from_secs(2))
            .expect_err("403");
        assert!(e.to_string().contains("403"), "{e}");
        assert!(e.to_string().contains("nope"), "{e}");
    }
}
