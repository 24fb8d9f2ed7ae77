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

/// CFS weight of a nice value (the kernel's `sched_prio_to_weight`).
fn nice_weight(nice: i32) -> f64 {
    const W: [f64; 40] = [
        88761.0, 71755.0, 56483.0, 46273.0, 36291.0, 29154.0, 23254.0, 18705.0, 14949.0, 11916.0,
        9548.0, 7620.0, 6100.0, 4904.0, 3906.0, 3121.0, 2501.0, 1991.0, 1586.0, 1277.0, 1024.0,
        820.0, 655.0, 526.0, 423.0, 335.0, 272.0, 215.0, 172.0, 137.0, 110.0, 87.0, 70.0, 56.0,
        45.0, 36.0, 29.0, 23.0, 18.0, 15.0,
    ];
    W[(nice.clamp(-20, 19) + 20) as usize]
}

/// A thread's place in the CFS hierarchy, from the root down: its cpu cgroup's components
/// (each with its weight: v1 `cpu.shares`, v2 `cpu.weight` × 10.24), or its autogroup where it
/// is in the root cgroup and autogroups are on (weighted by the autogroup's nice), then the
/// thread itself (weighted by its nice).
fn sched_path(pid: u32, tid: u32, h: &super::cgroups::Hierarchies) -> Vec<(String, f64)> {
    let mut out = Vec::new();
    let cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    let v1 = cg.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let (_, ctl, path) = (f.next()?, f.next()?, f.next()?);
        ctl.split(',').any(|c| c == "cpu").then(|| path.to_owned())
    });
    let path = v1
        .or_else(|| {
            cg.lines()
                .find_map(|l| l.strip_prefix("0::").map(str::to_owned))
        })
        .unwrap_or_else(|| "/".to_owned());
    let mut prefix = String::new();
    for c in path.split('/').filter(|c| !c.is_empty()) {
        prefix.push('/');
        prefix.push_str(c);
        let weight = h
            .dir(&prefix, super::cgroups::Controller::Cpu)
            .and_then(|(d, v)| {
                let (file, scale) = if v == 1 {
                    ("cpu.shares", 1.0)
                } else {
                    ("cpu.weight", 10.24)
                };
                let w: f64 = std::fs::read_to_string(d.join(file))
                    .ok()?
                    .trim()
                    .parse()
                    .ok()?;
                Some(w * scale)
            })
            .unwrap_or(1024.0);
        out.push((prefix.clone(), weight));
    }
    if out.is_empty() {
        if let Ok(t) = std::fs::read_to_string(format!("/proc/{pid}/autogroup")) {
            let mut f = t.split_whitespace();
            let name = f.next().unwrap_or("autogroup").to_owned();
            let nice = f.nth(1).and_then(|n| n.parse().ok()).unwrap_or(0);
            out.push((name, nice_weight(nice)));
        }
    }
    let nice = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat"))
        .ok()
        .and_then(|t| {
            let rest = t[t.rfind(')')? + 2..].to_owned();
            rest.split_whitespace().nth(16)?.parse::<i32>().ok()
        })
        .unwrap_or(0);
    out.push((format!("task:{tid}"), nice_weight(nice)));
    out
}

/// The share of each CPU the thread `main` (of process `pid`) would get there against the
/// runnable threads of processes outside `job` that last ran there, averaged over `samples`
/// looks `gap` apart. Under group scheduling a competitor weighs where its path in the CFS
/// hierarchy parts from main's: a cgroup of busy threads competes with the cgroup's weight,
/// however many threads it has; the share is the product over the levels of main's weight over
/// main's and its competitors' there.
pub fn cpu_shares(
    job: &BTreeSet<u32>,
    main: (u32, u32),
    samples: u32,
    gap: std::time::Duration,
) -> BTreeMap<u32, f64> {
    let h = super::cgroups::Hierarchies::detect();
    let mine = sched_path(main.0, main.1, &h);
    let mut total: BTreeMap<u32, f64> = BTreeMap::new();
    let n = samples.max(1);
    for i in 0..n {
        if i > 0 {
            std::thread::sleep(gap);
        }
        let Ok(procs) = std::fs::read_dir("/proc") else {
            break;
        };
        // (cpu, level) → competing entities and their weights.
        let mut levels: BTreeMap<(u32, usize), BTreeMap<String, f64>> = BTreeMap::new();
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
                let Some(('R', cpu)) = task_state(pid, tid) else {
                    continue;
                };
                let theirs = sched_path(pid, tid, &h);
                let level = (0..mine.len().min(theirs.len()))
                    .find(|&l| mine[l].0 != theirs[l].0)
                    .unwrap_or(mine.len().min(theirs.len()).saturating_sub(1));
                if let Some((name, w)) = theirs.get(level) {
                    levels
                        .entry((cpu, level))
                        .or_default()
                        .insert(name.clone(), *w);
                }
            }
        }
        for cpu in online_cpus() {
            let share: f64 = mine
                .iter()
                .enumerate()
                .map(|(l, (_, w))| {
                    let others: f64 = levels.get(&(cpu, l)).map_or(0.0, |m| m.values().sum());
                    w / (w + others)
                })
                .product();
            *total.entry(cpu).or_default() += share / f64::from(n);
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nice_weights_are_the_kernels() {
        assert_eq!(nice_weight(0), 1024.0);
        assert_eq!(nice_weight(-20), 88761.0);
        assert_eq!(nice_weight(19), 15.0);
        assert_eq!(nice_weight(-10), 9548.0);
    }

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
#[cfg(test)]
mod timing {
    #[test]
    #[ignore = "timing probe"]
    fn cpu_shares_timing() {
        let t = std::time::Instant::now();
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() } as u32;
        let s = super::cpu_shares(
            &Default::default(),
            (std::process::id(), tid),
            5,
            std::time::Duration::from_millis(20),
        );
        eprintln!("{s:?} in {:?}", t.elapsed());
    }
}
