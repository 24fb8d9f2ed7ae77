//! Rendering of `slo-probe top`: a function of the [`App`] state and the terminal size, nothing
//! else, so that tests render it on ratatui's `TestBackend`.
//!
//! Layouts: from 120×32 every pane at once (ranks and the SLO tree on the left; violations,
//! operators, host, GPUs and the healer on the right); below that the ranks on top and one pane
//! under them, chosen with Tab (a tab line names them). Down to any size: columns and rows are
//! cut, nothing is refused. `NO_COLOR` drops every colour (selection stays reversed).

use ratatui::{
    layout::{Constraint, Layout, Rect},
    style::{Color, Modifier, Style},
    text::{Line, Span, Text},
    widgets::{Block, Cell, Clear, Paragraph, Row, Table, TableState, Wrap},
    Frame,
};

use super::{
    app::{App, Conn, Detail, Pane},
    keys::HELP,
};
use crate::{
    api::types::{Severity, State},
    cli::report::{human_bytes, human_ns},
};

/// Colours, or none.
#[derive(Clone, Copy, Debug)]
pub struct Theme {
    color: bool,
}

impl Theme {
    /// Colours unless `NO_COLOR` is set (to anything non-empty), as no-color.org asks.
    pub fn from_env() -> Self {
        Self {
            color: std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()),
        }
    }

    /// No colours.
    pub fn plain() -> Self {
        Self { color: false }
    }

    fn fg(self, c: Color) -> Style {
        if self.color {
            Style::new().fg(c)
        } else {
            Style::new()
        }
    }

    fn state(self, s: State) -> Style {
        match s {
            State::Ok => self.fg(Color::Green),
            State::Breaching => self.fg(Color::Yellow),
            State::Warning => self.fg(Color::LightRed),
            State::Critical => self.fg(Color::Red).add_modifier(Modifier::BOLD),
            State::Unknown => self.fg(Color::DarkGray),
        }
    }

    fn severity(self, s: Severity) -> Style {
        match s {
            Severity::Critical => self.state(State::Critical),
            Severity::Warning => self.state(State::Warning),
            Severity::Unknown => self.state(State::Unknown),
        }
    }

    fn dim(self) -> Style {
        self.fg(Color::DarkGray)
    }

    fn header(self) -> Style {
        self.fg(Color::Cyan).add_modifier(Modifier::BOLD)
    }

    fn selected(self) -> Style {
        Style::new().add_modifier(Modifier::REVERSED)
    }

    fn border(self, focused: bool) -> Style {
        if focused {
            self.fg(Color::Cyan).add_modifier(Modifier::BOLD)
        } else {
            self.dim()
        }
    }
}

/// The width and height from which every pane is shown at once.
pub const WIDE: (u16, u16) = (120, 32);

fn ns(v: Option<u64>) -> String {
    v.map_or("-".to_owned(), |v| human_ns(v as f64))
}

fn pct01(v: Option<f64>) -> String {
    v.map_or("-".to_owned(), |v| format!("{:.1}%", 100.0 * v))
}

fn pct(v: Option<f64>) -> String {
    v.map_or("-".to_owned(), |v| format!("{v:.0}%"))
}

fn num(v: Option<f64>) -> String {
    match v {
        Some(v) if v.abs() >= 100.0 => format!("{v:.0}"),
        Some(v) => format!("{v:.2}"),
        None => "-".to_owned(),
    }
}

/// The recent iteration times as a bar of block characters, relative to their own range.
fn trend(walls: &[u64], width: usize) -> String {
    const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let tail = &walls[walls.len().saturating_sub(width)..];
    let (Some(&lo), Some(&hi)) = (tail.iter().min(), tail.iter().max()) else {
        return String::new();
    };
    tail.iter()
        .map(|&w| {
            let k = if hi > lo {
                ((w - lo) as f64 / (hi - lo) as f64 * 7.0).round() as usize
            } else {
                0
            };
            BARS[k.min(7)]
        })
        .collect()
}

/// Draws the whole view.
pub fn draw(f: &mut Frame, app: &App, theme: Theme) {
    let area = f.area();
    let [head, body, foot] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Min(0),
        Constraint::Length(1),
    ])
    .areas(area);
    header(f, head, app, theme);
    footer(f, foot, app, theme);
    if area.width >= WIDE.0 && area.height >= WIDE.1 {
        wide(f, body, app, theme);
    } else {
        compact(f, body, app, theme);
    }
    if let Some(d) = &app.detail {
        detail(f, area, app, d, theme);
    }
    if app.help {
        help(f, area, theme);
    }
}

