//! The state of `slo-probe top` and its reducer: [`App::apply`] takes an [`Event`] (a snapshot
//! or delta from the source, a connection change, a user action) and updates the state. No
//! terminal and no I/O here, so every behaviour is a unit test.

use std::{collections::BTreeMap, time::Duration};

use crate::api::types::{Delta, Process, Severity, SloNode, Snapshot, State, Violation};

/// The panes, in Tab order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Pane {
    /// Jobs and ranks (training processes) with their SLO score.
    Ranks,
    /// The selected process's SLO tree.
    Slo,
    /// Open violations of every process, with their chains.
    Violations,
    /// The selected process's operators by GPU time.
    Operators,
    /// Host threads by role.
    Host,
    /// GPUs.
    Gpus,
    /// The healer's timeline.
    Healer,
}

impl Pane {
    /// Every pane, in Tab order.
    pub const ALL: [Pane; 7] = [
        Pane::Ranks,
        Pane::Slo,
        Pane::Violations,
        Pane::Operators,
        Pane::Host,
        Pane::Gpus,
        Pane::Healer,
    ];

    /// Its title.
    pub fn title(self) -> &'static str {
        match self {
            Pane::Ranks => "jobs and ranks",
            Pane::Slo => "SLO tree",
            Pane::Violations => "open violations",
            Pane::Operators => "top operators",
            Pane::Host => "host by role",
            Pane::Gpus => "GPUs",
            Pane::Healer => "healer",
        }
    }

    fn index(self) -> usize {
        Pane::ALL.iter().position(|p| *p == self).unwrap_or(0)
    }
}

/// The connection to the data.
#[derive(Clone, Debug, PartialEq)]
pub enum Conn {
    /// Connecting to an agent.
    Connecting {
        /// Its URL.
        url: String,
    },
    /// Receiving from an agent.
    Live {
        /// Its URL.
        url: String,
    },
    /// Lost; the next try is in `retry_in`.
    Reconnecting {
        /// Its URL.
        url: String,
        /// Why it was lost.
        reason: String,
        /// Until the next try.
        retry_in: Duration,
    },
    /// A recording.
    Replay {
        /// The files.
        what: String,
    },
}

/// What the user asks (from [`super::keys`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Leave.
    Quit,
    /// Show or hide the key help.
    Help,
    /// Close a popup, end the filter, or go back to the ranks.
    Back,
    /// Start typing a filter.
    Filter,
    /// A character of the filter.
    Input(char),
    /// Delete the filter's last character.
    Backspace,
    /// End typing the filter (keeping it).
    FilterDone,
    /// Cursor up.
    Up,
    /// Cursor down.
    Down,
    /// Cursor a page up.
    PageUp,
    /// Cursor a page down.
    PageDown,
    /// Cursor to the first row.
    Top,
    /// Cursor to the last row.
    Bottom,
    /// Drill in: a rank to its SLO tree, a violation or node to its details.
    Enter,
    /// The next pane.
    NextPane,
    /// The previous pane.
    PrevPane,
    /// Freeze or unfreeze the display (data still arrives).
    Freeze,
    /// The next sort order of the focused pane.
    Sort,
}

/// What changes the state.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// A whole snapshot.
    Full(Box<Snapshot>),
    /// What changed.
    Delta(Box<Delta>),
    /// The connection changed.
    Conn(Conn),
    /// The user.
    Action(Action),
}

/// Sort orders of the ranks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RankSort {
    /// By job, rank, pid.
    #[default]
    Rank,
    /// Lowest SLO score first.
    Score,
    /// Slowest iteration P99 first.
    P99,
    /// By pid.
    Pid,
}

impl RankSort {
    fn next(self) -> Self {
        match self {
            Self::Rank => Self::Score,
            Self::Score => Self::P99,
            Self::P99 => Self::Pid,
            Self::Pid => Self::Rank,
        }
    }

    /// In words.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Rank => "job, rank",
            Self::Score => "SLO score",
            Self::P99 => "iteration p99",
            Self::Pid => "pid",
        }
    }
}

/// A popup with the details of one row.
#[derive(Clone, Debug, PartialEq)]
pub enum Detail {
    /// A violation (pid, id).
    Violation(u32, u64),
    /// An SLO node of the selected process.
    Node(String),
}

