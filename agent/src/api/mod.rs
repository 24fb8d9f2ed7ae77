//! The agent's state API, served on the Prometheus listener (loopback by default) under
//! `/api/v1`: JSON a terminal view, a launcher or `curl` reads, with the structure that the
//! Prometheus text loses (the SLO tree, violations with their chains).
//!
//! - `GET /api/v1/snapshot`: the latest [`types::Snapshot`].
//! - `GET /api/v1/watch`: NDJSON, a [`types::WatchEvent::Full`] line, then a
//!   [`types::WatchEvent::Delta`] line per tick. A slow client only delays its own stream.
//! - `POST /api/v1/diagnostic` ([`types::DiagnosticRequest`]) and `POST /api/v1/heal/undo`
//!   ([`types::UndoRequest`]): only with `[api] allow_writes = true`, else 403; carried out by
//!   the [`Control`] the agent wires in ([`control::AgentControl`] in `slo-probe agent`), else
//!   501; 404 for an unknown process or action, 409 for an ambiguous one, 500 when the
//!   healer's journal or a knob failed.
//!
//! The types are in [`types`], the conversion from the core snapshot in [`convert`], a client
//! in [`client`].

pub mod client;
pub mod control;
pub mod convert;
pub mod types;

use std::{convert::Infallible, sync::Arc};

use http_body_util::{channel::Channel, BodyExt as _, Full, Limited};
use hyper::{body::Bytes, Method, Request, Response, StatusCode};
use slo_probe_core::snapshot::Snapshot as CoreSnapshot;
use tokio::sync::watch;

use types::{DiagnosticRequest, Reply, UndoRequest, WatchEvent, VERSION};

/// Largest request body a write endpoint reads.
const MAX_BODY: usize = 64 * 1024;
/// Lines a watch stream buffers for a slow client before its task waits.
const WATCH_BUFFER: usize = 4;

/// A response body: whole, or a stream.
pub type Body = http_body_util::combinators::BoxBody<Bytes, Infallible>;

/// Why a write request was not carried out.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// No connected shim has this pid.
    #[error("no training process with pid {pid} is connected to this agent")]
    NoSuchProcess {
        /// The pid asked for.
        pid: u32,
    },
    /// No such healer action, or none in force.
    #[error("no healer action to undo{}", .id.map_or(String::new(), |id| format!(" with id {id}")))]
    NoSuchAction {
        /// The id asked for.
        id: Option<u64>,
    },
    /// The action id is in force in several jobs.
    #[error(
        "action {id} is in force in jobs {}; name one with \"job\"",
        .jobs.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
    )]
    Ambiguous {
        /// The id asked for.
        id: u64,
        /// The jobs that have it.
        jobs: Vec<u32>,
    },
    /// Some knobs of the action could not be restored (the rest were).
    #[error(
        "job {job} action {id}: {} knobs could not be restored: {}",
        .failed.len(),
        .failed.join("; ")
    )]
    NotRestored {
        /// The job.
        job: u32,
        /// The action.
        id: u64,
        /// Each knob and why.
        failed: Vec<String>,
    },
    /// The healer's journal could not be read or written.
    #[error("cannot undo the healer action")]
    Heal {
        /// Why.
        #[source]
        source: crate::healer::HealError,
    },
    /// This agent has nothing that carries the request out.
    #[error("{what} is not available in this agent")]
    Unavailable {
        /// What was asked.
        what: &'static str,
    },
}

/// What carries out the write endpoints (the agent connects the shim source and the healer).
pub trait Control: Send + Sync {
    /// Raises the tracing depth of one process (or every one) to graph nodes for a while;
    /// returns what was done, in words.
    fn diagnostic(&self, req: &DiagnosticRequest) -> Result<String, ControlError>;
    /// Reverts a healer action; returns what was done, in words.
    fn heal_undo(&self, req: &UndoRequest) -> Result<String, ControlError>;
}

/// The API's settings and its write side.
#[derive(Clone, Default)]
pub struct Api {
    ctx: convert::Context,
    control: Option<Arc<dyn Control>>,
}

impl Api {
    /// Read-only unless `ctx.writes_allowed`, with nothing wired to the writes yet.
    pub fn new(ctx: convert::Context) -> Self {
        Self { ctx, control: None }
    }

    /// Connects the write endpoints.
    pub fn with_control(mut self, control: Arc<dyn Control>) -> Self {
        self.control = Some(control);
        self
    }

    /// The API snapshot of a core snapshot, as this agent serves it.
    pub fn snapshot(&self, s: &CoreSnapshot) -> types::Snapshot {
        convert::snapshot(s, &self.ctx)
    }
}

fn json<T: serde::Serialize>(status: StatusCode, value: &T) -> Response<Body> {
    let mut body = serde_json::to_vec(value).unwrap_or_default();
    body.push(b'\n');
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)).boxed())
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new()).boxed()))
}

fn reply(status: StatusCode, message: impl Into<String>) -> Response<Body> {
    json(
        status,
        &Reply {
            version: VERSION,
            ok: status.is_success(),
            message: message.into(),
        },
    )
}