fn header(f: &mut Frame, area: Rect, app: &App, theme: Theme) {
    // Most important first: narrow terminals cut the end.
    let mut spans = vec![Span::styled("slo-probe top", theme.header())];
    if app.frozen {
        spans.push(Span::styled(
            " FROZEN",
            theme.fg(Color::Yellow).add_modifier(Modifier::BOLD),
        ));
    }
    let (conn, style) = match &app.conn {
        Conn::Connecting { url } => (format!("connecting to {url}"), theme.dim()),
        Conn::Live { url } => (format!("live {url}"), theme.fg(Color::Green)),
        Conn::Reconnecting {
            url,
            reason,
            retry_in,
        } => (
            format!(
                "reconnecting to {url} in {:.1} s ({reason})",
                retry_in.as_secs_f64()
            ),
            theme.fg(Color::Yellow),
        ),
        Conn::Replay { what } => (format!("replay {what}"), theme.fg(Color::Magenta)),
    };
    if let Some(s) = &app.shown {
        let open = app.violations().len();
        spans.push(Span::raw(format!(
            " · {} process{}, ",
            s.processes.len(),
            if s.processes.len() == 1 { "" } else { "es" }
        )));
        spans.push(Span::styled(
            format!("{open} open violation{}", if open == 1 { "" } else { "s" }),
            if open > 0 {
                theme.state(app.worst())
            } else {
                theme.state(State::Ok)
            },
        ));
    }
    spans.push(Span::raw(" · "));
    spans.push(Span::styled(conn, style));
    if let Some(s) = app.shown.as_ref().filter(|s| !s.node.is_empty()) {
        spans.push(Span::raw(format!(" · {}", s.node)));
    }
    f.render_widget(Paragraph::new(Line::from(spans)), area);
}

fn footer(f: &mut Frame, area: Rect, app: &App, theme: Theme) {
    let line = if app.editing {
        Line::from(vec![
            Span::styled("filter: ", theme.header()),
            Span::raw(format!("{}_", app.filter)),
            Span::styled("  Enter keep · Esc clear", theme.dim()),
        ])
    } else {
        let mut spans = vec![Span::styled(
            "q quit · ? help · Tab pane · ↑↓ move · Enter drill in · / filter · f freeze · s sort",
            theme.dim(),
        )];
        if !app.filter.is_empty() {
            spans.push(Span::raw(format!(" · filter \"{}\"", app.filter)));
        }
        Line::from(spans)
    };
    f.render_widget(Paragraph::new(line), area);
}

fn wide(f: &mut Frame, area: Rect, app: &App, theme: Theme) {
    // Host and GPUs side by side along the bottom, the rest in two columns above.
    let bottom = (app.rows(Pane::Host).max(app.rows(Pane::Gpus)) as u16 + 3).clamp(4, 10);
    let [top, low] = Layout::vertical([Constraint::Min(0), Constraint::Length(bottom)]).areas(area);
    let [left, right] =
        Layout::horizontal([Constraint::Percentage(58), Constraint::Percentage(42)]).areas(top);
    let ranks = (app.rows(Pane::Ranks) as u16 + 3).clamp(5, left.height / 2);
    let [r, s] = Layout::vertical([Constraint::Length(ranks), Constraint::Min(0)]).areas(left);
    pane(f, r, app, Pane::Ranks, theme);
    pane(f, s, app, Pane::Slo, theme);
    let mut right_panes = vec![Pane::Violations, Pane::Operators];
    if app.has_pane(Pane::Healer) {
        right_panes.push(Pane::Healer);
    }
    let areas = Layout::vertical(vec![Constraint::Fill(1); right_panes.len()]).split(right);
    for (a, p) in areas.iter().zip(right_panes) {
        pane(f, *a, app, p, theme);
    }
    let [host, gpus] =
        Layout::horizontal([Constraint::Percentage(50), Constraint::Percentage(50)]).areas(low);
    pane(f, host, app, Pane::Host, theme);
    pane(f, gpus, app, Pane::Gpus, theme);
}

fn compact(f: &mut Frame, area: Rect, app: &App, theme: Theme) {
    let ranks = (app.rows(Pane::Ranks) as u16 + 3).clamp(4, (area.height / 3).max(4));
    let [r, tabs, rest] = Layout::vertical([
        Constraint::Length(ranks),
        Constraint::Length(1),
        Constraint::Min(0),
    ])
    .areas(area);
    pane(f, r, app, Pane::Ranks, theme);
    let shown = if app.focus == Pane::Ranks {
        Pane::Slo
    } else {
        app.focus
    };
    let mut spans = Vec::new();
    for p in Pane::ALL.into_iter().skip(1).filter(|p| app.has_pane(*p)) {
        let style = if p == shown {
            theme.header().add_modifier(Modifier::REVERSED)
        } else {
            theme.dim()
        };
        spans.push(Span::styled(format!(" {} ", p.title()), style));
    }
    f.render_widget(Paragraph::new(Line::from(spans)), tabs);
    pane(f, rest, app, shown, theme);
}

