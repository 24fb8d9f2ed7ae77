//! The healing loop around `slo_probe_core::healer`: every tick it takes the latest snapshot,
//! turns it into one observation per job ([`observe`]), runs each job's core healer, carries
//! out its decisions with the strategy's actuator ([`actuators`]) over the host's knobs
//! ([`knobs`]), journals every prior value, action and audit event ([`journal`]), and
//! publishes the healers' views for the snapshot.
//!
//! Modes: `off` (no loop; the journal is still restored at start), `shadow` (decide and
//! journal what would be written, never write a knob), `on`. Whatever mode, an agent that starts
//! restores first everything a previous run left applied; a clean stop leaves actions in force
//! (restoring on exit caused latency spikes for others: the journal restores them at the next
//! start or with `slo-probe heal undo`); a job that exits gets its actions undone.
//!
//! Needs: Linux 5.6 for `pidfd_getfd` (socket priority), 6.12 for the EEVDF slice hint, 5.15
//! for `cpu.idle`; CAP_SYS_NICE for priority and affinity, root on the host cgroupfs for cgroup
//! files, PTRACE_MODE_ATTACH on the job for its sockets.

pub mod actuators;
pub mod audit;
pub mod cgroups;
pub mod channel;
pub mod error;
pub mod host;
pub mod journal;
pub mod knobs;
pub mod managers;
pub mod observe;
pub mod shadow;

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    thread,
    time::Duration,
};

use slo_probe_core::{
    healer::{
        guard::BlastRadius, AuditEvent, Decision, Healer, HealerConfig, HealerView, Outcome,
        Strategy,
    },
    roles::Role,
    snapshot::Snapshot,
};
use tokio::sync::watch;

pub use self::error::HealError;
use crate::config::{HealConfig, HealMode};

use self::{
    actuators::{Applied, Ctx, Env, JobTarget},
    cgroups::Hierarchies,
    channel::Channel,
    journal::{ActionKey, Journal, Outstanding, Record, Restored},
    knobs::{HostKnobs, KnobIo, NoShimControl, ShimControl},
    managers::Managers,
};

/// The healers' views, for the snapshot (the lead merges them into the next one).
pub type Views = Arc<Mutex<Vec<HealerView>>>;

/// One job's healer and what it has in force.
struct Job {
    start: u64,
    healer: Healer,
    applied: BTreeMap<u64, Applied>,
    acked: u64,
}

/// The loop's state.
pub struct HealerLoop {
    config: HealConfig,
    healer_config: HealerConfig,
    run: String,
    journal: Journal,
    io: HostKnobs,
    cgroups: Hierarchies,
    managers: Managers,
    jobs: BTreeMap<u32, Job>,
    cpu: host::CpuSampler,
    views: Views,
}

/// Restores every action the journal lists as still applied, newest first, and journals that
/// `by` did it. What each restore did is returned.
pub fn restore_outstanding(
    journal: &mut Journal,
    io: &mut dyn KnobIo,
    by: &str,
) -> Result<Vec<(Outstanding, Restored)>, HealError> {
    let (lines, _) = journal::read(journal.path())?;
    restore_actions(journal, io, by, journal::outstanding(&lines))
}

/// Restores `actions` (as [`journal::outstanding`] lists them, oldest first), newest first,
/// and journals that `by` did it. What each restore did is returned, in that order.
pub fn restore_actions(
    journal: &mut Journal,
    io: &mut dyn KnobIo,
    by: &str,
    actions: Vec<Outstanding>,
) -> Result<Vec<(Outstanding, Restored)>, HealError> {
    let mut out = Vec::new();
    for o in actions.into_iter().rev() {
        let r = journal::restore(io, &o.changes);
        journal.append(Record::Reverted {
            key: o.key.clone(),
            strategy: o.strategy,
            by: by.to_owned(),
            restored: r.restored.len(),
            left: r.left.iter().chain(&r.failed).cloned().collect(),
        })?;
        out.push((o, r));
    }
    Ok(out)
}

/// The shim-depth strategy's knob: the floor under the depth the SLO engine asks of the shim.
impl ShimControl for crate::sources::shim::ShimHandle {
    fn depth(&self, pid: u32) -> Option<u32> {
        self.depth_floor(pid)
    }