/// Rows a page moves.
const PAGE: usize = 10;

/// The whole state of the view.
#[derive(Clone, Debug)]
pub struct App {
    /// What is displayed (stays while frozen).
    pub shown: Option<Snapshot>,
    /// The latest state received.
    pub latest: Option<Snapshot>,
    /// Run-queue delay per role over the last tick, ms per s (from two snapshots).
    pub runq_rates: BTreeMap<String, f64>,
    /// The connection.
    pub conn: Conn,
    /// The focused pane.
    pub focus: Pane,
    /// The cursor of each pane.
    pub cursor: [usize; Pane::ALL.len()],
    /// The selected process (its pid: the cursor follows it when rows move).
    pub selected_pid: Option<u32>,
    /// The open popup.
    pub detail: Option<Detail>,
    /// The filter (case-insensitive substring of ranks, violations and operators).
    pub filter: String,
    /// Typing the filter.
    pub editing: bool,
    /// The key help is shown.
    pub help: bool,
    /// The display is frozen.
    pub frozen: bool,
    /// Order of the ranks.
    pub rank_sort: RankSort,
    /// Operators by name instead of by share.
    pub ops_by_name: bool,
    /// Leave.
    pub quit: bool,
}

impl App {
    /// A view of nothing yet.
    pub fn new(conn: Conn) -> Self {
        Self {
            shown: None,
            latest: None,
            runq_rates: BTreeMap::new(),
            conn,
            focus: Pane::Ranks,
            cursor: [0; Pane::ALL.len()],
            selected_pid: None,
            detail: None,
            filter: String::new(),
            editing: false,
            help: false,
            frozen: false,
            rank_sort: RankSort::default(),
            ops_by_name: false,
            quit: false,
        }
    }

    /// Applies one event.
    pub fn apply(&mut self, e: Event) {
        match e {
            Event::Full(s) => self.receive(*s),
            Event::Delta(d) => {
                if let Some(mut s) = self.latest.clone() {
                    s.apply(*d);
                    self.receive(s);
                }
            }
            Event::Conn(c) => self.conn = c,
            Event::Action(a) => self.act(a),
        }
    }

    fn receive(&mut self, s: Snapshot) {
        if let Some(prev) = &self.latest {
            let dt = s.taken_at_ns.saturating_sub(prev.taken_at_ns) as f64 / 1e9;
            if dt > 0.0 {
                self.runq_rates = s
                    .host
                    .roles
                    .iter()
                    .filter_map(|r| {
                        let before = prev.host.roles.iter().find(|p| p.role == r.role)?;
                        let ns = r.runq_ns.saturating_sub(before.runq_ns) as f64;
                        Some((r.role.clone(), ns / 1e6 / dt))
                    })
                    .collect();
            }
        }
        self.latest = Some(s);
        if !self.frozen {
            self.shown = self.latest.clone();
        }
        self.clamp();
    }

    /// The rows of the ranks pane: the shown processes, filtered and sorted.
    pub fn ranks(&self) -> Vec<&Process> {
        let Some(s) = &self.shown else {
            return Vec::new();
        };
        let mut v: Vec<&Process> = s
            .processes
            .iter()
            .filter(|p| {
                self.matches(&format!(
                    "{} {} {} rank{}",
                    p.job_id.as_deref().unwrap_or(""),
                    p.pid,
                    p.name,
                    p.rank.map_or(String::new(), |r| r.to_string())
                ))
            })
            .collect();
        match self.rank_sort {
            RankSort::Rank => {}
            RankSort::Score => v.sort_by(|a, b| {
                let s = |p: &Process| p.slo.as_ref().and_then(|s| s.score).unwrap_or(2.0);
                s(a).total_cmp(&s(b))
            }),
            RankSort::P99 => {
                v.sort_by_key(|p| std::cmp::Reverse(p.iterations.wall_p99_ns.unwrap_or(0)))
            }
            RankSort::Pid => v.sort_by_key(|p| p.pid),
        }
        v
    }

    /// The process the detail panes show: the one under the ranks cursor.
    pub fn selected(&self) -> Option<&Process> {
        let ranks = self.ranks();
        ranks
            .get(self.cursor[Pane::Ranks.index()])
            .copied()
            .or_else(|| ranks.first().copied())
    }