fn block(app: &App, pane: Pane, title: String, theme: Theme) -> Block<'static> {
    let focused = app.focus == pane;
    Block::bordered()
        .border_style(theme.border(focused))
        .title(Span::styled(
            format!(" {title} "),
            if focused {
                theme.header()
            } else {
                Style::new()
            },
        ))
}

/// Keeps the columns that fit in `width`: those with the highest `drop` go first (0: never).
fn fit(widths: &[Constraint], drop: &[u8], width: u16) -> Vec<usize> {
    let w = |c: &Constraint| match *c {
        Constraint::Length(n) | Constraint::Max(n) | Constraint::Min(n) => n,
        _ => 4,
    };
    let mut keep: Vec<usize> = (0..widths.len()).collect();
    loop {
        let total: u16 = keep.iter().map(|&i| w(&widths[i]) + 1).sum();
        if total <= width + 1 {
            return keep;
        }
        let worst = keep
            .iter()
            .copied()
            .filter(|&i| drop.get(i).copied().unwrap_or(0) > 0)
            .max_by_key(|&i| (drop[i], i));
        match worst {
            Some(i) => keep.retain(|&k| k != i),
            None => return keep,
        }
    }
}

#[expect(
    clippy::too_many_arguments,
    reason = "one table of one pane, drawn in one place"
)]
fn table<'a>(
    f: &mut Frame,
    area: Rect,
    app: &App,
    pane: Pane,
    block: Block<'a>,
    header: &[&'a str],
    rows: Vec<Vec<Cell<'a>>>,
    widths: &[Constraint],
    drop: &[u8],
    theme: Theme,
) {
    let keep = fit(widths, drop, area.width.saturating_sub(2));
    let pick = |cells: Vec<Cell<'a>>| -> Row<'a> {
        let mut cells: Vec<Option<Cell<'a>>> = cells.into_iter().map(Some).collect();
        Row::new(
            keep.iter()
                .filter_map(|&i| cells.get_mut(i).and_then(Option::take))
                .collect::<Vec<_>>(),
        )
    };
    let cursor = app.cursor[Pane::ALL.iter().position(|p| *p == pane).unwrap_or(0)];
    let n = rows.len();
    let header: Vec<Cell<'a>> = header.iter().map(|h| Cell::from(*h)).collect();
    let t = Table::new(
        rows.into_iter().map(pick).collect::<Vec<_>>(),
        keep.iter().map(|&i| widths[i]).collect::<Vec<_>>(),
    )
    .header(pick(header).style(theme.header()))
    .block(block)
    .column_spacing(1)
    .row_highlight_style(theme.selected());
    let mut state = TableState::default();
    if n > 0 && (app.focus == pane || pane == Pane::Ranks) {
        state.select(Some(cursor.min(n - 1)));
    }
    f.render_stateful_widget(t, area, &mut state);
}

fn empty(f: &mut Frame, area: Rect, block: Block<'_>, text: String, theme: Theme) {
    f.render_widget(
        Paragraph::new(Span::styled(text, theme.dim()))
            .wrap(Wrap { trim: true })
            .block(block),
        area,
    );
}

