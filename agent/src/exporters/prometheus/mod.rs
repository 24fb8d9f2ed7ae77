//! Prometheus text exposition (format 0.0.4) of the latest snapshot, served over HTTP on
//! loopback by default. The families, labels and values are the metric model's
//! ([`crate::exporters::model`]); [`TextSink`] writes them.

mod text;

use std::{
    collections::BTreeMap,
    convert::Infallible,
    net::SocketAddr,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use http_body_util::{BodyExt as _, Full};
use hyper::{body::Bytes, server::conn::http1, service::service_fn, Method, Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use slo_probe_core::snapshot::Snapshot;
use tokio::{
    net::{TcpListener, TcpSocket},
    sync::{oneshot, watch},
    task::JoinHandle,
};

pub use self::text::TextSink;
use super::{
    model::{self, Options},
    Exporter,
};

/// Connections served at once; a new one beyond this closes the oldest.
pub const MAX_HTTP_CONNECTIONS: usize = 64;

/// Listen backlog of the endpoint (the kernel caps it at `net.core.somaxconn`).
const ACCEPT_BACKLOG: u32 = 4096;

/// Time a client has to send the headers of a request.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);

/// Longest life of one connection, keep-alive included (a scraper reconnects).
pub const CONNECTION_LIFETIME: Duration = Duration::from_secs(120);

/// Content type of the text exposition format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Errors of the Prometheus endpoint.
#[derive(Debug, thiserror::Error)]
pub enum PrometheusError {
    /// The listen address could not be bound.
    #[error(
        "cannot listen on {addr} for Prometheus metrics: {source}; choose another address with \
         --listen or prometheus.listen in the config"
    )]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

/// Renders a snapshot in the text exposition format.
pub fn render(snapshot: &Snapshot, per_thread: bool) -> String {
    let mut out = String::with_capacity(16 * 1024);
    model::walk(
        snapshot,
        Options { per_thread },
        &mut TextSink::new(&mut out),
    );
    out
}

/// A bound Prometheus endpoint, not yet serving.
pub struct PrometheusServer {
    listener: TcpListener,
    per_thread: bool,
    api: Arc<crate::api::Api>,
}

impl PrometheusServer {
    /// Binds the listen address (port 0 picks a free port).
    pub async fn bind(addr: SocketAddr, per_thread: bool) -> Result<Self, PrometheusError> {
        // A deep accept queue: a burst of connections (most of them closed again at once by
        // the connection cap) must not make the kernel drop a scraper's SYN (a 1 s retry).
        let bind = || -> std::io::Result<TcpListener> {
            let socket = if addr.is_ipv4() {
                TcpSocket::new_v4()?
            } else {
                TcpSocket::new_v6()?
            };
            socket.set_reuseaddr(true)?;
            socket.bind(addr)?;
            socket.listen(ACCEPT_BACKLOG)
        };
        let listener = bind().map_err(|source| PrometheusError::Bind { addr, source })?;
        Ok(Self {
            listener,
            per_thread,
            api: Arc::default(),
        })
    }

    /// Serves the state API (`/api/v1`, [`crate::api`]) with these settings beside the metrics
    /// (by default: read-only, without the agent's host name or shim socket).
    pub fn with_api(mut self, api: crate::api::Api) -> Self {
        self.api = Arc::new(api);
        self
    }

    /// The address actually bound.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves `/metrics` and `/api/v1` from the latest snapshot until `shutdown` turns true. Each
    /// connection has [`HEADER_TIMEOUT`] to send a request's headers and lives at most
    /// [`CONNECTION_LIFETIME`]; beyond [`MAX_HTTP_CONNECTIONS`] at once a new connection closes
    /// the oldest, so idle or slow clients cannot lock scrapers out or use up descriptors.
    pub async fn serve(
        self,
        snapshots: watch::Receiver<Arc<Snapshot>>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let live: Arc<Mutex<BTreeMap<u64, Live>>> = Arc::default();
        let mut next_id = 0u64;
        let cache = RenderCache::start(snapshots.clone(), self.per_thread);
        loop {
            tokio::select! {
                accepted = self.listener.accept() => {
                    let stream = match accepted {
                        Ok((stream, _)) => stream,
                        Err(e) => {
                            // Out of descriptors, most likely: do not spin on it.
                            log::debug!("Prometheus accept failed: {e}");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    };
                    next_id += 1;
                    let id = next_id;
                    let (close_tx, close_rx) = oneshot::channel();
                    let requests = Arc::new(AtomicU64::new(0));
                    if let Ok(mut l) = live.lock() {
                        while l.len() >= MAX_HTTP_CONNECTIONS {
                            // Dropping its sender closes a connection.
                            let Some(victim) = evictee(&l) else { break };
                            l.remove(&victim);
                        }
                        l.insert(
                            id,
                            Live {
                                fd: std::os::fd::AsRawFd::as_raw_fd(&stream),
                                requests: requests.clone(),
                                _close: close_tx,
                            },
                        );
                    }
                    let snapshots = snapshots.clone();
                    let per_thread = self.per_thread;
                    let live = live.clone();
                    let cache = cache.clone();
                    let api = self.api.clone();
                    tokio::spawn(async move {
                        let service = service_fn(move |req: Request<hyper::body::Incoming>| {
                            requests.fetch_add(1, Ordering::Relaxed);
                            let snapshots = snapshots.clone();
                            let api = api.clone();
                            let cached = (req.method() == Method::GET
                                && req.uri().path() == "/metrics")
                                .then(|| cache.get())
                                .flatten();
                            async move {
                                if req.uri().path().starts_with("/api/") {
                                    return Ok::<_, Infallible>(
                                        crate::api::handle(req, api, snapshots).await,
                                    );
                                }
                                let snapshot = snapshots.borrow().clone();
                                Ok(match cached {
                                    Some(body) => metrics_response(body),
                                    None => respond(&req, &snapshot, per_thread),
                                }
                                .map(|b| b.boxed()))
                            }
                        });
                        let conn = http1::Builder::new()
                            .timer(TokioTimer::new())
                            .header_read_timeout(HEADER_TIMEOUT)
                            .serve_connection(TokioIo::new(stream), service);
                        // A client that hangs up mid-response is not the agent's problem.
                        tokio::select! {
                            _ = conn => {}
                            _ = close_rx => {}
                            _ = tokio::time::sleep(CONNECTION_LIFETIME) => {}
                        }
                        if let Ok(mut l) = live.lock() {
                            l.remove(&id);
                        }
                    });
                }
                _ = shutdown.changed() => break,
            }
        }
    }
}

impl Exporter for PrometheusServer {
    fn name(&self) -> &'static str {
        "prometheus"
    }

    fn start(
        self: Box<Self>,
        snapshots: watch::Receiver<Arc<Snapshot>>,
        shutdown: watch::Receiver<bool>,
    ) -> JoinHandle<()> {
        tokio::spawn((*self).serve(snapshots, shutdown))
    }
}

/// A connection being served.
struct Live {
    /// Its socket (for `FIONREAD`; the entry goes before the socket closes).
    fd: std::os::fd::RawFd,
    /// Requests it has sent so far.
    requests: Arc<AtomicU64>,
    /// Dropped to close it.
    _close: oneshot::Sender<()>,
}

/// Which connection a new one replaces when [`MAX_HTTP_CONNECTIONS`] are open: the oldest that
/// has had no request and has nothing waiting to be read (idle, or slow: what it sent was read
/// and is no request yet; a scraper's request waits in its socket until it is read), else the
/// oldest that was served and has nothing waiting (keep-alive), else the oldest.
fn evictee(live: &BTreeMap<u64, Live>) -> Option<u64> {
    let waiting = |c: &Live| {
        let mut n: libc::c_int = 0;
        // SAFETY: FIONREAD writes one int; on a descriptor that is no longer this socket it
        // fails or answers for another file, which only changes the choice.
        let rc = unsafe { libc::ioctl(c.fd, libc::FIONREAD, &mut n) };
        rc == 0 && n > 0
    };
    let quiet = live
        .iter()
        .find(|(_, c)| c.requests.load(Ordering::Relaxed) == 0 && !waiting(c));
    let served = || {
        live.iter()
            .find(|(_, c)| c.requests.load(Ordering::Relaxed) > 0 && !waiting(c))
    };
    quiet
        .or_else(served)
        .or_else(|| live.iter().next())
        .map(|(&id, _)| id)
}

/// `/metrics` of the latest snapshot, rendered once per snapshot off the I/O thread (a
/// blocking-pool thread), so that a scrape costs a copy and many scrapers cost one render per
/// tick. A scrape that comes while the latest snapshot is being rendered gets the previous
/// one's (as if it had come a few milliseconds earlier); only a scrape before the first render
/// renders itself.
#[derive(Clone)]
struct RenderCache {
    latest: Arc<Mutex<Option<Bytes>>>,
}

impl RenderCache {
    fn start(mut snapshots: watch::Receiver<Arc<Snapshot>>, per_thread: bool) -> Self {
        let cache = Self {
            latest: Arc::default(),
        };
        let latest = cache.latest.clone();
        tokio::spawn(async move {
            loop {
                let snap = snapshots.borrow_and_update().clone();
                let Ok(body) =
                    tokio::task::spawn_blocking(move || Bytes::from(render(&snap, per_thread)))
                        .await
                else {
                    break;
                };
                if let Ok(mut l) = latest.lock() {
                    *l = Some(body);
                }
                if snapshots.changed().await.is_err() {
                    break;
                }
            }
        });
        cache
    }

    /// The latest rendering done.
    fn get(&self) -> Option<Bytes> {
        let l = self.latest.lock().ok()?;
        l.clone()
    }
}

fn metrics_response(body: Bytes) -> Response<Full<Bytes>> {
    Response::builder()
        .status(200)
        .header("content-type", CONTENT_TYPE)
        .body(Full::new(body))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))
}

fn respond<B>(req: &Request<B>, snapshot: &Snapshot, per_thread: bool) -> Response<Full<Bytes>> {
    let (status, content_type, body) = match (req.method(), req.uri().path()) {
        (&Method::GET, "/metrics") => (200, CONTENT_TYPE, render(snapshot, per_thread)),
        (&Method::GET, "/healthz") => (200, "text/plain", "ok\n".to_owned()),
        (&Method::GET, "/") => (
            200,
            "text/plain",
            "slo-probe agent\n  /metrics           Prometheus text exposition\n  /healthz           \
             liveness\n  /api/v1/snapshot   the state as JSON\n  /api/v1/watch      the state, then \
             its changes each tick (NDJSON)\n"
                .to_owned(),
        ),
        _ => (404, "text/plain", "not found; try /metrics\n".to_owned()),
    };
    Response::builder()
        .status(status)
        .header("content-type", content_type)
        .body(Full::new(Bytes::from(body)))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))
}

#[cfg(test)]
mod tests;
