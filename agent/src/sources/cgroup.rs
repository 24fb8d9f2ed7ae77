//! cgroup CPU throttling and pressure of the job's cgroups, v1 and v2, plus system-wide PSI.
//! File reads only; parsing is in `slo_probe_core::cgroup`.
//!
//! v1: the `cpu` controller's mount (these machines: `/sys/fs/cgroup/cpu`), files `cpu.stat`,
//! `cpu.cfs_quota_us`, `cpu.cfs_period_us`. v2: the unified mount, files `cpu.stat`, `cpu.max`,
//! `cpu.pressure`. PSI needs `CONFIG_PSI` (and `psi=1` where it is off by default).

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

use slo_probe_core::{
    cgroup::{cpu_limit_v1, parse_cpu_max, parse_cpu_stat, parse_pressure, CgroupRow, PressureRow},
    roles::Role,
};

use crate::sources::procfs::CgroupLine;

/// Where the cgroup hierarchies are mounted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CgroupMounts {
    /// The v1 hierarchy with the `cpu` controller.
    pub v1_cpu: Option<PathBuf>,
    /// The v2 (unified) hierarchy.
    pub v2: Option<PathBuf>,
}

impl CgroupMounts {
    /// Finds the mounts in `/proc/self/mountinfo`.
    pub fn detect() -> Self {
        std::fs::read_to_string("/proc/self/mountinfo")
            .map(|t| Self::parse(&t))
            .unwrap_or_default()
    }

    /// Parses mountinfo text.
    pub fn parse(mountinfo: &str) -> Self {
        let mut out = Self::default();
        for line in mountinfo.lines() {
            // ... mount_point ... - fstype source super_options
            let Some((left, right)) = line.split_once(" - ") else {
                continue;
            };
            let mount_point = left.split_whitespace().nth(4);
            let mut r = right.split_whitespace();
            let fstype = r.next();
            let options = r.nth(1).unwrap_or("");
            match (fstype, mount_point) {
                (Some("cgroup2"), Some(mp)) if out.v2.is_none() => out.v2 = Some(mp.into()),
                (Some("cgroup"), Some(mp))
                    if out.v1_cpu.is_none() && options.split(',').any(|o| o == "cpu") =>
                {
                    out.v1_cpu = Some(mp.into())
                }
                _ => {}
            }
        }
        out
    }

    /// Reads the throttling state of every cgroup that holds a process of `members` (process
    /// → its `/proc/<pid>/cgroup` lines, remembered so that exited processes still count);
    /// `roles` gives the roles of each process's threads.
    pub fn read(
        &self,
        members: &BTreeMap<u32, Vec<CgroupLine>>,
        roles: &BTreeMap<u32, BTreeSet<Role>>,
    ) -> Vec<CgroupRow> {
        let mut by_path: BTreeMap<(u8, String), (BTreeSet<u32>, BTreeSet<Role>)> = BTreeMap::new();
        for (&pid, lines) in members {
            for line in lines.iter().cloned() {
                let version = if line.hierarchy == 0 && line.controllers.is_empty() {
                    if self.v2.is_none() {
                        continue;
                    }
                    2
                } else if line.controllers.iter().any(|c| c == "cpu") && self.v1_cpu.is_some() {
                    1
                } else {
                    continue;
                };
                let e = by_path.entry((version, line.path)).or_default();
                e.0.insert(pid);
                if let Some(r) = roles.get(&pid) {
                    e.1.extend(r.iter().copied());
                }
            }
        }
        by_path
            .into_iter()
            .filter_map(|((version, path), (pids, roles))| {
                let root = if version == 1 { &self.v1_cpu } else { &self.v2 };
                let dir = join(root.as_deref()?, &path);
                let read = |f: &str| std::fs::read_to_string(dir.join(f)).ok();
                let cpu = read("cpu.stat").and_then(|t| parse_cpu_stat(&t));
                let limit = if version == 1 {
                    read("cpu.cfs_quota_us")
                        .zip(read("cpu.cfs_period_us"))
                        .and_then(|(q, p)| cpu_limit_v1(&q, &p))
                } else {
                    read("cpu.max").and_then(|t| parse_cpu_max(&t))
                };
                let pressure = (version == 2)
                    .then(|| read("cpu.pressure").and_then(|t| parse_pressure(&t)))
                    .flatten();
                Some(CgroupRow {
                    path,
                    version,
                    cpu,
                    limit,
                    pressure,
                    pids: pids.into_iter().collect(),
                    roles: roles.into_iter().collect(),
                })
            })
            .collect()
    }
}

fn join(root: &Path, path: &str) -> PathBuf {
    root.join(path.trim_start_matches('/'))
}

/// System-wide PSI from `/proc/pressure` (empty without PSI).
pub fn system_pressure() -> Vec<PressureRow> {
    ["cpu", "memory", "io"]
        .into_iter()
        .filter_map(|resource| {
            let text = std::fs::read_to_string(format!("/proc/pressure/{resource}")).ok()?;
            Some(PressureRow {
                resource,
                pressure: parse_pressure(&text)?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sources::procfs;

    #[test]
    fn mounts_v1_and_v2() {
        let text = "30 25 0:26 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n\
                    31 25 0:27 / /sys/fs/cgroup/cpuacct rw - cgroup cgroup rw,cpuacct\n\
                    40 25 0:30 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n";
        let m = CgroupMounts::parse(text);
        assert_eq!(m.v1_cpu.as_deref(), Some(Path::new("/sys/fs/cgroup/cpu")));
        assert_eq!(m.v2.as_deref(), Some(Path::new("/sys/fs/cgroup/unified")));
        let text = "30 25 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n";
        assert_eq!(CgroupMounts::parse(text).v1_cpu, None);
    }

    #[test]
    fn this_process_has_a_cgroup_row() {
        let m = CgroupMounts::detect();
        if m.v1_cpu.is_none() && m.v2.is_none() {
            eprintln!("skipped: no cgroup mount");
            return;
        }
        let me = std::process::id();
        let rows = m.read(
            &BTreeMap::from([(me, procfs::cgroups(me))]),
            &BTreeMap::new(),
        );
        assert!(!rows.is_empty(), "{m:?}");
        assert!(rows.iter().all(|r| r.pids == [std::process::id()]));
    }
}