fn pane(f: &mut Frame, area: Rect, app: &App, pane: Pane, theme: Theme) {
    if area.height < 2 || area.width < 4 {
        return;
    }
    let Some(s) = &app.shown else {
        let b = block(app, pane, pane.title().to_owned(), theme);
        let why = match &app.conn {
            Conn::Reconnecting { reason, .. } => format!("no data yet: {reason}"),
            _ => "waiting for the first snapshot".to_owned(),
        };
        empty(f, area, b, why, theme);
        return;
    };
    match pane {
        Pane::Ranks => {
            let b = block(
                app,
                pane,
                format!("{} · sorted by {}", pane.title(), app.rank_sort.as_str()),
                theme,
            );
            let ranks = app.ranks();
            if ranks.is_empty() {
                let text = if app.filter.is_empty() {
                    "no training process yet: one appears when its CUPTI shim registers \
                     (CUDA_INJECTION64_PATH, or `slo-probe run -- CMD`)"
                } else {
                    "no process matches the filter"
                };
                empty(f, area, b, text.to_owned(), theme);
                return;
            }
            let strag = |pid: u32| {
                s.jobs
                    .iter()
                    .flat_map(|j| &j.ranks)
                    .find(|r| r.pid == pid)
                    .cloned()
            };
            let job_width = ranks
                .iter()
                .map(|p| p.job_id.as_deref().map_or(1, |j| j.chars().count()))
                .max()
                .unwrap_or(1)
                .clamp(3, 16) as u16;
            let rows = ranks
                .iter()
                .map(|p| {
                    let state = p.slo.as_ref().map_or(State::Unknown, |s| s.state);
                    let r = strag(p.pid);
                    let straggler = match r.as_ref() {
                        Some(r) if r.straggler.is_some() => {
                            format!("◀ {}", r.straggler.as_deref().unwrap_or(""))
                        }
                        Some(r) => r.relative.map_or(String::new(), |x| format!("{x:.2}")),
                        None => String::new(),
                    };
                    Vec::from([
                        Cell::from(p.job_id.clone().unwrap_or_else(|| "-".into())),
                        Cell::from(p.rank.map_or("-".into(), |r| r.to_string())),
                        Cell::from(p.pid.to_string()),
                        Cell::from(Span::styled(
                            pct01(p.slo.as_ref().and_then(|s| s.score)),
                            theme.state(state),
                        )),
                        Cell::from(Span::styled(state.as_str(), theme.state(state))),
                        Cell::from(ns(p.iterations.wall_p50_ns)),
                        Cell::from(ns(p.iterations.wall_p99_ns)),
                        Cell::from(p.violations.iter().filter(|v| v.open).count().to_string()),
                        Cell::from(trend(&p.iterations.recent_wall_ns, 10)),
                        Cell::from(straggler),
                    ])
                })
                .collect();
            table(
                f,
                area,
                app,
                pane,
                b,
                &[
                    "job",
                    "rank",
                    "pid",
                    "score",
                    "state",
                    "iter p50",
                    "p99",
                    "viol",
                    "recent",
                    "rel/straggler",
                ],
                rows,
                &[
                    Constraint::Length(job_width),
                    Constraint::Length(4),
                    Constraint::Length(7),
                    Constraint::Length(6),
                    Constraint::Length(9),
                    Constraint::Length(8),
                    Constraint::Length(8),
                    Constraint::Length(4),
                    Constraint::Length(10),
                    Constraint::Min(6),
                ],
                &[0, 5, 0, 0, 0, 6, 0, 3, 7, 2],
                theme,
            );
        }
        Pane::Slo => {
            let sel = app.selected();
            let title = match sel {
                Some(p) => format!(
                    "{} · pid {}{}{}",
                    pane.title(),
                    p.pid,
                    p.rank.map_or(String::new(), |r| format!(" rank {r}")),
                    p.slo
                        .as_ref()
                        .filter(|s| s.learning)
                        .map_or("", |_| " · learning baselines")
                ),
                None => pane.title().to_owned(),
            };
            let b = block(app, pane, title, theme);
            let rows = app.slo_rows();
            if rows.is_empty() {
                empty(
                    f,
                    area,
                    b,
                    "no SLO tree yet: it starts with the first iterations".to_owned(),
                    theme,
                );
                return;
            }
            let rows = rows
                .iter()
                .map(|(depth, n)| {
                    let threshold = n.threshold.map_or("-".to_owned(), |t| {
                        format!(
                            "{} {}",
                            if n.objective == crate::api::types::Objective::Above {
                                ">"
                            } else {
                                "<"
                            },
                            num(Some(t))
                        )
                    });
                    Vec::from([
                        Cell::from(format!("{}{} {}", "  ".repeat(*depth), n.name, n.stat)),
                        // The root's value is the tree's score.
                        Cell::from(if n.parent.is_empty() {
                            pct01(n.value)
                        } else {
                            format!("{} {}", num(n.value), n.unit)
                        }),
                        Cell::from(threshold),
                        // `ok*`: past its threshold, judged within it (the detail says why).
                        Cell::from(Span::styled(
                            if n.past_by_chance {
                                "ok*"
                            } else {
                                n.state.as_str()
                            },
                            theme.state(n.state),
                        )),
                        Cell::from(pct01(n.compliance)),
                        Cell::from(num(n.burn_rate)),
                    ])
                })
                .collect();
            table(
                f,
                area,
                app,
                pane,
                b,
                &["node", "value", "threshold", "state", "compliance", "burn"],
                rows,
                &[
                    Constraint::Min(18),
                    Constraint::Length(13),
                    Constraint::Length(10),
                    Constraint::Length(9),
                    Constraint::Length(10),
                    Constraint::Length(6),
                ],
                &[0, 0, 1, 0, 3, 2],
                theme,
            );
        }
        Pane::Violations => {
            let b = block(app, pane, pane.title().to_owned(), theme);
            let v = app.violations();
            if v.is_empty() {
                empty(f, area, b, "none".to_owned(), theme);
                return;
            }
            let rows = v
                .iter()
                .map(|v| {
                    Vec::from([
                        Cell::from(v.pid.to_string()),
                        Cell::from(Span::styled(
                            v.severity.as_str(),
                            theme.severity(v.severity),
                        )),
                        Cell::from(v.chain.clone()),
                    ])
                })
                .collect();
            table(
                f,
                area,
                app,
                pane,
                b,
                &["pid", "severity", "chain (Enter: details)"],
                rows,
                &[
                    Constraint::Length(7),
                    Constraint::Length(8),
                    Constraint::Min(10),
                ],
                &[0, 1, 0],
                theme,
            );
        }
        Pane::Operators => {
            let title = match app.selected() {
                Some(p) => format!(
                    "{} · pid {} · by {}",
                    pane.title(),
                    p.pid,
                    if app.ops_by_name { "name" } else { "GPU time" }
                ),
                None => pane.title().to_owned(),
            };
            let b = block(app, pane, title, theme);
            let ops = app.operators();
            if ops.is_empty() {
                empty(
                    f,
                    area,
                    b,
                    "no GPU activity traced for this process".to_owned(),
                    theme,
                );
                return;
            }
            let rows = ops
                .iter()
                .map(|o| {
                    Vec::from([
                        Cell::from(format!("{:.1}%", 100.0 * o.share)),
                        Cell::from(human_ns(o.gpu_ns_per_iteration)),
                        Cell::from(o.kind.clone()),
                        Cell::from(o.op.clone()),
                    ])
                })
                .collect();
            table(
                f,
                area,
                app,
                pane,
                b,
                &["share", "per iter", "kind", "operator"],
                rows,
                &[
                    Constraint::Length(6),
                    Constraint::Length(9),
                    Constraint::Length(13),
                    Constraint::Min(24),
                ],
                &[0, 1, 2, 0],
                theme,
            );
        }
        Pane::Host => {
            let b = block(app, pane, pane.title().to_owned(), theme);
            if s.host.roles.is_empty() {
                let why = s
                    .agent
                    .probes
                    .iter()
                    .find(|p| p.name == "runqueue" && !p.up)
                    .map_or("no threads seen yet".to_owned(), |p| {
                        format!("scheduling probes down: {}", p.reason)
                    });
                empty(f, area, b, why, theme);
                return;
            }
            let rows = s
                .host
                .roles
                .iter()
                .map(|r| {
                    Vec::from([
                        Cell::from(r.role.clone()),
                        Cell::from(r.threads.to_string()),
                        Cell::from(
                            app.runq_rates
                                .get(&r.role)
                                .map_or("-".to_owned(), |v| format!("{v:.1}")),
                        ),
                        Cell::from(r.runq_p99_ns.map_or("-".to_owned(), human_ns)),
                        Cell::from(human_ns(r.offcpu_involuntary_ns as f64)),
                        Cell::from(human_bytes(r.tcp_sent_bytes + r.tcp_recv_bytes)),
                        Cell::from(r.retransmits.to_string()),
                    ])
                })
                .collect();
            table(
                f,
                area,
                app,
                pane,
                b,
                &[
                    "role",
                    "threads",
                    "runq ms/s",
                    "wait p99",
                    "preempted",
                    "tcp",
                    "retrans",
                ],
                rows,
                &[
                    Constraint::Length(13),
                    Constraint::Length(7),
                    Constraint::Length(9),
                    Constraint::Length(9),
                    Constraint::Length(10),
                    Constraint::Length(10),
                    Constraint::Length(7),
                ],
                &[0, 3, 0, 0, 2, 1, 4],
                theme,
            );
        }
        Pane::Gpus => {
            let b = block(app, pane, pane.title().to_owned(), theme);
            if s.gpus.is_empty() {
                let why = s
                    .agent
                    .probes
                    .iter()
                    .find(|p| p.name == "nvml" && !p.up && !p.reason.is_empty())
                    .map_or("no GPU seen (NVML)".to_owned(), |p| {
                        format!("no GPU metrics: {}", p.reason)
                    });
                empty(f, area, b, why, theme);
                return;
            }
            let rows = s
                .gpus
                .iter()
                .map(|g| {
                    Vec::from([
                        Cell::from(g.index.to_string()),
                        Cell::from(g.name.trim_start_matches("NVIDIA ").to_owned()),
                        Cell::from(pct(g.util_percent)),
                        Cell::from(match (g.memory_used_bytes, g.memory_total_bytes) {
                            (Some(u), Some(t)) => {
                                let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
                                format!("{:.0}/{:.0} GiB", gib(u), gib(t))
                            }
                            _ => "-".to_owned(),
                        }),
                        Cell::from(pct(g.sm_active_percent)),
                        Cell::from(pct(g.sm_occupancy_percent)),
                        Cell::from(pct(g.dram_bw_percent)),
                        Cell::from(pct(g.tensor_percent)),
                        Cell::from(
                            g.power_watts
                                .map_or("-".to_owned(), |w| format!("{w:.0} W")),
                        ),
                    ])
                })
                .collect();
            table(
                f,
                area,
                app,
                pane,
                b,
                &[
                    "gpu", "name", "util", "memory", "SM act", "occ", "dram", "tensor", "power",
                ],
                rows,
                &[
                    Constraint::Length(3),
                    Constraint::Max(10),
                    Constraint::Length(5),
                    Constraint::Length(11),
                    Constraint::Length(6),
                    Constraint::Length(4),
                    Constraint::Length(5),
                    Constraint::Length(6),
                    Constraint::Length(6),
                ],
                &[0, 1, 0, 3, 4, 5, 6, 7, 2],
                theme,
            );
        }
        Pane::Healer => {
            let Some(h) = &s.healer else {
                return;
            };
            let b = block(
                app,
                pane,
                format!("{} · {} · {}", pane.title(), h.mode, h.state),
                theme,
            );
            if h.timeline.is_empty() {
                empty(f, area, b, "no action yet".to_owned(), theme);
                return;
            }
            let rows = h
                .timeline
                .iter()
                .rev()
                .map(|e| {
                    Vec::from([
                        Cell::from(format!("#{}", e.id)),
                        Cell::from(e.kind.clone()),
                        Cell::from(e.strategy.clone()),
                        Cell::from(e.target.clone()),
                        Cell::from(e.detail.clone()),
                    ])
                })
                .collect();
            table(
                f,
                area,
                app,
                pane,
                b,
                &["id", "event", "strategy", "target", "detail"],
                rows,
                &[
                    Constraint::Length(4),
                    Constraint::Length(9),
                    Constraint::Length(18),
                    Constraint::Length(18),
                    Constraint::Min(10),
                ],
                &[0, 0, 0, 1, 0],
                theme,
            );
        }
    }
}

