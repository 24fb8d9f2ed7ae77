//! One actuator per strategy of DESIGN.md, behind [`Actuator`]: each plans the knob writes its
//! strategy makes for a job ([`Actuator::plan`], reads only); the trait's provided methods carry
//! a plan out the same way for all of them: every knob checked against the blast radius and the
//! managers that own knobs ([`super::managers`]), its prior value read and journalled (fsync)
//! before it is written, everything read back; a failed write undoes what was written before it.
//! In shadow mode the plan and the prior values are journalled and nothing is written.

use std::collections::BTreeSet;

use serde_json::json;
use slo_probe_core::{
    healer::{guard::BlastRadius, guard::Target, Level, Params, Strategy},
    roles::Role,
};

use super::{
    cgroups::{Controller, Hierarchies},
    channel::Channel,
    error::HealError,
    host,
    journal::{self, ActionKey, Change, Journal, Record, Restored},
    knobs::{format_cpu_list, parse_cpu_list, tcp_sockets, Knob, KnobIo, KnobValue},
    managers::Managers,
};

/// One thread of the job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ThreadTarget {
    /// Its process.
    pub pid: u32,
    /// The thread.
    pub tid: u32,
    /// Its role.
    pub role: Role,
    /// Its name.
    pub name: String,
}

/// One of the job's own cgroups (in the cpu controller's hierarchy).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CgroupTarget {
    /// Path as `/proc/<pid>/cgroup` shows it.
    pub path: String,
    /// 1 or 2.
    pub version: u8,
}

/// What an action may act on for one job.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JobTarget {
    /// The training process.
    pub pid: u32,
    /// Its start time (`/proc/<pid>/stat` field 22).
    pub start: u64,
    /// The job's processes: the training process and its descendants.
    pub pids: BTreeSet<u32>,
    /// Their threads.
    pub threads: Vec<ThreadTarget>,
    /// The job's own cgroups.
    pub cgroups: Vec<CgroupTarget>,
    /// The GPU it uses.
    pub gpu: Option<u32>,
    /// That GPU's CPU affinity from NVML (empty: unknown).
    pub gpu_cpus: Vec<u32>,
}

impl JobTarget {
    fn threads_of<'a>(&'a self, roles: &'a [Role]) -> impl Iterator<Item = &'a ThreadTarget> + 'a {
        self.threads.iter().filter(move |t| roles.contains(&t.role))
    }
}

/// What planning needs beyond the job: the hierarchies, the allowed neighbours that exist, the
/// strategy channel.
pub struct Env<'a> {
    /// cgroup hierarchies.
    pub cgroups: &'a Hierarchies,
    /// Allowed neighbour cgroups that exist now.
    pub neighbors: &'a [String],
    /// The job-side channel.
    pub channel: &'a Channel,
}

/// A plan: knob writes, and what was left out and why.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    /// Knobs and the values to write, in order.
    pub writes: Vec<(Knob, KnobValue)>,
    /// What was left out, and why.
    pub notes: Vec<String>,
}

/// Everything carrying out a plan touches.
pub struct Ctx<'a> {
    /// The knobs.
    pub io: &'a mut dyn KnobIo,
    /// The journal.
    pub journal: &'a mut Journal,
    /// What the job's actions may touch.
    pub blast: &'a BlastRadius,
    /// Owners of knobs.
    pub managers: &'a Managers,
    /// Record, do not write.
    pub shadow: bool,
}

/// An action carried out (or recorded, in shadow mode).
#[derive(Clone, Debug, PartialEq)]
pub struct Applied {
    /// The action.
    pub key: ActionKey,
    /// The job's start time.
    pub job_start: u64,
    /// The strategy.
    pub strategy: Strategy,
    /// Its level.
    pub level: Level,
    /// The knobs written.
    pub changes: Vec<Change>,
    /// What was left out.
    pub notes: Vec<String>,
    /// Nothing was written (shadow mode).
    pub shadow: bool,
}

fn target_of<'k>(k: &'k Knob) -> Target<'k> {
    match k {
        Knob::Affinity { pid, tid, .. }
        | Knob::Sched { pid, tid, .. }
        | Knob::IoPrio { pid, tid, .. } => Target::Thread {
            pid: *pid,
            tid: *tid,
        },
        Knob::SocketPriority { pid, .. }
        | Knob::ShimDepth { pid }
        | Knob::JobStrategy { pid, .. } => Target::Process { pid: *pid },
        Knob::Cgroup { cgroup, .. } => Target::Cgroup { path: cgroup },
    }
}

/// A strategy's actuator.
pub trait Actuator: Send {
    /// Its strategy.
    fn strategy(&self) -> Strategy;

