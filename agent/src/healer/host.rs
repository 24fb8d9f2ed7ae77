//! What the actuators and the reward need from the host that the snapshot does not carry:
//! host CPU utilisation (`/proc/stat` deltas, overall and per CPU), where other processes'
//! runnable threads are (to choose the least contended GPU-local cores), NUMA nodes' CPUs and
//! a thread's current CPU.

use std::collections::{BTreeMap, BTreeSet};

use super::knobs::parse_cpu_list;

/// Host CPU utilisation from consecutive `/proc/stat` reads.
#[derive(Default)]
pub struct CpuSampler {
    last: Option<(Vec<u64>, Vec<u64>)>,
    /// Utilisation of all CPUs together over the last interval, 0..1.
    pub total: Option<f64>,
    /// Per CPU, 0..1, indexed by CPU number.
    pub per_cpu: Vec<f64>,
}

/// (busy, total) jiffies of every `cpuN` line, indexed by N.
fn read_stat() -> Option<(Vec<u64>, Vec<u64>)> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    let mut busy = Vec::new();
    let mut total = Vec::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("cpu") else {
            continue;
        };
        let Some((n, fields)) = rest.split_once(' ') else {
            continue;
        };
        let Ok(n) = n.parse::<usize>() else {
            continue; // the aggregate "cpu" line
        };
        let v: Vec<u64> = fields
            .split_whitespace()
            .filter_map(|f| f.parse().ok())
            .collect();
        if v.len() < 5 {
            continue;
        }
        // user nice system idle iowait irq softirq steal (guest is inside user).
        let all: u64 = v.iter().take(8).sum();
        let idle = v[3] + v[4];
        if busy.len() <= n {
            busy.resize(n + 1, 0);
            total.resize(n + 1, 0);
        }
        busy[n] = all - idle;
        total[n] = all;
    }
    Some((busy, total))
}

impl CpuSampler {
    /// Reads `/proc/stat` and updates the utilisation since the previous call.
    pub fn sample(&mut self) {
        let Some(now) = read_stat() else {
            return;
        };
        if let Some((b0, t0)) = &self.last {
            let mut sb = 0u64;
            let mut st = 0u64;
            self.per_cpu = (0..now.0.len())
                .map(|i| {
                    let db = now.0[i].saturating_sub(b0.get(i).copied().unwrap_or(0));
                    let dt = now.1[i].saturating_sub(t0.get(i).copied().unwrap_or(0));
                    sb += db;
                    st += dt;
                    if dt == 0 {
                        0.0
                    } else {
                        db as f64 / dt as f64
                    }
                })
                .collect();
            self.total = (st > 0).then(|| sb as f64 / st as f64);
        }
        self.last = Some(now);
    }
}

/// CPUs online.
pub fn online_cpus() -> Vec<u32> {
    std::fs::read_to_string("/sys/devices/system/cpu/online")
        .map(|t| parse_cpu_list(&t))
        .unwrap_or_else(|_| {
            let n = std::thread::available_parallelism().map_or(1, |n| n.get());
            (0..n as u32).collect()
        })
}

/// The CPUs of the NUMA node holding `cpu` (`None` without NUMA information).
pub fn numa_cpus_of(cpu: u32) -> Option<Vec<u32>> {
    let dir = std::fs::read_dir("/sys/devices/system/node").ok()?;
    for e in dir.flatten() {
        if !e.file_name().to_string_lossy().starts_with("node") {
            continue;
        }
        let cpus = std::fs::read_to_string(e.path().join("cpulist"))
            .map(|t| parse_cpu_list(&t))
            .unwrap_or_default();
        if cpus.contains(&cpu) {
            return Some(cpus);
        }
    }
    None
}

/// Fields of `/proc/<pid>/task/<tid>/stat` after the name: (state, last CPU).
fn task_state(pid: u32, tid: u32) -> Option<(char, u32)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).ok()?;
    let rest = &text[text.rfind(')')? + 2..];
    let mut f = rest.split_whitespace();
    let state = f.next()?.chars().next()?;
    // processor is field 39; `rest` starts at field 3.
    let cpu = f.nth(35)?.parse().ok()?;
    Some((state, cpu))
}

/// The CPU `tid` last ran on.
pub fn thread_cpu(pid: u32, tid: u32) -> Option<u32> {
    task_state(pid, tid).map(|(_, c)| c)
}

/// The scheduling entity a process's threads compete as at the top of a CPU's run queue: its
/// cpu cgroup (v1 `cpu` controller line, else the v2 line) when not the root, else its
/// autogroup (`/proc/<pid>/autogroup`) where autogroups are on, else the process.
fn entity(pid: u32) -> String {
    let cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    let path = cg
        .lines()
        .find_map(|l| {
            let mut f = l.splitn(3, ':');
            let (_, ctl, path) = (f.next()?, f.next()?, f.next()?);
            ctl.split(',').any(|c| c == "cpu").then(|| path.to_owned())
        })
        .or_else(|| {
            cg.lines()
                .find_map(|l| l.strip_prefix("0::").map(str::to_owned))
        });
    match path {
        Some(p) if p != "/" => format!("cgroup:{p}"),
        _ => std::fs::read_to_string(format!("/proc/{pid}/autogroup"))
            .ok()
            .and_then(|t| t.split_whitespace().next().map(str::to_owned))
            .unwrap_or_else(|| format!("process:{pid}")),
    }
}

/// Competitors of the job on each CPU: the scheduling entities (cgroups, autogroups) of other
/// processes' runnable threads there, by the CPU they last ran on, averaged over `samples`
/// looks `gap` apart. A group of busy threads weighs as one entity under group scheduling, so
/// this (not the thread count) says which CPU gives the job the largest share.
pub fn foreign_runnable(
    job: &BTreeSet<u32>,
    samples: u32,
    gap: std::time::Duration,
) -> BTreeMap<u32, f64> {
    let mut counts: BTreeMap<u32, f64> = BTreeMap::new();
    let mut entities: BTreeMap<u32, String> = BTreeMap::new();
    for i in 0..samples.max(1) {
        if i > 0 {
            std::thread::sleep(gap);
        }
        let Ok(procs) = std::fs::read_dir("/proc") else {
            break;
        };
        let mut seen: BTreeSet<(u32, String)> = BTreeSet::new();
        for p in procs.flatten() {
            let Some(pid) = p.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            if job.contains(&pid) || pid == std::process::id() {
                continue;
            }
            let Ok(tasks) = std::fs::read_dir(p.path().join("task")) else {
                continue;
            };
            for t in tasks.flatten() {
                let Some(tid) = t.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                    continue;
                };
                if let Some(('R', cpu)) = task_state(pid, tid) {
                    let e = entities.entry(pid).or_insert_with(|| entity(pid)).clone();
                    seen.insert((cpu, e));
                }
            }
        }
        for (cpu, _) in seen {
            *counts.entry(cpu).or_default() += 1.0 / f64::from(samples.max(1));
        }
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_thread_state_and_cpu_sampling() {
        let pid = std::process::id();
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() } as u32;
        let (state, cpu) = task_state(pid, tid).expect("own stat");
        assert_eq!(state, 'R');
        assert!(online_cpus().contains(&cpu));
        let mut s = CpuSampler::default();
        s.sample();
        let until = std::time::Instant::now() + std::time::Duration::from_millis(50);
        while std::time::Instant::now() < until {
            std::hint::spin_loop();
        }
        s.sample();
        let total = s.total.expect("utilisation");
        assert!((0.0..=1.0).contains(&total), "{total}");
        assert!(!s.per_cpu.is_empty());
    }
}
