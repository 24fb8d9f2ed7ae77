//! Prometheus text exposition (format 0.0.4) of the latest snapshot, served over HTTP on
//! loopback by default. The families, labels and values are the metric model's
//! ([`crate::exporters::model`]); [`TextSink`] writes them.

mod text;

use std::{convert::Infallible, net::SocketAddr, sync::Arc};

use http_body_util::Full;
use hyper::{body::Bytes, server::conn::http1, service::service_fn, Method, Request, Response};
use hyper_util::rt::TokioIo;
use slo_probe_core::snapshot::Snapshot;
use tokio::{net::TcpListener, sync::watch, task::JoinHandle};

pub use self::text::TextSink;
use super::{
    model::{self, Options},
    Exporter,
};

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
}

impl PrometheusServer {
    /// Binds the listen address (port 0 picks a free port).
    pub async fn bind(addr: SocketAddr, per_thread: bool) -> Result<Self, PrometheusError> {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| PrometheusError::Bind { addr, source })?;
        Ok(Self {
            listener,
            per_thread,
        })
    }

    /// The address actually bound.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves `/metrics` from the latest snapshot until `shutdown` turns true.
    pub async fn serve(
        self,
        snapshots: watch::Receiver<Arc<Snapshot>>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        loop {
            tokio::select! {
                accepted = self.listener.accept() => {
                    let Ok((stream, _)) = accepted else { continue };
                    let snapshots = snapshots.clone();
                    let per_thread = self.per_thread;
                    tokio::spawn(async move {
                        let service = service_fn(move |req| {
                            let snapshot = snapshots.borrow().clone();
                            async move { Ok::<_, Infallible>(respond(&req, &snapshot, per_thread)) }
                        });
                        // A client that hangs up mid-response is not the agent's problem.
                        let _ = http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), service)
                            .await;
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

fn respond<B>(req: &Request<B>, snapshot: &Snapshot, per_thread: bool) -> Response<Full<Bytes>> {
    let (status, content_type, body) = match (req.method(), req.uri().path()) {
        (&Method::GET, "/metrics") => (200, CONTENT_TYPE, render(snapshot, per_thread)),
        (&Method::GET, "/healthz") => (200, "text/plain", "ok\n".to_owned()),
        (&Method::GET, "/") => (
            200,
            "text/plain",
            "slo-probe agent\n  /metrics  Prometheus text exposition\n  /healthz  liveness\n"
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