    /// The knob writes for `job` with `params` (reads knobs where the plan depends on them).
    fn plan(&self, job: &JobTarget, params: &Params, env: &Env<'_>, io: &mut dyn KnobIo) -> Plan;

    /// Carries the plan out (see the module docs). `Err(Skipped)` when nothing is left to
    /// write; `Err(ApplyFailed)` when a write failed (what was written is undone).
    fn apply(
        &mut self,
        key: ActionKey,
        level: Level,
        job: &JobTarget,
        params: &Params,
        env: &Env<'_>,
        ctx: &mut Ctx<'_>,
    ) -> Result<Applied, HealError> {
        let strategy = self.strategy();
        let t0 = std::time::Instant::now();
        let plan = self.plan(job, params, env, ctx.io);
        log::debug!("heal: {strategy}: planned in {:?}", t0.elapsed());
        let mut notes = plan.notes;
        let mut changes = Vec::new();
        for (knob, value) in plan.writes {
            if let Err(r) = ctx.blast.check(&target_of(&knob)) {
                notes.push(format!("{knob}: {r}"));
                continue;
            }
            if let Some(owner) = ctx.managers.owner(&knob) {
                notes.push(owner);
                continue;
            }
            match ctx.io.read(&knob) {
                Ok(prior) if prior.same(&value, &knob) => {}
                Ok(prior) => changes.push(Change { knob, prior, value }),
                Err(e) => notes.push(format!("{knob}: {}", crate::error_chain(&e))),
            }
        }
        if changes.is_empty() {
            return Err(HealError::Skipped {
                strategy,
                reason: if notes.is_empty() {
                    "nothing to change: every knob already has the strategy's value".to_owned()
                } else {
                    notes.join("; ")
                },
            });
        }
        if ctx.shadow {
            ctx.journal.append(Record::Shadow {
                key: key.clone(),
                strategy,
                level,
                changes: changes.clone(),
                notes: notes.clone(),
            })?;
            return Ok(Applied {
                key,
                job_start: job.start,
                strategy,
                level,
                changes,
                notes,
                shadow: true,
            });
        }
        // Every prior value on disk before the first write: one synced append for them all.
        let t1 = std::time::Instant::now();
        ctx.journal.append_all(
            changes
                .iter()
                .map(|c| Record::Prior {
                    key: key.clone(),
                    job_start: job.start,
                    strategy,
                    level,
                    change: c.clone(),
                })
                .collect(),
        )?;
        log::debug!(
            "heal: {strategy}: {} prior values journalled in {:?}",
            changes.len(),
            t1.elapsed()
        );
        let mut written: Vec<Change> = Vec::new();
        for c in &changes {
            if let Err(e) = ctx.io.write(&c.knob, &c.value) {
                // Undo what this action wrote, newest first; the knob that failed too, in
                // case the write half-happened.
                written.push(c.clone());
                let r = journal::restore(ctx.io, &written);
                ctx.journal.append(Record::Reverted {
                    key,
                    strategy,
                    by: "failed apply".to_owned(),
                    restored: r.restored.len(),
                    left: r.left.iter().chain(&r.failed).cloned().collect(),
                })?;
                return Err(HealError::ApplyFailed {
                    strategy,
                    reason: crate::error_chain(&e),
                });
            }
            written.push(c.clone());
        }
        ctx.journal.append(Record::Applied {
            key: key.clone(),
            strategy,
            changes: changes.len(),
            notes: notes.clone(),
        })?;
        Ok(Applied {
            key,
            job_start: job.start,
            strategy,
            level,
            changes,
            notes,
            shadow: false,
        })
    }

    /// Whether every knob still holds what the action wrote.
    fn check_applied(&self, applied: &Applied, io: &mut dyn KnobIo) -> Result<bool, HealError> {
        for c in &applied.changes {
            if !io.read(&c.knob)?.same(&c.value, &c.knob) {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Restores what the action changed and journals it (`by`: who asked).
    fn undo(
        &mut self,
        applied: &Applied,
        ctx: &mut Ctx<'_>,
        by: &str,
    ) -> Result<Restored, HealError> {
        if applied.shadow {
            return Ok(Restored::default());
        }
        let r = journal::restore(ctx.io, &applied.changes);
        ctx.journal.append(Record::Reverted {
            key: applied.key.clone(),
            strategy: applied.strategy,
            by: by.to_owned(),
            restored: r.restored.len(),
            left: r.left.iter().chain(&r.failed).cloned().collect(),
        })?;
        Ok(r)
    }
}

/// `fcfs-gpu`: the baseline, nothing to change.
pub struct FcfsGpu;

impl Actuator for FcfsGpu {
    fn strategy(&self) -> Strategy {
        Strategy::FcfsGpu
    }

    fn plan(&self, _: &JobTarget, _: &Params, _: &Env<'_>, _: &mut dyn KnobIo) -> Plan {
        Plan::default()
    }
}

/// Lower the nice of `threads` to `nice` (never raise it) and set the slice hint.
fn priority_writes(
    job: &JobTarget,
    threads: &[&ThreadTarget],
    nice: i32,
    slice_ns: Option<u64>,
    io: &mut dyn KnobIo,
    plan: &mut Plan,
) {
    for t in threads {
        let knob = Knob::Sched {
            pid: t.pid,
            tid: t.tid,
            start: start_of(job, t.pid),
        };
        match io.read(&knob) {
            Ok(KnobValue::Sched {
                policy,
                nice: now,
                slice_ns: slice_now,
            }) => {
                if ![0, 3, 5].contains(&policy) {
                    plan.notes.push(format!(
                        "{knob}: policy {policy} is not a fair policy: left as is"
                    ));
                    continue;
                }
                plan.writes.push((
                    knob,
                    KnobValue::Sched {
                        policy,
                        nice: now.min(nice),
                        slice_ns: slice_ns.unwrap_or(slice_now),
                    },
                ));
            }
            Ok(_) => {}
            Err(e) => plan
                .notes
                .push(format!("{knob}: {}", crate::error_chain(&e))),
        }
    }
}

fn start_of(job: &JobTarget, pid: u32) -> u64 {
    if pid == job.pid {
        job.start
    } else {
        super::knobs::start_time(pid).unwrap_or(0)
    }
}

fn job_entry(
    job: &JobTarget,
    strategy: Strategy,
    value: serde_json::Value,
    env: &Env<'_>,
    plan: &mut Plan,
) {
    match env.channel.missing(job.pid, strategy) {
        Some(why) => plan.notes.push(format!("job-side part skipped: {why}")),
        None => plan.writes.push((
            Knob::JobStrategy {
                pid: job.pid,
                strategy,
            },
            KnobValue::Job(Some(value)),
        )),
    }
}

/// `deadline-aware`: main and communication threads get a lower nice and a shorter slice.
pub struct DeadlineAware;

impl Actuator for DeadlineAware {
    fn strategy(&self) -> Strategy {
        Strategy::DeadlineAware
    }

    fn plan(&self, job: &JobTarget, params: &Params, _: &Env<'_>, io: &mut dyn KnobIo) -> Plan {
        let mut plan = Plan::default();
        let Params::Priority { nice, slice_us } = params else {
            return plan;
        };
        let threads: Vec<&ThreadTarget> =
            job.threads_of(&[Role::Main, Role::Communication]).collect();
        let slice = (*slice_us > 0).then(|| slice_us.clamp(&100, &100_000) * 1000);
        priority_writes(job, &threads, *nice, slice, io, &mut plan);
        if threads.is_empty() {
            plan.notes
                .push("the job has no main or communication thread".to_owned());
        }
        plan
    }
}

/// `numa-pinning`: main (and communication) threads on the least contended GPU-local cores,
/// the job's other threads on the rest.
pub struct NumaPinning;

/// The CPUs a cpuset cgroup folder lets its tasks use: v2's `cpuset.cpus.effective`, v1's
/// `cpuset.effective_cpus`, else `cpuset.cpus`; an empty list means none was set there (v2: the
/// parent's apply), so it is no answer. (An empty v2 `cpuset.cpus` read as "no CPU" made
/// numa-pinning see 0 usable CPUs on the H200 machine.)
fn cpuset_cpus(dir: &std::path::Path) -> Option<BTreeSet<u32>> {
    [
        "cpuset.cpus.effective",
        "cpuset.effective_cpus",
        "cpuset.cpus",
    ]
    .iter()
    .filter_map(|f| std::fs::read_to_string(dir.join(f)).ok())
    .map(|t| parse_cpu_list(&t).into_iter().collect::<BTreeSet<u32>>())
    .find(|c| !c.is_empty())
}

impl NumaPinning {
    /// The local CPUs of the job: its GPU's (NVML), else the NUMA node of its main thread's
    /// CPU, else all online CPUs; within what the job may use (its main thread's cpuset).
    pub(crate) fn local_cpus(job: &JobTarget, h: &Hierarchies) -> Vec<u32> {
        let online = host::online_cpus();
        let allowed: BTreeSet<u32> = std::fs::read_to_string(format!("/proc/{}/status", job.pid))
            .ok()
            .and_then(|t| {
                t.lines()
                    .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                    .map(parse_cpu_list)
            })
            .unwrap_or_else(|| online.clone())
            .into_iter()
            .collect();
        // The cpuset bounds affinity; the main thread's own mask may be narrower (that is what
        // we may be about to change), so take the cgroup's.
        let cpuset: BTreeSet<u32> = std::fs::read_to_string(format!("/proc/{}/cpuset", job.pid))
            .ok()
            .and_then(|rel| {
                let (dir, _) = h.dir(rel.trim(), Controller::Cpuset)?;
                cpuset_cpus(&dir)
            })
            .unwrap_or_else(|| {
                online
                    .iter()
                    .copied()
                    .chain(allowed.iter().copied())
                    .collect()
            });
        let main_cpu = job
            .threads_of(&[Role::Main])
            .next()
            .and_then(|t| host::thread_cpu(t.pid, t.tid));
        let local = if !job.gpu_cpus.is_empty() {
            job.gpu_cpus.clone()
        } else {
            main_cpu
                .and_then(host::numa_cpus_of)
                .unwrap_or_else(|| online.clone())
        };
        local.into_iter().filter(|c| cpuset.contains(c)).collect()
    }

    /// Why `n` local CPUs are too few to separate main from contention. With two, main alone on
    /// one leaves every other thread of the job (loaders, workers) on the contended one: the
    /// slowdown moves instead of going (CI's 2-core VM, 2026-12-01: kept at +8% and +15% over
    /// the baseline with busy neighbours, where isolating the neighbours heals it).
    pub(crate) fn too_few(n: usize) -> Option<String> {
        (n < 3).then(|| {
            format!(
                "only {n} GPU-local CPU{} the job may use: pinning main alone would put the rest \
                 of the job on the contended CPU",
                if n == 1 { "" } else { "s" }
            )
        })
    }
}

impl Actuator for NumaPinning {
    fn strategy(&self) -> Strategy {
        Strategy::NumaPinning
    }

    fn plan(&self, job: &JobTarget, params: &Params, env: &Env<'_>, io: &mut dyn KnobIo) -> Plan {
        let mut plan = Plan::default();
        let Params::Pinning { exclusive_main } = params else {
            return plan;
        };
        let mut cpus = Self::local_cpus(job, env.cgroups);
        if let Some(why) = Self::too_few(cpus.len()) {
            plan.notes.push(why);
            return plan;
        }
        // The CPU that gives main the largest share first (against other processes' runnable
        // threads, group scheduling weighed), then the least utilised.
        let Some(main_thread) = job.threads_of(&[Role::Main]).next() else {
            plan.notes.push("the job has no main thread".to_owned());
            return plan;
        };
        let shares = host::cpu_shares(
            &job.pids,
            (main_thread.pid, main_thread.tid),
            3,
            std::time::Duration::from_millis(20),
        );
        let mut sampler = host::CpuSampler::default();
        sampler.sample();
        std::thread::sleep(std::time::Duration::from_millis(50));
        sampler.sample();
        let load = |c: &u32| {
            (
                1000 - (shares.get(c).copied().unwrap_or(1.0) * 1000.0).round() as u64,
                (sampler.per_cpu.get(*c as usize).copied().unwrap_or(0.0) * 100.0) as u64,
                *c,
            )
        };
        cpus.sort_by_key(load);
        let n = cpus.len();
        // Main alone on the least contended CPU (strong) or with communication on the least
        // contended quarter (mild); communication on the next CPU when there are 4 or more (with
        // fewer, sharing main's costs less than a contended CPU: a step hands over between them).
        let k = if *exclusive_main { 1 } else { (n / 4).max(1) };
        let main: Vec<u32> = cpus[..k].to_vec();
        let (comm, rest): (Vec<u32>, Vec<u32>) = if *exclusive_main && n >= 4 {
            (vec![cpus[1]], cpus[2..].to_vec())
        } else {
            (main.clone(), cpus[k..].to_vec())
        };
        let sorted = |mut v: Vec<u32>| {
            v.sort_unstable();
            v
        };
        let (main, comm, rest) = (sorted(main), sorted(comm), sorted(rest));
        let placed = format!(
            "main on {}, communication on {}, the rest on {} (main's share of each CPU: {})",
            format_cpu_list(&main),
            format_cpu_list(&comm),
            format_cpu_list(&rest),
            cpus.iter()
                .map(|c| format!("{c}: {:.2}", shares.get(c).copied().unwrap_or(1.0)))
                .collect::<Vec<_>>()
                .join(", ")
        );
        // Moving the others around main helps nothing if main stays where it is.
        let main_now: Vec<KnobValue> = job
            .threads_of(&[Role::Main])
            .filter_map(|t| {
                io.read(&Knob::Affinity {
                    pid: t.pid,
                    tid: t.tid,
                    start: start_of(job, t.pid),
                })
                .ok()
            })
            .collect();
        if !main_now.is_empty() && main_now.iter().all(|v| *v == KnobValue::Cpus(main.clone())) {
            plan.notes.push(format!(
                "the main thread is already on the least contended GPU-local CPU ({placed})"
            ));
            return plan;
        }
        for t in &job.threads {
            let set = match t.role {
                Role::Main => &main,
                Role::Communication => &comm,
                _ => &rest,
            };
            plan.writes.push((
                Knob::Affinity {
                    pid: t.pid,
                    tid: t.tid,
                    start: start_of(job, t.pid),
                },
                KnobValue::Cpus(set.clone()),
            ));
        }
        plan.notes.push(placed);
        plan
    }
}

/// `io-boost`: loader workers get I/O priority and CPU weight; more prefetch via the client.
pub struct IoBoost;

impl Actuator for IoBoost {
    fn strategy(&self) -> Strategy {
        Strategy::IoBoost
    }

    fn plan(&self, job: &JobTarget, params: &Params, env: &Env<'_>, io: &mut dyn KnobIo) -> Plan {
        let mut plan = Plan::default();
        let Params::Io {
            ioprio_level,
            loader_nice,
            prefetch_factor,
        } = params
        else {
            return plan;
        };
        let loaders: Vec<&ThreadTarget> = job
            .threads_of(&[Role::DataLoader, Role::PinMemory])
            .collect();
        // Best-effort class (2) at the given level.
        let prio = (2i64 << 13) | i64::from((*ioprio_level).min(7));
        for t in &loaders {
            plan.writes.push((
                Knob::IoPrio {
                    pid: t.pid,
                    tid: t.tid,
                    start: start_of(job, t.pid),
                },
                KnobValue::Int(prio),
            ));
        }
        priority_writes(job, &loaders, *loader_nice, None, io, &mut plan);
        if loaders.is_empty() {
            plan.notes
                .push("the job has no data-loader or pin-memory thread".to_owned());
        }
        if *prefetch_factor > 0 {
            job_entry(
                job,
                Strategy::IoBoost,
                json!({ "prefetch_factor": prefetch_factor }),
                env,
                &mut plan,
            );
        }
        plan
    }
}

/// `neighbor-isolation`: the seed's §3.3 dual quota (see [`Params::Quota`]).
pub struct NeighborIsolation;

fn cg_knob(cgroup: &str, c: Controller, file: &str, h: &Hierarchies) -> Option<(Knob, u8)> {
    let (dir, version) = h.dir(cgroup, c)?;
    Some((
        Knob::Cgroup {
            cgroup: cgroup.to_owned(),
            file: file.to_owned(),
            path: dir.join(file),
        },
        version,
    ))
}

fn read_text(io: &mut dyn KnobIo, k: &Knob) -> Option<String> {
    match io.read(k) {
        Ok(KnobValue::Text(t)) => Some(t),
        _ => None,
    }
}

impl Actuator for NeighborIsolation {
    fn strategy(&self) -> Strategy {
        Strategy::NeighborIsolation
    }

    fn plan(&self, job: &JobTarget, params: &Params, env: &Env<'_>, io: &mut dyn KnobIo) -> Plan {
        let mut plan = Plan::default();
        let Params::Quota {
            neighbor_share_percent,
            neighbor_quota_percent,
            neighbor_idle,
            job_burst_percent,
        } = params
        else {
            return plan;
        };
        let h = env.cgroups;
        let ncpu = host::online_cpus().len().max(1) as u64;
        for n in env.neighbors {
            let Some((weight, version)) = cg_knob(n, Controller::Cpu, "cpu.shares", h)
                .filter(|(_, v)| *v == 1)
                .or_else(|| cg_knob(n, Controller::Cpu, "cpu.weight", h))
            else {
                plan.notes
                    .push(format!("neighbour {n}: no cpu controller there"));
                continue;
            };
            let scale = |v: u64, min: u64| (v * u64::from(*neighbor_share_percent) / 100).max(min);
            if version == 2 && *neighbor_idle {
                if let Some((k, _)) = cg_knob(n, Controller::Cpu, "cpu.idle", h) {
                    plan.writes.push((k, KnobValue::Text("1".into())));
                }
            } else if let Some(w) = read_text(io, &weight).and_then(|t| t.parse::<u64>().ok()) {
                let min = if version == 1 { 2 } else { 1 };
                plan.writes
                    .push((weight, KnobValue::Text(scale(w, min).to_string())));
            }
            if *neighbor_quota_percent > 0 {
                if version == 1 {
                    let period = cg_knob(n, Controller::Cpu, "cpu.cfs_period_us", h)
                        .and_then(|(k, _)| read_text(io, &k))
                        .and_then(|t| t.parse::<u64>().ok())
                        .unwrap_or(100_000);
                    let quota = period * u64::from(*neighbor_quota_percent) / 100;
                    if let Some((k, _)) = cg_knob(n, Controller::Cpu, "cpu.cfs_quota_us", h) {
                        let now = read_text(io, &k)
                            .and_then(|t| t.parse::<i64>().ok())
                            .unwrap_or(-1);
                        if now < 0 || now as u64 > quota {
                            plan.writes.push((k, KnobValue::Text(quota.to_string())));
                        }
                    }
                } else if let Some((k, _)) = cg_knob(n, Controller::Cpu, "cpu.max", h) {
                    let now = read_text(io, &k).unwrap_or_default();
                    let mut f = now.split_whitespace();
                    let cur = f.next().unwrap_or("max");
                    let period = f
                        .next()
                        .and_then(|p| p.parse::<u64>().ok())
                        .unwrap_or(100_000);
                    let quota = period * u64::from(*neighbor_quota_percent) / 100;
                    if cur == "max" || cur.parse::<u64>().is_ok_and(|q| q > quota) {
                        plan.writes
                            .push((k, KnobValue::Text(format!("{quota} {period}"))));
                    }
                }
            }
            // Strong: keep neighbours off the CPUs the job's main and communication threads run
            // on (Koordinator's CPU suppress), where that leaves them a CPU.
            if *neighbor_idle {
                let busy: BTreeSet<u32> = job
                    .threads_of(&[Role::Main, Role::Communication])
                    .filter_map(|t| host::thread_cpu(t.pid, t.tid))
                    .collect();
                if let Some((k, _)) = cg_knob(n, Controller::Cpuset, "cpuset.cpus", h) {
                    if let Some(now) = read_text(io, &k) {
                        let left: Vec<u32> = parse_cpu_list(&now)
                            .into_iter()
                            .filter(|c| !busy.contains(c))
                            .collect();
                        if !left.is_empty() {
                            plan.writes
                                .push((k, KnobValue::Text(format_cpu_list(&left))));
                        } else {
                            plan.notes.push(format!(
                                "neighbour {n}: its cpuset has only the job's CPUs: left as is"
                            ));
                        }
                    }
                }
            }
        }
        if env.neighbors.is_empty() {
            plan.notes
                .push("no neighbour cgroup is allowed or present (heal.neighbors)".to_owned());
        }
        // The elastic burst of the job's own quota. A quota grown to every CPU of the host
        // limits nothing but still throttles now and then (runtime is handed to each CPU in
        // slices, and a period can end with the pool empty): no quota then (CI's 2-core VM,
        // 2026-12-01: a job with its quota at 2 CPUs ran 7-12% slower than without one).
        if *job_burst_percent > 0 {
            for cg in &job.cgroups {
                let grow = |q: u64, period: u64| {
                    let g = q * (100 + u64::from(*job_burst_percent)) / 100;
                    (g < period * ncpu).then_some(g)
                };
                if cg.version == 1 {
                    let Some((k, _)) = cg_knob(&cg.path, Controller::Cpu, "cpu.cfs_quota_us", h)
                    else {
                        continue;
                    };
                    let period = cg_knob(&cg.path, Controller::Cpu, "cpu.cfs_period_us", h)
                        .and_then(|(k, _)| read_text(io, &k))
                        .and_then(|t| t.parse::<u64>().ok())
                        .unwrap_or(100_000);
                    if let Some(q) = read_text(io, &k)
                        .and_then(|t| t.parse::<i64>().ok())
                        .filter(|q| *q > 0)
                    {
                        let to = grow(q as u64, period).map_or("-1".to_owned(), |g| g.to_string());
                        plan.writes.push((k, KnobValue::Text(to)));
                    }
                } else if let Some((k, _)) = cg_knob(&cg.path, Controller::Cpu, "cpu.max", h) {
                    let now = read_text(io, &k).unwrap_or_default();
                    let mut f = now.split_whitespace();
                    if let (Some(Ok(q)), Some(Ok(p))) = (
                        f.next().map(str::parse::<u64>),
                        f.next().map(str::parse::<u64>),
                    ) {
                        let to = grow(q, p).map_or("max".to_owned(), |g| g.to_string());
                        plan.writes.push((k, KnobValue::Text(format!("{to} {p}"))));
                    }
                }
            }
        }
        plan
    }
}

/// `comm-relief`: communication threads and the job's TCP sockets get priority; the client
/// syncs gradients less often.
pub struct CommRelief;

impl Actuator for CommRelief {
    fn strategy(&self) -> Strategy {
        Strategy::CommRelief
    }

    fn plan(&self, job: &JobTarget, params: &Params, env: &Env<'_>, io: &mut dyn KnobIo) -> Plan {
        let mut plan = Plan::default();
        let Params::Comm {
            nice,
            socket_priority,
            sync_every,
        } = params
        else {
            return plan;
        };
        let comm: Vec<&ThreadTarget> = job.threads_of(&[Role::Communication]).collect();
        priority_writes(job, &comm, *nice, None, io, &mut plan);
        for &pid in &job.pids {
            let start = start_of(job, pid);
            for (fd, inode) in tcp_sockets(pid) {
                plan.writes.push((
                    Knob::SocketPriority {
                        pid,
                        start,
                        fd,
                        inode,
                    },
                    KnobValue::Int(i64::from((*socket_priority).clamp(0, 6))),
                ));
            }
        }
        if *sync_every > 1 {
            job_entry(
                job,
                Strategy::CommRelief,
                json!({ "sync_every": sync_every }),
                env,
                &mut plan,
            );
        }
        plan
    }
}

/// `memory-first`: neighbours' memory limits; compaction and accumulation via the client.
pub struct MemoryFirst;

impl Actuator for MemoryFirst {
    fn strategy(&self) -> Strategy {
        Strategy::MemoryFirst
    }

    fn plan(&self, job: &JobTarget, params: &Params, env: &Env<'_>, io: &mut dyn KnobIo) -> Plan {
        let mut plan = Plan::default();
        let Params::Memory {
            neighbor_high_percent,
            fragmentation_threshold,
            accumulation,
        } = params
        else {
            return plan;
        };
        const PAGE: u64 = 4096;
        for n in env.neighbors {
            let Some((dir, version)) = env.cgroups.dir(n, Controller::Memory) else {
                plan.notes
                    .push(format!("neighbour {n}: no memory controller there"));
                continue;
            };
            let (usage_file, limit_file) = if version == 2 {
                ("memory.current", "memory.high")
            } else {
                ("memory.usage_in_bytes", "memory.soft_limit_in_bytes")
            };
            let usage = std::fs::read_to_string(dir.join(usage_file))
                .ok()
                .and_then(|t| t.trim().parse::<u64>().ok());
            let Some(usage) = usage.filter(|u| *u > 0) else {
                continue;
            };
            let limit = (usage * u64::from(*neighbor_high_percent) / 100) / PAGE * PAGE;
            plan.writes.push((
                Knob::Cgroup {
                    cgroup: n.clone(),
                    file: limit_file.to_owned(),
                    path: dir.join(limit_file),
                },
                KnobValue::Text(limit.max(PAGE).to_string()),
            ));
        }
        job_entry(
            job,
            Strategy::MemoryFirst,
            json!({ "fragmentation_threshold": fragmentation_threshold, "accumulation": accumulation }),
            env,
            &mut plan,
        );
        let _ = io;
        plan
    }
}

/// `graph-replay`: CUDA-graph replay on or off through the client; graph-node tracing in the
/// shim while it is in force, to see the effect per node.
pub struct GraphReplay;

impl Actuator for GraphReplay {
    fn strategy(&self) -> Strategy {
        Strategy::GraphReplay
    }

    fn plan(&self, job: &JobTarget, params: &Params, env: &Env<'_>, io: &mut dyn KnobIo) -> Plan {
        let mut plan = Plan::default();
        let Params::Graph { replay } = params else {
            return plan;
        };
        job_entry(
            job,
            Strategy::GraphReplay,
            json!({ "replay": replay }),
            env,
            &mut plan,
        );
        let depth = Knob::ShimDepth { pid: job.pid };
        match io.read(&depth) {
            Ok(_) => plan.writes.push((depth, KnobValue::Int(2))),
            Err(e) => plan.notes.push(format!(
                "graph-node tracing not raised: {}",
                crate::error_chain(&e)
            )),
        }
        plan
    }
}

/// The actuator of `strategy`.
pub fn actuator(strategy: Strategy) -> Box<dyn Actuator> {
    match strategy {
        Strategy::FcfsGpu => Box::new(FcfsGpu),
        Strategy::DeadlineAware => Box::new(DeadlineAware),
        Strategy::NumaPinning => Box::new(NumaPinning),
        Strategy::IoBoost => Box::new(IoBoost),
        Strategy::NeighborIsolation => Box::new(NeighborIsolation),
        Strategy::CommRelief => Box::new(CommRelief),
        Strategy::MemoryFirst => Box::new(MemoryFirst),
        Strategy::GraphReplay => Box::new(GraphReplay),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_cpuset_folder_with_nothing_set_is_no_answer() {
        let dir = std::env::temp_dir().join(format!("slo-probe-cpuset-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        // v2 child cgroup: cpuset.cpus empty (inherit), no effective file readable here.
        std::fs::write(dir.join("cpuset.cpus"), "\n").expect("write");
        assert_eq!(super::cpuset_cpus(&dir), None);
        std::fs::write(dir.join("cpuset.cpus.effective"), "2-3,8\n").expect("write");
        assert_eq!(
            super::cpuset_cpus(&dir),
            Some([2u32, 3, 8].into_iter().collect())
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    use super::*;
    use crate::healer::journal::tests::{cg, FakeKnobs};

    struct Fixed(Vec<(Knob, KnobValue)>);

    impl Actuator for Fixed {
        fn strategy(&self) -> Strategy {
            Strategy::NeighborIsolation
        }

        fn plan(&self, _: &JobTarget, _: &Params, _: &Env<'_>, _: &mut dyn KnobIo) -> Plan {
            Plan {
                writes: self.0.clone(),
                notes: vec![],
            }
        }
    }

    fn setup() -> (FakeKnobs, Journal, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!(
            "slo-probe-act-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        let j = Journal::open(&dir.join("heal.jsonl")).expect("journal");
        let mut io = FakeKnobs::default();
        for f in ["cpu.shares", "cpu.cfs_quota_us"] {
            io.values
                .insert(cg(f).to_string(), KnobValue::Text("1024".into()));
        }
        (io, j, dir)
    }

    fn blast() -> BlastRadius {
        BlastRadius {
            pids: [7].into(),
            cgroups: Default::default(),
            neighbors: vec!["/n".into()],
        }
    }

    fn key() -> ActionKey {
        ActionKey {
            run: "r".into(),
            job: 7,
            action: 1,
        }
    }

    #[test]
    fn apply_journals_priors_first_reads_back_and_undoes() {
        let (mut io, mut j, dir) = setup();
        let h = Hierarchies::default();
        let ch = Channel::new(dir.join("jobs"));
        let env = Env {
            cgroups: &h,
            neighbors: &[],
            channel: &ch,
        };
        let mut a = Fixed(vec![
            (cg("cpu.shares"), KnobValue::Text("102".into())),
            (cg("cpu.cfs_quota_us"), KnobValue::Text("1024".into())), // already so: no write
            (
                Knob::Cgroup {
                    cgroup: "/other".into(),
                    file: "cpu.shares".into(),
                    path: "/x".into(),
                },
                KnobValue::Text("2".into()),
            ),
        ]);
        let m = Managers::default();
        let b = blast();
        let mut ctx = Ctx {
            io: &mut io,
            journal: &mut j,
            blast: &b,
            managers: &m,
            shadow: false,
        };
        let applied = a
            .apply(
                key(),
                Level::Mild,
                &JobTarget::default(),
                &Params::None,
                &env,
                &mut ctx,
            )
            .expect("applied");
        assert_eq!(applied.changes.len(), 1);
        assert!(
            applied
                .notes
                .iter()
                .any(|n| n.contains("outside the blast radius")),
            "{:?}",
            applied.notes
        );
        assert!(a.check_applied(&applied, ctx.io).expect("read back"));
        let lines = journal::read(&dir.join("heal.jsonl")).expect("read").0;
        assert!(matches!(lines[0].record, Record::Prior { .. }));
        assert!(matches!(lines[1].record, Record::Applied { .. }));
        assert_eq!(journal::outstanding(&lines).len(), 1);
        let r = a.undo(&applied, &mut ctx, "healer").expect("undo");
        assert_eq!(r.restored.len(), 1);
        assert_eq!(
            io.values[&cg("cpu.shares").to_string()],
            KnobValue::Text("1024".into())
        );
        let lines = journal::read(&dir.join("heal.jsonl")).expect("read").0;
        assert!(journal::outstanding(&lines).is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn shadow_writes_nothing_and_a_failed_write_is_undone() {
        let (mut io, mut j, dir) = setup();
        let h = Hierarchies::default();
        let ch = Channel::new(dir.join("jobs"));
        let env = Env {
            cgroups: &h,
            neighbors: &[],
            channel: &ch,
        };
        let writes = vec![
            (cg("cpu.shares"), KnobValue::Text("102".into())),
            (cg("cpu.cfs_quota_us"), KnobValue::Text("5000".into())),
        ];
        let mut a = Fixed(writes);
        let m = Managers::default();
        let b = blast();
        {
            let mut ctx = Ctx {
                io: &mut io,
                journal: &mut j,
                blast: &b,
                managers: &m,
                shadow: true,
            };
            let applied = a
                .apply(
                    key(),
                    Level::Mild,
                    &JobTarget::default(),
                    &Params::None,
                    &env,
                    &mut ctx,
                )
                .expect("shadow");
            assert!(applied.shadow && applied.changes.len() == 2);
        }
        assert_eq!(io.writes, 0);
        io.fail_on = Some(cg("cpu.cfs_quota_us").to_string());
        let mut ctx = Ctx {
            io: &mut io,
            journal: &mut j,
            blast: &b,
            managers: &m,
            shadow: false,
        };
        let e = a
            .apply(
                key(),
                Level::Mild,
                &JobTarget::default(),
                &Params::None,
                &env,
                &mut ctx,
            )
            .unwrap_err();
        assert!(matches!(e, HealError::ApplyFailed { .. }), "{e}");
        // The first write was undone.
        assert_eq!(
            io.values[&cg("cpu.shares").to_string()],
            KnobValue::Text("1024".into())
        );
        let lines = journal::read(&dir.join("heal.jsonl")).expect("read").0;
        assert!(journal::outstanding(&lines).is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_plan_with_nothing_left_is_skipped_with_the_reasons() {
        let (mut io, mut j, dir) = setup();
        let h = Hierarchies::default();
        let ch = Channel::new(dir.join("jobs"));
        let env = Env {
            cgroups: &h,
            neighbors: &[],
            channel: &ch,
        };
        let m = Managers::default();
        let b = blast();
        let mut ctx = Ctx {
            io: &mut io,
            journal: &mut j,
            blast: &b,
            managers: &m,
            shadow: false,
        };
        let job = JobTarget {
            pid: 7,
            ..Default::default()
        };
        let e = GraphReplay
            .apply(
                key(),
                Level::Mild,
                &job,
                &Params::of(Strategy::GraphReplay, Level::Mild),
                &env,
                &mut ctx,
            )
            .unwrap_err();
        let text = e.to_string();
        assert!(text.contains("no python client"), "{text}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
