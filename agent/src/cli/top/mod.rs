//! `slo-probe top`: a terminal view of a node from its agent's state API (`/api/v1/watch`), or
//! of GPU recordings (`--replay`). The state and its reducer are in [`app`], the key map in
//! [`keys`], the drawing in [`view`], the data in [`source`]; this module runs the terminal.
//! One channel feeds the loop: key presses (an input thread) and data (a source thread); each
//! batch of events is applied, then the screen is drawn (as bottom and tokio-console do).

pub mod app;
pub mod keys;
pub mod source;
pub mod view;

use std::{
    io::{IsTerminal as _, Write as _},
    path::PathBuf,
    sync::mpsc,
    time::Duration,
};

use crate::{
    api::client::{ClientError, Endpoint},
    cli::replay::ReplayError,
};
use app::{App, Conn, Event};

/// Size `--once` renders at when stdout is not a terminal.
pub const ONCE_SIZE: (u16, u16) = (120, 40);

/// Why `top` stopped.
#[derive(Debug, thiserror::Error)]
pub enum TopError {
    /// The agent could not be read (`--once`).
    #[error("cannot read the agent's state")]
    Agent(#[from] ClientError),
    /// A recording could not be replayed.
    #[error("cannot replay the recording")]
    Replay(#[from] ReplayError),
    /// The terminal could not be set up or drawn.
    #[error("cannot use the terminal")]
    Terminal(#[source] std::io::Error),
    /// Interactive mode without a terminal.
    #[error("top needs a terminal on stdout; for scripts use --once (text) or --once --json")]
    NotATerminal,
    /// `--json` alone.
    #[error("--json needs --once (it prints one snapshot)")]
    JsonNeedsOnce,
    /// The snapshot could not be encoded.
    #[error("cannot encode the snapshot")]
    Json(#[source] serde_json::Error),
}

/// `top`'s settings.
#[derive(Clone, Debug)]
pub struct Options {
    /// The agent.
    pub endpoint: Endpoint,
    /// Recordings to show instead of an agent.
    pub replay: Vec<PathBuf>,
    /// Print one snapshot and exit.
    pub once: bool,
    /// With `once`: the snapshot as JSON.
    pub json: bool,
    /// Capture the mouse.
    pub mouse: bool,
}

/// Runs `top`.
pub fn run(opts: Options) -> Result<(), TopError> {
    if opts.json && !opts.once {
        return Err(TopError::JsonNeedsOnce);
    }
    if opts.once {
        return once(&opts);
    }
    if !std::io::stdout().is_terminal() {
        return Err(TopError::NotATerminal);
    }
    let (tx, rx) = mpsc::channel::<Msg>();
    let (data_tx, data_rx) = mpsc::channel::<Event>();
    let mut app = if opts.replay.is_empty() {
        source::watch(opts.endpoint.clone(), data_tx).map_err(TopError::Terminal)?;
        App::new(Conn::Connecting {
            url: opts.endpoint.url(),
        })
    } else {
        let s = source::replayed(&opts.replay)?;
        let mut a = App::new(Conn::Replay {
            what: replay_label(&opts.replay),
        });
        a.apply(Event::Full(Box::new(s)));
        drop(data_tx);
        a
    };
    // The data thread's events into the one channel.
    {
        let tx = tx.clone();
        std::thread::Builder::new()
            .name("slo-top-data".into())
            .spawn(move || {
                for e in data_rx {
                    if tx.send(Msg::App(e)).is_err() {
                        return;
                    }
                }
            })
            .map_err(TopError::Terminal)?;
    }
    std::thread::Builder::new()
        .name("slo-top-input".into())
        .spawn(move || input(tx))
        .map_err(TopError::Terminal)?;

    let mut terminal = ratatui::try_init().map_err(TopError::Terminal)?;
    if opts.mouse {
        let _ = crossterm::execute!(std::io::stdout(), crossterm::event::EnableMouseCapture);
    }
    let theme = view::Theme::from_env();
    let result = (|| {
        loop {
            terminal
                .draw(|f| view::draw(f, &app, theme))
                .map_err(TopError::Terminal)?;
            // Redraw at least once a second (the reconnect countdown, the clock).
            let first = match rx.recv_timeout(Duration::from_secs(1)) {
                Ok(m) => Some(m),
                Err(mpsc::RecvTimeoutError::Timeout) => None,
                Err(mpsc::RecvTimeoutError::Disconnected) => return Ok(()),
            };
            for m in first.into_iter().chain(rx.try_iter()) {
                match m {
                    Msg::App(e) => app.apply(e),
                    Msg::Key(k) => {
                        if let Some(a) = keys::action(k, app.editing) {
                            app.apply(Event::Action(a));
                        }
                    }
                    Msg::Mouse(m) => {
                        if let Some(a) = keys::mouse(m) {
                            app.apply(Event::Action(a));
                        }
                    }
                    Msg::Resize => {}
                }
                if app.quit {
                    return Ok(());
                }
            }
        }
    })();
    if opts.mouse {
        let _ = crossterm::execute!(std::io::stdout(), crossterm::event::DisableMouseCapture);
    }
    ratatui::restore();
    result
}

/// What the loop receives.
enum Msg {
    App(Event),
    Key(crossterm::event::KeyEvent),
    Mouse(crossterm::event::MouseEvent),
    Resize,
}

fn input(tx: mpsc::Sender<Msg>) {
    use crossterm::event::{self, Event as CEvent};
    while let Ok(e) = event::read() {
        let m = match e {
            CEvent::Key(k) => Msg::Key(k),
            CEvent::Mouse(m) => Msg::Mouse(m),
            CEvent::Resize(..) => Msg::Resize,
            _ => continue,
        };
        if tx.send(m).is_err() {
            return;
        }
    }
}

fn replay_label(files: &[PathBuf]) -> String {
    files
        .iter()
        .map(|f| f.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// `--once`: one snapshot, as JSON or as the screen would show it.
fn once(opts: &Options) -> Result<(), TopError> {
    let (snapshot, conn) = if opts.replay.is_empty() {
        (
            opts.endpoint.snapshot(Duration::from_secs(10))?,
            Conn::Live {
                url: opts.endpoint.url(),
            },
        )
    } else {
        (
            source::replayed(&opts.replay)?,
            Conn::Replay {
                what: replay_label(&opts.replay),
            },
        )
    };
    let mut out = std::io::stdout().lock();
    if opts.json {
        let text = serde_json::to_string_pretty(&snapshot).map_err(TopError::Json)?;
        let _ = writeln!(out, "{text}");
        return Ok(());
    }
    let (w, h) = if std::io::stdout().is_terminal() {
        crossterm::terminal::size().unwrap_or(ONCE_SIZE)
    } else {
        ONCE_SIZE
    };
    let mut app = App::new(conn);
    app.apply(Event::Full(Box::new(snapshot)));
    let _ = write!(out, "{}", view::render_text(&app, w, h));
    Ok(())
}
