//! Where `slo-probe top` gets its data: an agent's `/api/v1/watch` stream (reconnecting with a
//! backoff from 0.5 s to 5 s, as tokio-console does), or GPU recordings replayed once through
//! the agent's own decoding and SLO engine (`--replay`, no agent or GPU needed).

use std::{path::PathBuf, sync::mpsc::Sender, thread::JoinHandle, time::Duration};

use super::app::{Conn, Event};
use crate::{
    api::{
        client::{ClientError, Endpoint},
        convert,
        types::{Snapshot, WatchEvent},
    },
    cli::replay::{self, ReplayError},
};

/// First wait before reconnecting.
pub const BACKOFF_MIN: Duration = Duration::from_millis(500);
/// Longest wait before reconnecting.
pub const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// How long a read may wait: beyond the longest tick (`agent.tick_ms` ≤ 60 s) the agent is
/// gone.
const READ_TIMEOUT: Duration = Duration::from_secs(70);

/// The next wait after `d`.
pub fn next_backoff(d: Duration) -> Duration {
    (d * 2).min(BACKOFF_MAX)
}

/// Follows an agent's watch stream on a thread, sending events to `tx` until it hangs up.
pub fn watch(endpoint: Endpoint, tx: Sender<Event>) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("slo-top-watch".into())
        .spawn(move || {
            let url = endpoint.url();
            let mut backoff = BACKOFF_MIN;
            loop {
                if tx
                    .send(Event::Conn(Conn::Connecting { url: url.clone() }))
                    .is_err()
                {
                    return;
                }
                let reason = match follow(&endpoint, &tx, &mut backoff) {
                    Ok(()) => return,
                    Err(e) => short(&e),
                };
                let retry = Event::Conn(Conn::Reconnecting {
                    url: url.clone(),
                    reason,
                    retry_in: backoff,
                });
                if tx.send(retry).is_err() {
                    return;
                }
                std::thread::sleep(backoff);
                backoff = next_backoff(backoff);
            }
        })
}

/// The error's innermost cause, which says what happened (`connection refused`).
fn short(e: &ClientError) -> String {
    let mut inner: &dyn std::error::Error = e;
    while let Some(s) = inner.source() {
        inner = s;
    }
    match e {
        ClientError::Closed { .. } | ClientError::Status { .. } => e.to_string(),
        _ => inner.to_string(),
    }
}

/// One connection: `Ok` when the receiver is gone, `Err` when the agent is.
fn follow(
    endpoint: &Endpoint,
    tx: &Sender<Event>,
    backoff: &mut Duration,
) -> Result<(), ClientError> {
    let mut w = endpoint.watch(READ_TIMEOUT)?;
    loop {
        let e = match w.next_event()? {
            WatchEvent::Full(s) => {
                *backoff = BACKOFF_MIN;
                if tx
                    .send(Event::Conn(Conn::Live {
                        url: endpoint.url(),
                    }))
                    .is_err()
                {
                    return Ok(());
                }
                Event::Full(Box::new(s))
            }
            WatchEvent::Delta(d) => Event::Delta(Box::new(d)),
            WatchEvent::Unknown => continue,
        };
        if tx.send(e).is_err() {
            return Ok(());
        }
    }
}

/// The state of GPU recordings replayed (what the agent would have shown at their end).
pub fn replayed(files: &[PathBuf]) -> Result<Snapshot, ReplayError> {
    let mut r = Vec::new();
    for f in files {
        r.push(replay::replay(f, None, false, None)?.process);
    }
    Ok(convert::replayed(&r, ""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_half_a_second_to_five() {
        let mut d = BACKOFF_MIN;
        let mut seen = vec![d];
        for _ in 0..6 {
            d = next_backoff(d);
            seen.push(d);
        }
        let ms: Vec<u128> = seen.iter().map(|d| d.as_millis()).collect();
        assert_eq!(ms, [500, 1000, 2000, 4000, 5000, 5000, 5000]);
    }

    #[test]
    fn a_missing_agent_is_retried_and_said_so() {
        // A port with nothing listening.
        let addr = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("port");
        let (tx, rx) = std::sync::mpsc::channel();
        let _h = watch(Endpoint::of(addr), tx).expect("thread");
        let mut conns = Vec::new();
        while conns.len() < 4 {
            match rx.recv_timeout(Duration::from_secs(5)).expect("an event") {
                Event::Conn(c) => conns.push(c),
                other => panic!("{other:?}"),
            }
        }
        assert!(matches!(conns[0], Conn::Connecting { .. }));
        match &conns[1] {
            Conn::Reconnecting {
                reason, retry_in, ..
            } => {
                assert!(reason.contains("refused"), "{reason}");
                assert_eq!(*retry_in, BACKOFF_MIN);
            }
            other => panic!("{other:?}"),
        }
        match &conns[3] {
            Conn::Reconnecting { retry_in, .. } => {
                assert_eq!(*retry_in, Duration::from_secs(1))
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_recording_becomes_a_snapshot() {
        let f = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures/gpu/h200-graphs.bin");
        let s = replayed(&[f]).expect("replays");
        assert_eq!(s.processes.len(), 1);
        assert!(s.processes[0].iterations.total > 0);
    }
}