    fn set_depth(&self, pid: u32, depth: u32) -> Result<(), String> {
        self.set_depth_floor(pid, depth).map_err(str::to_owned)
    }
}

/// The shim-depth knob through the collector's shim source, or none where the source is down
/// (the strategy is then skipped with that reason).
pub fn shim_control(shim: Option<&crate::sources::shim::ShimSource>) -> Box<dyn ShimControl> {
    match shim {
        Some(s) => Box::new(s.handle()),
        None => Box::new(NoShimControl),
    }
}

/// At the agent's start in any mode: restores what a previous run left applied, if there is a
/// journal at all (mode `off` never creates one).
pub fn restore_at_start(config: &HealConfig) -> Result<usize, HealError> {
    if config.mode == HealMode::Off && !config.journal.exists() {
        return Ok(0);
    }
    let mut journal = Journal::open(&config.journal)?;
    let mut io = HostKnobs {
        channel: Channel::new(config.jobs_dir.clone()),
        shim: Box::new(NoShimControl),
    };
    let restored = restore_outstanding(&mut journal, &mut io, "restart")?;
    for (o, r) in &restored {
        log::warn!(
            "heal: restored {} of job {} left applied by agent run {} ({} knobs restored, {} left \
             as they are{})",
            o.strategy,
            o.key.job,
            o.key.run,
            r.restored.len(),
            r.left.len() + r.failed.len(),
            if o.complete {
                ""
            } else {
                "; the agent died while applying it"
            }
        );
        for l in r.left.iter().chain(&r.failed) {
            log::warn!("heal:   {l}");
        }
    }
    Ok(restored.len())
}

impl HealerLoop {
    /// Opens the journal (restoring what a previous run left applied) and starts no thread.
    pub fn new(config: &HealConfig, shim: Box<dyn ShimControl>) -> Result<Self, HealError> {
        restore_at_start(config)?;
        let mut journal = Journal::open(&config.journal)?;
        let run = format!("{}-{}", std::process::id(), journal::wall_ms());
        journal.append(Record::Start {
            run: run.clone(),
            agent_pid: std::process::id(),
            mode: config.mode.as_str().to_owned(),
        })?;
        let mut cpu = host::CpuSampler::default();
        cpu.sample();
        Ok(Self {
            healer_config: config.healer_config(),
            run,
            journal,
            io: HostKnobs {
                channel: Channel::new(config.jobs_dir.clone()),
                shim,
            },
            cgroups: Hierarchies::detect(),
            managers: Managers::detect(&config.kubelet_cpu_manager_state),
            jobs: BTreeMap::new(),
            cpu,
            views: Arc::new(Mutex::new(Vec::new())),
            config: config.clone(),
        })
    }

    /// The healers' views, updated every tick.
    pub fn views(&self) -> Views {
        self.views.clone()
    }

    fn audit(&mut self, events: Vec<AuditEvent>) {
        if events.is_empty() {
            return;
        }
        let mut records = Vec::with_capacity(events.len());
        for e in events {
            let text = audit::body(&e);
            match audit::severity(&e) {
                audit::Severity::Info => log::info!("heal: {text}"),
                audit::Severity::Warn => log::warn!("heal: {text}"),
                audit::Severity::Error => log::error!("heal: {text}"),
            }
            records.push(Record::Audit {
                run: self.run.clone(),
                event: e,
            });
        }
        if let Err(err) = self.journal.append_all(records) {
            log::error!("heal: {}", crate::error_chain(&err));
        }
    }