    /// The SLO nodes of the selected process in tree order, with their depth.
    pub fn slo_rows(&self) -> Vec<(usize, &SloNode)> {
        let Some(slo) = self.selected().and_then(|p| p.slo.as_ref()) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        fn walk<'a>(
            nodes: &'a [SloNode],
            parent: &str,
            depth: usize,
            out: &mut Vec<(usize, &'a SloNode)>,
        ) {
            for n in nodes.iter().filter(|n| n.parent == parent) {
                out.push((depth, n));
                walk(nodes, &n.name, depth + 1, out);
            }
        }
        // The root has an empty parent.
        walk(&slo.nodes, "", 0, &mut out);
        out
    }

    /// Open violations (every process), worst first, filtered.
    pub fn violations(&self) -> Vec<&Violation> {
        let Some(s) = &self.shown else {
            return Vec::new();
        };
        s.open_violations()
            .into_iter()
            .filter(|v| self.matches(&format!("{} {} {}", v.pid, v.node, v.chain)))
            .collect()
    }

    /// The selected process's operators, filtered, in the chosen order.
    pub fn operators(&self) -> Vec<&crate::api::types::Operator> {
        let Some(p) = self.selected() else {
            return Vec::new();
        };
        let mut v: Vec<_> = p.operators.iter().filter(|o| self.matches(&o.op)).collect();
        if self.ops_by_name {
            v.sort_by(|a, b| a.op.cmp(&b.op));
        }
        v
    }

    fn matches(&self, text: &str) -> bool {
        self.filter.is_empty() || text.to_lowercase().contains(&self.filter.to_lowercase())
    }

    /// Rows of a pane.
    pub fn rows(&self, pane: Pane) -> usize {
        let s = self.shown.as_ref();
        match pane {
            Pane::Ranks => self.ranks().len(),
            Pane::Slo => self.slo_rows().len(),
            Pane::Violations => self.violations().len(),
            Pane::Operators => self.operators().len(),
            Pane::Host => s.map_or(0, |s| s.host.roles.len()),
            Pane::Gpus => s.map_or(0, |s| s.gpus.len()),
            Pane::Healer => s
                .and_then(|s| s.healer.as_ref())
                .map_or(0, |h| h.timeline.len()),
        }
    }

    /// Whether a pane has anything to show (the healer's only once a healer runs).
    pub fn has_pane(&self, pane: Pane) -> bool {
        pane != Pane::Healer || self.shown.as_ref().is_some_and(|s| s.healer.is_some())
    }

    /// The worst state among the shown processes' roots.
    pub fn worst(&self) -> State {
        let rank = |s: State| match s {
            State::Critical => 4,
            State::Warning => 3,
            State::Breaching => 2,
            State::Ok => 1,
            State::Unknown => 0,
        };
        self.shown
            .iter()
            .flat_map(|s| &s.processes)
            .filter_map(|p| p.slo.as_ref().map(|s| s.state))
            .max_by_key(|s| rank(*s))
            .unwrap_or(State::Unknown)
    }

    /// The critical open violations shown.
    pub fn critical(&self) -> usize {
        self.violations()
            .iter()
            .filter(|v| v.severity == Severity::Critical)
            .count()
    }

    fn clamp(&mut self) {
        // The ranks cursor follows the selected pid when rows move.
        if let Some(pid) = self.selected_pid {
            if let Some(i) = self.ranks().iter().position(|p| p.pid == pid) {
                self.cursor[Pane::Ranks.index()] = i;
            }
        }
        for pane in Pane::ALL {
            let n = self.rows(pane);
            let c = &mut self.cursor[pane.index()];
            *c = (*c).min(n.saturating_sub(1));
        }
        self.selected_pid = self.selected().map(|p| p.pid);
    }