fn popup_area(area: Rect, width: u16, height: u16) -> Rect {
    let w = width.min(area.width.saturating_sub(2)).max(1);
    let h = height.min(area.height.saturating_sub(2)).max(1);
    Rect {
        x: area.x + (area.width.saturating_sub(w)) / 2,
        y: area.y + (area.height.saturating_sub(h)) / 2,
        width: w,
        height: h,
    }
}

fn detail(f: &mut Frame, area: Rect, app: &App, d: &Detail, theme: Theme) {
    let mut lines: Vec<Line> = Vec::new();
    let title;
    match d {
        Detail::Violation(pid, id) => {
            let v = app
                .shown
                .iter()
                .flat_map(|s| &s.processes)
                .flat_map(|p| &p.violations)
                .find(|v| v.pid == *pid && v.id == *id);
            title = format!(" violation #{id} of pid {pid} ");
            let Some(v) = v else {
                return;
            };
            lines.push(Line::from(vec![
                Span::styled(v.severity.as_str().to_owned(), theme.severity(v.severity)),
                Span::raw(format!(
                    " · node {} · value {} (threshold {}, baseline {})",
                    v.node,
                    num(Some(v.value)),
                    num(Some(v.threshold)),
                    num(v.baseline)
                )),
            ]));
            lines.push(Line::raw(""));
            for (k, part) in v.chain.split(" ← ").enumerate() {
                lines.push(Line::raw(if k == 0 {
                    part.to_owned()
                } else {
                    format!("{}← {part}", "  ".repeat(k))
                }));
            }
            if v.causes.len() > 1 {
                lines.push(Line::raw(""));
                lines.push(Line::styled("other operators:", theme.header()));
                for c in v.causes.iter().skip(1) {
                    lines.push(Line::raw(format!(
                        "  {} {:+.2} ms per iteration ({}: {})",
                        c.op,
                        c.delta_ns / 1e6,
                        c.dimension,
                        c.detail
                    )));
                }
            }
            if !v.host_causes.is_empty() {
                lines.push(Line::raw(""));
                lines.push(Line::styled("host:", theme.header()));
                for h in &v.host_causes {
                    lines.push(Line::raw(format!("  {h}")));
                }
            }
        }
        Detail::Node(name) => {
            title = format!(" {name} ");
            let Some((_, n)) = app.slo_rows().into_iter().find(|(_, n)| &n.name == name) else {
                return;
            };
            for (k, v) in [
                ("metric", format!("{} {}", n.metric, n.stat)),
                ("value", format!("{} {}", num(n.value), n.unit)),
                (
                    "threshold",
                    format!(
                        "{} ({})",
                        num(n.threshold),
                        n.threshold_source.as_deref().unwrap_or("-")
                    ),
                ),
                ("baseline", num(n.baseline)),
                (
                    "state",
                    if n.past_by_chance {
                        slo_probe_core::slo::NodeView::PAST_BY_CHANCE.to_owned()
                    } else {
                        n.state.as_str().to_owned()
                    },
                ),
                ("compliance", pct01(n.compliance)),
                ("burn rate", num(n.burn_rate)),
                ("weight", num(Some(n.weight))),
                ("windows", n.windows.to_string()),
                ("violations", n.violations.to_string()),
            ] {
                lines.push(Line::from(vec![
                    Span::styled(format!("{k:<11}"), theme.header()),
                    Span::raw(v),
                ]));
            }
        }
    }
    lines.push(Line::raw(""));
    lines.push(Line::styled("Esc closes", theme.dim()));
    let r = popup_area(area, 100, lines.len() as u16 + 2);
    f.render_widget(Clear, r);
    f.render_widget(
        Paragraph::new(Text::from(lines))
            .wrap(Wrap { trim: false })
            .block(
                Block::bordered()
                    .title(title)
                    .border_style(theme.border(true)),
            ),
        r,
    );
}