/// Answers a request under `/api/`.
pub async fn handle<B>(
    req: Request<B>,
    api: Arc<Api>,
    snapshots: watch::Receiver<Arc<CoreSnapshot>>,
) -> Response<Body>
where
    B: hyper::body::Body + Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let path = req.uri().path().trim_end_matches('/').to_owned();
    match (req.method().clone(), path.as_str()) {
        (Method::GET, "/api/v1/snapshot") => {
            let s = snapshots.borrow().clone();
            json(StatusCode::OK, &api.snapshot(&s))
        }
        (Method::GET, "/api/v1/watch") => watch(api, snapshots),
        (Method::POST, "/api/v1/diagnostic") => {
            write(req, &api, "raising a process's tracing depth", |c, r| {
                c.diagnostic(r)
            })
            .await
        }
        (Method::POST, "/api/v1/heal/undo") => {
            write(req, &api, "undoing a healer action", |c, r| c.heal_undo(r)).await
        }
        (_, "/api/v1/snapshot" | "/api/v1/watch" | "/api/v1/diagnostic" | "/api/v1/heal/undo") => {
            reply(
                StatusCode::METHOD_NOT_ALLOWED,
                format!(
                "{} {path}: not allowed; snapshot and watch take GET, diagnostic and heal/undo \
                 take POST",
                req.method()
            ),
            )
        }
        _ => reply(
            StatusCode::NOT_FOUND,
            format!(
                "{path}: not found; the API is GET /api/v1/snapshot, GET /api/v1/watch, POST \
                 /api/v1/diagnostic, POST /api/v1/heal/undo"
            ),
        ),
    }
}

/// The watch stream: a full line, then a delta line per snapshot.
fn watch(api: Arc<Api>, mut snapshots: watch::Receiver<Arc<CoreSnapshot>>) -> Response<Body> {
    let (mut tx, body) = Channel::<Bytes, Infallible>::new(WATCH_BUFFER);
    fn line(e: &WatchEvent) -> Bytes {
        let mut v = serde_json::to_vec(e).unwrap_or_default();
        v.push(b'\n');
        Bytes::from(v)
    }
    tokio::spawn(async move {
        let first = snapshots.borrow_and_update().clone();
        let mut prev = api.snapshot(&first);
        if tx
            .send_data(line(&WatchEvent::Full(prev.clone())))
            .await
            .is_err()
        {
            return;
        }
        // Ends when the client hangs up or the collector stops publishing.
        while snapshots.changed().await.is_ok() {
            let s = snapshots.borrow_and_update().clone();
            let next = api.snapshot(&s);
            let delta = prev.delta_to(&next);
            if tx.send_data(line(&WatchEvent::Delta(delta))).await.is_err() {
                return;
            }
            prev = next;
        }
    });
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "application/x-ndjson")
        .header("cache-control", "no-cache")
        .body(body.boxed())
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new()).boxed()))
}