    /// Why each strategy cannot act on `t` now.
    fn unavailable(&self, t: &JobTarget, neighbors: &[String]) -> BTreeMap<Strategy, String> {
        let ch = &self.io.channel;
        let has = |roles: &[Role]| t.threads.iter().any(|x| roles.contains(&x.role));
        let mut out = BTreeMap::new();
        if let Some(why) = ch.missing(t.pid, Strategy::GraphReplay) {
            out.insert(Strategy::GraphReplay, why);
        }
        let quota = t.cgroups.iter().any(|c| {
            let (file, unlimited): (&str, &[&str]) = if c.version == 1 {
                ("cpu.cfs_quota_us", &["-1"])
            } else {
                ("cpu.max", &["max"])
            };
            self.cgroups
                .dir(&c.path, cgroups::Controller::Cpu)
                .and_then(|(d, _)| std::fs::read_to_string(d.join(file)).ok())
                .and_then(|s| s.split_whitespace().next().map(str::to_owned))
                .is_some_and(|q| !unlimited.contains(&q.as_str()))
        });
        if neighbors.is_empty() && !quota {
            out.insert(
                Strategy::NeighborIsolation,
                "no neighbour cgroup is allowed or present (heal.neighbors) and the job's cgroup \
                 has no CPU quota to burst"
                    .to_owned(),
            );
        }
        if neighbors.is_empty() && ch.missing(t.pid, Strategy::MemoryFirst).is_some() {
            out.insert(
                Strategy::MemoryFirst,
                "no neighbour cgroup is allowed (heal.neighbors) and no python client registered \
                 memory-first"
                    .to_owned(),
            );
        }
        if !has(&[Role::Main, Role::Communication]) {
            out.insert(
                Strategy::DeadlineAware,
                "no main or communication thread of the job is known (eBPF probes down?)"
                    .to_owned(),
            );
        }
        if t.threads.len() < 2 {
            out.insert(
                Strategy::NumaPinning,
                "fewer than two threads of the job are known (eBPF probes down?)".to_owned(),
            );
        } else if let Some(why) = actuators::NumaPinning::too_few(
            actuators::NumaPinning::local_cpus(t, &self.cgroups).len(),
        ) {
            out.insert(Strategy::NumaPinning, why);
        } else if self.managers.kubelet_static
            && t.cgroups.iter().any(|c| c.path.contains("kubepods"))
        {
            out.insert(
                Strategy::NumaPinning,
                "kubelet's CPU manager (static policy) owns the job's cpusets".to_owned(),
            );
        }
        if !has(&[Role::DataLoader, Role::PinMemory])
            && ch.missing(t.pid, Strategy::IoBoost).is_some()
        {
            out.insert(
                Strategy::IoBoost,
                "the job has no loader thread and its client registered no io-boost".to_owned(),
            );
        }
        if !has(&[Role::Communication])
            && t.pids.iter().all(|p| knobs::tcp_sockets(*p).is_empty())
            && ch.missing(t.pid, Strategy::CommRelief).is_some()
        {
            out.insert(
                Strategy::CommRelief,
                "the job has no communication thread, no TCP connection and no client \
                 registration for comm-relief"
                    .to_owned(),
            );
        }
        out
    }

    /// One tick.
    pub fn tick(&mut self, s: &Snapshot) {
        self.cpu.sample();
        let extra = observe::HostExtra {
            host_cpu_util: self.cpu.total,
        };
        let observed = observe::observe(s, &extra);
        self.pick_up_external_undo();
        let neighbors = self.cgroups.expand(&self.config.neighbors);
        let mut seen = BTreeSet::new();
        for mut o in observed {
            let pid = o.target.pid;
            if o.target.start == 0 {
                continue; // gone between the snapshot and now
            }
            seen.insert(pid);
            if self
                .jobs
                .get(&pid)
                .is_some_and(|j| j.start != o.target.start)
            {
                self.job_gone(pid);
            }
            if !self.jobs.contains_key(&pid) {
                if let Err(e) = self.io.channel.prepare(pid) {
                    log::warn!("heal: {}", crate::error_chain(&e));
                }
                self.jobs.insert(
                    pid,
                    Job {
                        start: o.target.start,
                        healer: Healer::new(pid, self.healer_config.clone()),
                        applied: BTreeMap::new(),
                        acked: 0,
                    },
                );
            }
            o.obs.unavailable = self.unavailable(&o.target, &neighbors);
            let step = match self.jobs.get_mut(&pid) {
                Some(j) => j.healer.observe(&o.obs),
                None => continue,
            };
            self.audit(step.events);
            self.carry_out(pid, &o.target, &neighbors, step.decision);
            self.note_ack(pid);
        }
        let gone: Vec<u32> = self
            .jobs
            .keys()
            .copied()
            .filter(|p| !seen.contains(p))
            .collect();
        for pid in gone {
            self.job_gone(pid);
        }
        let now = s.taken_at_ns;
        let views = self.jobs.values().map(|j| j.healer.view(now)).collect();
        if let Ok(mut v) = self.views.lock() {
            *v = views;
        }
    }