fn help(f: &mut Frame, area: Rect, theme: Theme) {
    let lines: Vec<Line> = HELP
        .iter()
        .map(|(k, v)| {
            Line::from(vec![
                Span::styled(format!("{k:<16}"), theme.header()),
                Span::raw(*v),
            ])
        })
        .collect();
    let r = popup_area(area, 90, lines.len() as u16 + 2);
    f.render_widget(Clear, r);
    f.render_widget(
        Paragraph::new(Text::from(lines))
            .wrap(Wrap { trim: false })
            .block(
                Block::bordered()
                    .title(" keys (Esc or ? closes) ")
                    .border_style(theme.border(true)),
            ),
        r,
    );
}

/// The view rendered once into text of `width` × `height` (for `--once` and tests): the
/// terminal's cells, row by row, trailing blanks cut.
pub fn render_text(app: &App, width: u16, height: u16) -> String {
    let backend = ratatui::backend::TestBackend::new(width, height);
    let mut term = match ratatui::Terminal::new(backend) {
        Ok(t) => t,
        Err(never) => match never {},
    };
    let _ = term.draw(|f| draw(f, app, Theme::plain()));
    let buf = term.backend().buffer();
    let mut out = String::new();
    for y in 0..buf.area.height {
        let mut line = String::new();
        for x in 0..buf.area.width {
            line.push_str(buf[(x, y)].symbol());
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::top::app::{tests::sample, Action, Event};

    fn app() -> App {
        let mut a = App::new(Conn::Live {
            url: "http://127.0.0.1:9617".into(),
        });
        a.apply(Event::Full(Box::new(sample())));
        a
    }

    fn check(name: &str, text: &str) {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("src/cli/top/snapshots")
            .join(format!("{name}.txt"));
        if std::env::var_os("UPDATE_SNAPSHOTS").is_some() {
            std::fs::create_dir_all(path.parent().expect("dir")).expect("mkdir");
            std::fs::write(&path, text).expect("write snapshot");
            return;
        }
        let want = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!(
                "{}: {e}; run with UPDATE_SNAPSHOTS=1 to write it:\n{text}",
                path.display()
            )
        });
        assert_eq!(
            text,
            want,
            "render of {name} changed (UPDATE_SNAPSHOTS=1 rewrites {}):\n{text}",
            path.display()
        );
    }

    #[test]
    fn renders_at_three_sizes() {
        let a = app();
        for (w, h) in [(80, 24), (120, 40), (60, 20)] {
            let text = render_text(&a, w, h);
            assert_eq!(text.lines().count(), h as usize);
            assert!(text.contains("slo-probe top"), "{text}");
            assert!(text.contains("llama"), "{w}x{h}:\n{text}");
            check(&format!("top-{w}x{h}"), &text);
        }
        // Every pane at once only when wide.
        let wide = render_text(&a, 120, 40);
        for title in [
            "SLO tree",
            "open violations",
            "top operators",
            "host by role",
            "GPUs",
        ] {
            assert!(wide.contains(title), "{title}:\n{wide}");
        }
        assert!(wide.contains("aten::mm"), "{wide}");
        assert!(wide.contains("critical"), "{wide}");
    }

    #[test]
    fn popups_and_states_render() {
        let mut a = app();
        for x in [Action::NextPane, Action::NextPane, Action::Enter] {
            a.apply(Event::Action(x));
        }
        let text = render_text(&a, 80, 24);
        assert!(text.contains("violation #1 of pid 101"), "{text}");
        assert!(text.contains("← aten::mm"), "{text}");
        check("top-violation-80x24", &text);
        a.apply(Event::Action(Action::Back));
        a.apply(Event::Action(Action::Help));
        let text = render_text(&a, 60, 20);
        assert!(text.contains("keys (Esc or ? closes)"), "{text}");

        let mut waiting = App::new(Conn::Reconnecting {
            url: "http://10.0.0.3:9617".into(),
            reason: "connection refused".into(),
            retry_in: std::time::Duration::from_millis(2000),
        });
        waiting.apply(Event::Action(Action::Freeze));
        let text = render_text(&waiting, 80, 24);
        assert!(
            text.contains("reconnecting to http://10.0.0.3:9617 in 2.0 s"),
            "{text}"
        );
        assert!(text.contains("FROZEN"), "{text}");
        // Tiny terminals degrade instead of refusing.
        let text = render_text(&app(), 30, 8);
        assert!(text.contains("slo-probe"), "{text}");
    }

    #[test]
    fn no_color_drops_colours_but_keeps_the_selection() {
        let a = app();
        let backend = ratatui::backend::TestBackend::new(80, 24);
        let mut term = ratatui::Terminal::new(backend).expect("terminal");
        term.draw(|f| draw(f, &a, Theme::plain())).expect("draw");
        let buf = term.backend().buffer();
        let mut reversed = 0;
        for cell in buf.content() {
            assert_eq!(cell.fg, Color::Reset, "a colour with NO_COLOR");
            assert_eq!(cell.bg, Color::Reset);
            if cell.modifier.contains(Modifier::REVERSED) {
                reversed += 1;
            }
        }
        assert!(reversed > 0, "the selected row is reversed");
        let mut term =
            ratatui::Terminal::new(ratatui::backend::TestBackend::new(80, 24)).expect("terminal");
        term.draw(|f| draw(f, &a, Theme { color: true }))
            .expect("draw");
        assert!(term
            .backend()
            .buffer()
            .content()
            .iter()
            .any(|c| c.fg == Color::Red));
    }

    #[test]
    fn the_healer_pane_appears_with_a_healer() {
        let mut s = sample();
        s.healer = Some(crate::api::types::Healer {
            mode: "shadow".into(),
            state: "verifying".into(),
            timeline: vec![crate::api::types::HealerEvent {
                id: 3,
                kind: "decided".into(),
                strategy: "deadline-aware".into(),
                target: "pid 101 main".into(),
                detail: "would raise priority".into(),
                ..Default::default()
            }],
        });
        let mut a = App::new(Conn::Live { url: "u".into() });
        a.apply(Event::Full(Box::new(s)));
        let wide = render_text(&a, 120, 40);
        assert!(wide.contains("healer · shadow · verifying"), "{wide}");
        assert!(wide.contains("deadline-aware"), "{wide}");
        for _ in 0..6 {
            a.apply(Event::Action(Action::NextPane));
        }
        assert_eq!(a.focus, Pane::Healer);
        assert!(render_text(&a, 80, 24).contains("would raise priority"));
        // Without one, no pane and no tab for it.
        assert!(!render_text(&app(), 120, 40).contains("healer"));
    }

    /// A P99 shown past its threshold but judged within it reads `ok*` in the tree, and the
    /// node's detail says why (as `slo-probe report` does).
    #[test]
    fn a_p99_past_its_threshold_by_chance_is_marked() {
        let mut s = sample();
        for p in &mut s.processes {
            for n in p.slo.iter_mut().flat_map(|t| t.nodes.iter_mut()) {
                if n.name == "iteration.median" {
                    n.value = Some(30.0);
                    n.past_by_chance = true;
                }
            }
        }
        let mut a = App::new(Conn::Live {
            url: "http://127.0.0.1:9617".into(),
        });
        a.apply(Event::Full(Box::new(s)));
        let text = render_text(&a, 120, 40);
        assert!(text.contains("ok*"), "{text}");
        assert!(!render_text(&app(), 120, 40).contains("ok*"));
    }

    #[test]
    fn trends_scale_to_their_range() {
        assert_eq!(trend(&[1, 2, 3, 8], 4), "▁▂▃█");
        assert_eq!(trend(&[5, 5], 4), "▁▁");
        assert_eq!(trend(&[], 4), "");
        assert_eq!(trend(&[1, 2, 3, 4, 5, 6], 2), "▁█");
    }
}