async fn write<B, R>(
    req: Request<B>,
    api: &Api,
    what: &'static str,
    run: impl FnOnce(&dyn Control, &R) -> Result<String, ControlError>,
) -> Response<Body>
where
    B: hyper::body::Body + Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    R: serde::de::DeserializeOwned + Default,
{
    if !api.ctx.writes_allowed {
        return reply(
            StatusCode::FORBIDDEN,
            format!(
                "{what} is off: the agent's write endpoints are disabled; set `allow_writes = \
                 true` under [api] in its config to allow them"
            ),
        );
    }
    let bytes = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            return reply(
                StatusCode::BAD_REQUEST,
                format!("cannot read the request body (at most {MAX_BODY} bytes): {e}"),
            )
        }
    };
    let request: R = if bytes.iter().all(u8::is_ascii_whitespace) {
        R::default()
    } else {
        match serde_json::from_slice(&bytes) {
            Ok(r) => r,
            Err(e) => {
                return reply(
                    StatusCode::BAD_REQUEST,
                    format!("the request body is not valid JSON for this endpoint: {e}"),
                )
            }
        }
    };
    let Some(control) = api.control.as_deref() else {
        return reply(
            StatusCode::NOT_IMPLEMENTED,
            ControlError::Unavailable { what }.to_string(),
        );
    };
    match run(control, &request) {
        Ok(message) => reply(StatusCode::OK, message),
        Err(e) => {
            let status = match e {
                ControlError::Unavailable { .. } => StatusCode::NOT_IMPLEMENTED,
                ControlError::NoSuchProcess { .. } | ControlError::NoSuchAction { .. } => {
                    StatusCode::NOT_FOUND
                }
                ControlError::Ambiguous { .. } => StatusCode::CONFLICT,
                ControlError::NotRestored { .. } | ControlError::Heal { .. } => {
                    StatusCode::INTERNAL_SERVER_ERROR
                }
            };
            reply(status, crate::error_chain(&e))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Recorder(std::sync::Mutex<Vec<u32>>);

    impl Control for Recorder {
        fn diagnostic(&self, req: &DiagnosticRequest) -> Result<String, ControlError> {
            let pid = req.pid.ok_or(ControlError::Unavailable { what: "all" })?;
            self.0.lock().unwrap_or_else(|e| e.into_inner()).push(pid);
            Ok(format!("pid {pid}: graph nodes for {} steps", req.steps))
        }
        fn heal_undo(&self, req: &UndoRequest) -> Result<String, ControlError> {
            Err(match req.action {
                Some(1) => ControlError::Ambiguous {
                    id: 1,
                    jobs: vec![7, 8],
                },
                Some(2) => ControlError::NotRestored {
                    job: 7,
                    id: 2,
                    failed: vec!["cpu.weight: read back 5".into()],
                },
                id => ControlError::NoSuchAction { id },
            })
        }
    }

    fn post(path: &str, body: &str) -> Request<Full<Bytes>> {
        Request::post(path)
            .body(Full::new(Bytes::from(body.to_owned())))
            .expect("request")
    }

    async fn text(r: Response<Body>) -> (StatusCode, String) {
        let status = r.status();
        let b = r.into_body().collect().await.expect("body").to_bytes();
        (status, String::from_utf8_lossy(&b).into_owned())
    }

    fn api(writes: bool) -> Arc<Api> {
        Arc::new(
            Api::new(convert::Context {
                writes_allowed: writes,
                heal_mode: "off",
                ..Default::default()
            })
            .with_control(Arc::new(Recorder(Default::default()))),
        )
    }

    #[tokio::test]
    async fn writes_are_refused_unless_allowed_and_reach_the_control() {
        let (_tx, rx) = watch::channel(Arc::new(CoreSnapshot::default()));
        let (s, t) =
            text(handle(post("/api/v1/diagnostic", "{}"), api(false), rx.clone()).await).await;
        assert_eq!(s, StatusCode::FORBIDDEN);
        assert!(t.contains("allow_writes = true"), "{t}");
        let (s, t) = text(
            handle(
                post("/api/v1/diagnostic", r#"{"pid":7,"steps":9}"#),
                api(true),
                rx.clone(),
            )
            .await,
        )
        .await;
        assert_eq!(s, StatusCode::OK, "{t}");
        assert!(t.contains("pid 7: graph nodes for 9 steps"), "{t}");
        let (s, t) = text(handle(post("/api/v1/heal/undo", ""), api(true), rx.clone()).await).await;
        assert_eq!(s, StatusCode::NOT_FOUND, "{t}");
        let undo =
            |body: &'static str| handle(post("/api/v1/heal/undo", body), api(true), rx.clone());
        let (s, t) = text(undo(r#"{"action":1}"#).await).await;
        assert_eq!(s, StatusCode::CONFLICT, "{t}");
        assert!(t.contains("jobs 7, 8"), "{t}");
        let (s, t) = text(undo(r#"{"action":2,"job":7}"#).await).await;
        assert_eq!(s, StatusCode::INTERNAL_SERVER_ERROR, "{t}");
        assert!(
            t.contains("\"ok\":false") && t.contains("read back 5"),
            "{t}"
        );
        let (s, _) =
            text(handle(post("/api/v1/diagnostic", "{nope"), api(true), rx.clone()).await).await;
        assert_eq!(s, StatusCode::BAD_REQUEST);
        let unwired = Arc::new(Api::new(convert::Context {
            writes_allowed: true,
            heal_mode: "off",
            ..Default::default()
        }));
        let (s, _) = text(handle(post("/api/v1/heal/undo", ""), unwired, rx.clone()).await).await;
        assert_eq!(s, StatusCode::NOT_IMPLEMENTED);
        let (s, _) = text(handle(post("/api/v1/snapshot", ""), api(true), rx.clone()).await).await;
        assert_eq!(s, StatusCode::METHOD_NOT_ALLOWED);
        let (s, t) = text(handle(post("/api/v2/x", ""), api(true), rx).await).await;
        assert_eq!(s, StatusCode::NOT_FOUND);
        assert!(t.contains("/api/v1/snapshot"), "{t}");
    }

    #[tokio::test]
    async fn watch_sends_a_full_line_then_deltas() {
        let (tx, rx) = watch::channel(Arc::new(CoreSnapshot::default()));
        let get = Request::get("/api/v1/watch")
            .body(Full::new(Bytes::new()))
            .expect("request");
        let r = handle(get, api(false), rx).await;
        assert_eq!(r.status(), StatusCode::OK);
        let mut body = r.into_body();
        async fn frame(b: &mut Body) -> String {
            let f = b.frame().await.expect("a frame").expect("ok");
            String::from_utf8_lossy(&f.into_data().expect("data")).into_owned()
        }
        let first = frame(&mut body).await;
        assert!(first.starts_with("{\"type\":\"full\""), "{first}");
        tx.send_replace(Arc::new(CoreSnapshot {
            taken_at_ns: 42,
            ..Default::default()
        }));
        let next = frame(&mut body).await;
        assert_eq!(
            next,
            "{\"type\":\"delta\",\"version\":1,\"taken_at_ns\":42}\n"
        );
    }
}