    fn note_ack(&mut self, pid: u32) {
        let Some(job) = self.jobs.get_mut(&pid) else {
            return;
        };
        if job.applied.values().all(|a| {
            !a.changes
                .iter()
                .any(|c| matches!(c.knob, knobs::Knob::JobStrategy { .. }))
        }) {
            return;
        }
        if let Some(ack) = self.io.channel.ack(pid).filter(|a| a.seq > job.acked) {
            job.acked = ack.seq;
            log::info!(
                "heal: job {pid}: the python client applied {:?} (seq {}){}",
                ack.applied,
                ack.seq,
                if ack.errors.is_empty() {
                    String::new()
                } else {
                    format!("; callbacks raised: {:?}", ack.errors)
                }
            );
        }
    }

    fn ctx_parts(&self, target: &JobTarget) -> BlastRadius {
        BlastRadius {
            pids: target.pids.clone(),
            cgroups: target.cgroups.iter().map(|c| c.path.clone()).collect(),
            neighbors: self.config.neighbors.clone(),
        }
    }

    fn carry_out(&mut self, pid: u32, target: &JobTarget, neighbors: &[String], d: Decision) {
        let shadow = self.config.mode != HealMode::On;
        let blast = self.ctx_parts(target);
        let channel = self.io.channel.clone();
        let cgroups = self.cgroups.clone();
        let env = Env {
            cgroups: &cgroups,
            neighbors,
            channel: &channel,
        };
        let (action, outcome) = match d {
            Decision::Apply {
                action,
                strategy,
                level,
                params,
            } => {
                let key = ActionKey {
                    run: self.run.clone(),
                    job: pid,
                    action,
                };
                let mut act = actuators::actuator(strategy);
                let t0 = std::time::Instant::now();
                let mut ctx = Ctx {
                    io: &mut self.io,
                    journal: &mut self.journal,
                    blast: &blast,
                    managers: &self.managers,
                    shadow,
                };
                let outcome = match act.apply(key, level, target, &params, &env, &mut ctx) {
                    Ok(a) if a.shadow => {
                        for c in &a.changes {
                            log::info!(
                                "heal: shadow: would set {} from {} to {}",
                                c.knob,
                                c.prior,
                                c.value
                            );
                        }
                        Outcome::Shadow
                    }
                    Ok(a) => match act.check_applied(&a, ctx.io) {
                        Ok(true) => {
                            log::info!(
                                "heal: {strategy}: {} knobs written and read back in {:?}",
                                a.changes.len(),
                                t0.elapsed()
                            );
                            for n in &a.notes {
                                log::info!("heal: {strategy}: {n}");
                            }
                            if let Some(j) = self.jobs.get_mut(&pid) {
                                j.applied.insert(action, a);
                            }
                            Outcome::Applied
                        }
                        other => {
                            let why = match other {
                                Err(e) => crate::error_chain(&e),
                                _ => "a knob read back a different value than written (a manager \
                                      resets it?)"
                                    .to_owned(),
                            };
                            let _ = act.undo(&a, &mut ctx, "failed read back");
                            Outcome::Failed { reason: why }
                        }
                    },
                    Err(HealError::Skipped { reason, .. }) => Outcome::Skipped { reason },
                    Err(e) => Outcome::Failed {
                        reason: crate::error_chain(&e),
                    },
                };
                (action, outcome)
            }
            Decision::Revert { action, .. } => {
                let applied = self
                    .jobs
                    .get_mut(&pid)
                    .and_then(|j| j.applied.remove(&action));
                let outcome = match applied {
                    None => Outcome::Reverted, // nothing was written (shadow, or never applied)
                    Some(a) => {
                        let mut ctx = Ctx {
                            io: &mut self.io,
                            journal: &mut self.journal,
                            blast: &blast,
                            managers: &self.managers,
                            shadow,
                        };
                        match actuators::actuator(a.strategy).undo(&a, &mut ctx, "healer") {
                            Ok(r) if r.failed.is_empty() => {
                                for l in &r.left {
                                    log::warn!("heal: {l}");
                                }
                                Outcome::Reverted
                            }
                            Ok(r) => Outcome::RevertFailed {
                                reason: r.failed.join("; "),
                            },
                            Err(e) => Outcome::RevertFailed {
                                reason: crate::error_chain(&e),
                            },
                        }
                    }
                };
                (action, outcome)
            }
            Decision::Keep { .. } | Decision::Nothing => return,
        };
        let now = slo_probe_common::host::monotonic_ns();
        let events = match self.jobs.get_mut(&pid) {
            Some(j) => j.healer.outcome(action, outcome, now),
            None => Vec::new(),
        };
        self.audit(events);
    }