    fn act(&mut self, a: Action) {
        if self.editing {
            match a {
                Action::Input(c) => self.filter.push(c),
                Action::Backspace => {
                    self.filter.pop();
                }
                Action::FilterDone => self.editing = false,
                Action::Back => {
                    self.editing = false;
                    self.filter.clear();
                }
                Action::Quit => self.quit = true,
                _ => {}
            }
            self.cursor = [0; Pane::ALL.len()];
            self.selected_pid = None;
            self.clamp();
            return;
        }
        if self.help && !matches!(a, Action::Help | Action::Back | Action::Quit) {
            return;
        }
        let i = self.focus.index();
        match a {
            Action::Quit => self.quit = true,
            Action::Help => self.help = !self.help,
            Action::Back => {
                if self.help {
                    self.help = false;
                } else if self.detail.is_some() {
                    self.detail = None;
                } else if !self.filter.is_empty() {
                    self.filter.clear();
                } else {
                    self.focus = Pane::Ranks;
                }
            }
            Action::Filter => {
                self.editing = true;
                self.detail = None;
            }
            Action::Input(_) | Action::Backspace | Action::FilterDone => {}
            Action::Up => self.cursor[i] = self.cursor[i].saturating_sub(1),
            Action::Down => self.cursor[i] += 1,
            Action::PageUp => self.cursor[i] = self.cursor[i].saturating_sub(PAGE),
            Action::PageDown => self.cursor[i] += PAGE,
            Action::Top => self.cursor[i] = 0,
            Action::Bottom => self.cursor[i] = usize::MAX,
            Action::Enter => match self.focus {
                Pane::Ranks if self.selected().is_some() => self.focus = Pane::Slo,
                Pane::Slo => {
                    let name = self
                        .slo_rows()
                        .get(self.cursor[i])
                        .map(|(_, n)| n.name.clone());
                    self.detail = name.map(Detail::Node);
                }
                Pane::Violations => {
                    let v = self.violations().get(self.cursor[i]).map(|v| (v.pid, v.id));
                    self.detail = v.map(|(pid, id)| Detail::Violation(pid, id));
                }
                _ => {}
            },
            Action::NextPane | Action::PrevPane => {
                let panes: Vec<Pane> = Pane::ALL
                    .into_iter()
                    .filter(|p| self.has_pane(*p))
                    .collect();
                let k = panes.iter().position(|p| *p == self.focus).unwrap_or(0);
                let n = panes.len();
                let k = if a == Action::NextPane {
                    (k + 1) % n
                } else {
                    (k + n - 1) % n
                };
                self.focus = panes[k];
                self.detail = None;
            }
            Action::Freeze => {
                self.frozen = !self.frozen;
                if !self.frozen {
                    self.shown = self.latest.clone();
                }
            }
            Action::Sort => match self.focus {
                Pane::Operators => self.ops_by_name = !self.ops_by_name,
                // The cursor follows the selected process to its new row.
                _ => self.rank_sort = self.rank_sort.next(),
            },
        }
        let moved = matches!(
            a,
            Action::Up
                | Action::Down
                | Action::PageUp
                | Action::PageDown
                | Action::Top
                | Action::Bottom
        );
        if moved && self.focus == Pane::Ranks {
            let n = self.rows(Pane::Ranks);
            let c = self.cursor[Pane::Ranks.index()].min(n.saturating_sub(1));
            self.cursor[Pane::Ranks.index()] = c;
            self.selected_pid = self.ranks().get(c).map(|p| p.pid);
        }
        self.clamp();
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::api::types::{Iterations, Operator, Slo, VERSION};

    /// Three ranks of one job; rank 1 has a critical violation.
    pub(crate) fn sample() -> Snapshot {
        let node = |name: &str, parent: &str, state: State, value: f64| SloNode {
            name: name.into(),
            parent: parent.into(),
            unit: "ms".into(),
            value: Some(value),
            threshold: Some(25.0),
            state,
            ..Default::default()
        };
        let process = |pid: u32, rank: u32, score: f64, p99_ms: u64, bad: bool| Process {
            pid,
            name: "python3".into(),
            rank: Some(rank),
            job_id: Some("llama".into()),
            connected: true,
            iterations: Iterations {
                total: 500,
                wall_p50_ns: Some(17_000_000),
                wall_p99_ns: Some(p99_ms * 1_000_000),
                recent_wall_ns: vec![17_000_000; 8],
                ..Default::default()
            },
            slo: Some(Slo {
                score: Some(score),
                state: if bad { State::Critical } else { State::Ok },
                nodes: vec![
                    SloNode {
                        unit: String::new(),
                        threshold: None,
                        ..node(
                            "job",
                            "",
                            if bad { State::Critical } else { State::Ok },
                            score,
                        )
                    },
                    node(
                        "iteration",
                        "job",
                        if bad { State::Critical } else { State::Ok },
                        p99_ms as f64,
                    ),
                    node("iteration.median", "iteration", State::Ok, 17.0),
                    node("data_loading", "job", State::Ok, 0.2),
                ],
                ..Default::default()
            }),
            violations: if bad {
                vec![Violation {
                    id: 1,
                    pid,
                    node: "iteration".into(),
                    severity: Severity::Critical,
                    open: true,
                    chain: "iteration p99 +120% (17.3 ms → 38.0 ms) ← aten::mm +20.1 ms per \
                            iteration (compute) ← main threads waited 4.1 ms per iteration"
                        .into(),
                    ..Default::default()
                }]
            } else {
                Vec::new()
            },
            operators: vec![
                Operator {
                    op: "aten::mm".into(),
                    kind: "compute".into(),
                    share: 0.6,
                    gpu_ns_per_iteration: 9e6,
                    ..Default::default()
                },
                Operator {
                    op: "aten::add".into(),
                    kind: "compute".into(),
                    share: 0.3,
                    gpu_ns_per_iteration: 4e6,
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        Snapshot {
            version: VERSION,
            node: "gpu-node-7".into(),
            taken_at_ns: 1_000_000_000,
            processes: vec![
                process(100, 0, 1.0, 18, false),
                process(101, 1, 0.62, 38, true),
                process(102, 2, 0.97, 19, false),
            ],
            host: crate::api::types::Host {
                roles: ["main", "data_loader", "communication"]
                    .iter()
                    .enumerate()
                    .map(|(k, r)| crate::api::types::RoleStats {
                        role: (*r).into(),
                        threads: 3 * (k as u32 + 1),
                        runq_ns: 40_000_000 * (k as u64 + 1),
                        runq_p99_ns: Some(250_000.0 * (k as f64 + 1.0)),
                        offcpu_involuntary_ns: 12_000_000,
                        tcp_sent_bytes: 1 << 30,
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            },
            gpus: vec![crate::api::types::Gpu {
                index: 0,
                name: "NVIDIA H200".into(),
                util_percent: Some(93.0),
                memory_used_bytes: Some(70 << 30),
                memory_total_bytes: Some(141 << 30),
                sm_active_percent: Some(88.0),
                sm_occupancy_percent: Some(41.0),
                dram_bw_percent: Some(37.0),
                tensor_percent: Some(52.0),
                power_watts: Some(512.0),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    fn app() -> App {
        let mut a = App::new(Conn::Live {
            url: "http://127.0.0.1:9617".into(),
        });
        a.apply(Event::Full(Box::new(sample())));
        a
    }

    fn act(a: &mut App, actions: &[Action]) {
        for x in actions {
            a.apply(Event::Action(*x));
        }
    }

    #[test]
    fn moving_selects_a_rank_and_enter_drills_into_its_tree() {
        let mut a = app();
        assert_eq!(a.selected().map(|p| p.pid), Some(100));
        act(&mut a, &[Action::Down]);
        assert_eq!(a.selected().map(|p| p.pid), Some(101));
        act(&mut a, &[Action::Down, Action::Down, Action::Down]);
        assert_eq!(a.selected().map(|p| p.pid), Some(102), "clamped");
        act(&mut a, &[Action::Up, Action::Enter]);
        assert_eq!(a.focus, Pane::Slo);
        let rows: Vec<(usize, &str)> = a
            .slo_rows()
            .iter()
            .map(|(d, n)| (*d, n.name.as_str()))
            .collect();
        assert_eq!(
            rows,
            [
                (0, "job"),
                (1, "iteration"),
                (2, "iteration.median"),
                (1, "data_loading")
            ]
        );
        act(&mut a, &[Action::Down, Action::Enter]);
        assert_eq!(a.detail, Some(Detail::Node("iteration".into())));
        act(&mut a, &[Action::Back]);
        assert_eq!(a.detail, None);
        act(&mut a, &[Action::Back]);
        assert_eq!(a.focus, Pane::Ranks);
    }

    #[test]
    fn tab_cycles_the_panes_there_are() {
        let mut a = app();
        let mut seen = vec![a.focus];
        for _ in 0..6 {
            act(&mut a, &[Action::NextPane]);
            seen.push(a.focus);
        }
        // No healer in the snapshot: its pane is skipped.
        assert_eq!(
            seen,
            [
                Pane::Ranks,
                Pane::Slo,
                Pane::Violations,
                Pane::Operators,
                Pane::Host,
                Pane::Gpus,
                Pane::Ranks
            ]
        );
        act(&mut a, &[Action::PrevPane]);
        assert_eq!(a.focus, Pane::Gpus);
    }

    #[test]
    fn filter_narrows_and_escape_clears_it() {
        let mut a = app();
        act(
            &mut a,
            &[
                Action::Filter,
                Action::Input('1'),
                Action::Input('0'),
                Action::Input('2'),
            ],
        );
        assert!(a.editing);
        assert_eq!(a.ranks().iter().map(|p| p.pid).collect::<Vec<_>>(), [102]);
        act(&mut a, &[Action::FilterDone]);
        assert!(!a.editing);
        assert_eq!(a.filter, "102");
        assert_eq!(a.selected().map(|p| p.pid), Some(102));
        act(&mut a, &[Action::Back]);
        assert!(a.filter.is_empty());
        assert_eq!(a.ranks().len(), 3);
        // Quit works while typing too.
        act(&mut a, &[Action::Filter, Action::Quit]);
        assert!(a.quit);
    }

    #[test]
    fn freeze_keeps_the_display_while_data_arrives() {
        let mut a = app();
        act(&mut a, &[Action::Freeze]);
        let mut next = sample();
        next.taken_at_ns = 2_000_000_000;
        next.processes.pop();
        a.apply(Event::Full(Box::new(next)));
        assert_eq!(a.ranks().len(), 3, "frozen");
        assert_eq!(a.latest.as_ref().map(|s| s.processes.len()), Some(2));
        act(&mut a, &[Action::Freeze]);
        assert_eq!(a.ranks().len(), 2);
    }

    #[test]
    fn deltas_apply_and_rates_come_from_two_snapshots() {
        let mut a = app();
        let mut host = crate::api::types::Host::default();
        host.roles.push(crate::api::types::RoleStats {
            role: "main".into(),
            runq_ns: 0,
            ..Default::default()
        });
        let mut s = sample();
        s.host = host.clone();
        a.apply(Event::Full(Box::new(s)));
        host.roles[0].runq_ns = 50_000_000;
        a.apply(Event::Delta(Box::new(Delta {
            version: VERSION,
            taken_at_ns: 2_000_000_000,
            host: Some(host),
            ..Default::default()
        })));
        assert_eq!(a.shown.as_ref().map(|s| s.taken_at_ns), Some(2_000_000_000));
        let rate = a.runq_rates.get("main").copied().unwrap_or_default();
        assert!((rate - 50.0).abs() < 1e-9, "{rate}");
    }

    #[test]
    fn sort_orders_ranks_and_operators() {
        let mut a = app();
        act(&mut a, &[Action::Sort]);
        assert_eq!(a.rank_sort, RankSort::Score);
        assert_eq!(a.ranks()[0].pid, 101, "lowest score first");
        act(&mut a, &[Action::Sort]);
        assert_eq!(a.ranks()[0].pid, 101, "slowest p99 first");
        act(
            &mut a,
            &[
                Action::NextPane,
                Action::NextPane,
                Action::NextPane,
                Action::Sort,
            ],
        );
        assert_eq!(a.focus, Pane::Operators);
        assert_eq!(a.operators()[0].op, "aten::add");
    }

    #[test]
    fn enter_on_a_violation_opens_it_and_help_swallows_keys() {
        let mut a = app();
        act(&mut a, &[Action::NextPane, Action::NextPane, Action::Enter]);
        assert_eq!(a.detail, Some(Detail::Violation(101, 1)));
        act(&mut a, &[Action::Help, Action::Down, Action::NextPane]);
        assert!(a.help);
        assert_eq!(a.focus, Pane::Violations);
        act(&mut a, &[Action::Back]);
        assert!(!a.help);
        assert_eq!(a.worst(), State::Critical);
        assert_eq!(a.critical(), 1);
    }
}