    /// Undoes everything a finished job had in force and forgets it.
    fn job_gone(&mut self, pid: u32) {
        let Some(job) = self.jobs.remove(&pid) else {
            return;
        };
        let blast = BlastRadius::default();
        for a in job.applied.values().rev() {
            let mut ctx = Ctx {
                io: &mut self.io,
                journal: &mut self.journal,
                blast: &blast,
                managers: &self.managers,
                shadow: false,
            };
            match actuators::actuator(a.strategy).undo(a, &mut ctx, "job exited") {
                Ok(r) => log::info!(
                    "heal: job {pid} exited: {} undone ({} knobs restored, {} left)",
                    a.strategy,
                    r.restored.len(),
                    r.left.len() + r.failed.len()
                ),
                Err(e) => log::error!("heal: {}", crate::error_chain(&e)),
            }
        }
        self.io.channel.remove(pid);
    }

    /// Actions someone else undid (`slo-probe heal undo`) are forgotten.
    fn pick_up_external_undo(&mut self) {
        for l in self.journal.read_new() {
            if let Record::Reverted { key, by, .. } = l.record {
                if key.run != self.run {
                    continue;
                }
                if let Some(j) = self.jobs.get_mut(&key.job) {
                    if j.applied.remove(&key.action).is_some() {
                        j.healer.forget(key.action);
                        log::warn!(
                            "heal: job {}: action {} was undone by {by}",
                            key.job,
                            key.action
                        );
                    }
                }
            }
        }
    }

    /// What stays in force at a clean stop (left to the next start or `heal undo`).
    pub fn stop(&self) {
        let n: usize = self.jobs.values().map(|j| j.applied.len()).sum();
        if n > 0 {
            log::info!(
                "heal: {n} actions stay in force; the next start or `slo-probe heal undo` restores \
                 them from {}",
                self.journal.path().display()
            );
        }
    }
}

/// Starts the healer thread: it runs one tick per new snapshot on `rx` until `stop` is set or
/// the channel closes (after a tick of the last snapshot sent, so that a job that ended in it
/// gets its actions undone: `slo-probe run` ends its healer that way). `shim` sets the shims'
/// depth for the shim-depth strategy ([`shim_control`]).
pub fn spawn(
    config: &HealConfig,
    mut rx: watch::Receiver<Arc<Snapshot>>,
    stop: Arc<AtomicBool>,
    shim: Box<dyn ShimControl>,
) -> Result<(thread::JoinHandle<()>, Views), HealError> {
    let mut l = HealerLoop::new(config, shim)?;
    let views = l.views();
    log::info!(
        "heal: mode {}; journal {}",
        config.mode.as_str(),
        config.journal.display()
    );
    let h = thread::Builder::new()
        .name("slo-healer".to_owned())
        .spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                match rx.has_changed() {
                    Ok(true) => {
                        let s = rx.borrow_and_update().clone();
                        l.tick(&s);
                    }
                    Ok(false) => thread::sleep(Duration::from_millis(50)),
                    Err(_) => {
                        if rx.borrow().has_changed() {
                            let s = rx.borrow_and_update().clone();
                            l.tick(&s);
                        }
                        break;
                    }
                }
            }
            l.stop();
        })
        .map_err(HealError::Thread)?;
    Ok((h, views))
}
