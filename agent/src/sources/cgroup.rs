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
    /// Where this process's cgroup namespace is rooted in each hierarchy (v1 cpu, v2), found
    /// the first time a path needs it: see [`resolve`].
    ns_roots: [std::sync::OnceLock<Option<String>>; 2],
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
                let root = root.as_deref()?;
                let dir = if path.starts_with("/..") {
                    let ns_root = self.ns_roots[usize::from(version == 2)]
                        .get_or_init(|| find_own_ns_root(root, version))
                        .as_deref()?;
                    join(root, &resolve(ns_root, &path)?)
                } else {
                    join(root, &path)
                };
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

/// `/proc/<pid>/cgroup` paths are relative to the reader's cgroup namespace: an agent in a
/// container with its own (Kubernetes on cgroup v2 gives every container one) sees other pods'
/// processes at `/../../kubepods-…/…`. Such a path is resolved against where the namespace is
/// rooted in the hierarchy, `ns_root` (an absolute path there).
pub fn resolve(ns_root: &str, path: &str) -> Option<String> {
    let mut parts: Vec<&str> = ns_root.split('/').filter(|c| !c.is_empty()).collect();
    for c in path.split('/').filter(|c| !c.is_empty() && *c != ".") {
        if c == ".." {
            parts.pop()?;
        } else {
            parts.push(c);
        }
    }
    Some(format!("/{}", parts.join("/")))
}

/// Where this process's cgroup namespace is rooted in the hierarchy mounted at `root` (which
/// must be the host's, e.g. a hostPath mount of /sys/fs/cgroup): the directory whose
/// `cgroup.procs` lists this process, minus the path `/proc/self/cgroup` gives it inside the
/// namespace. Walks at most 50,000 directories, once.
fn find_own_ns_root(root: &Path, version: u8) -> Option<String> {
    let me = std::process::id().to_string();
    let own = crate::sources::procfs::cgroups(std::process::id())
        .into_iter()
        .find(|l| {
            if version == 2 {
                l.hierarchy == 0 && l.controllers.is_empty()
            } else {
                l.controllers.iter().any(|c| c == "cpu")
            }
        })?
        .path;
    let mut stack = vec![root.to_path_buf()];
    let mut seen = 0;
    while let Some(dir) = stack.pop() {
        seen += 1;
        if seen > 50_000 {
            break;
        }
        let listed = std::fs::read_to_string(dir.join("cgroup.procs"))
            .is_ok_and(|t| t.lines().any(|l| l.trim() == me));
        if listed {
            let here = format!("/{}", dir.strip_prefix(root).ok()?.to_str()?);
            // `here` ends with our path inside the namespace; what comes before is its root.
            let inner = own.trim_end_matches('/');
            let ns_root = here.strip_suffix(inner).unwrap_or(&here);
            let ns_root = if ns_root.is_empty() { "/" } else { ns_root };
            log::info!(
                "cgroup v{version}: this agent's cgroup namespace is rooted at {ns_root}; paths \
                 of other containers' processes are resolved against it"
            );
            return Some(ns_root.to_owned());
        }
        if let Ok(entries) = std::fs::read_dir(&dir) {
            stack.extend(
                entries
                    .flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.path()),
            );
        }
    }
    log::warn!(
        "cgroup v{version}: paths relative to a cgroup namespace (/..) and this process not \
         found under {}: mount the host's cgroup hierarchy there (hostPath /sys/fs/cgroup)",
        root.display()
    );
    None
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
    fn namespaced_paths_resolve_against_the_namespace_root() {
        let root =
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podA.slice/cri-a.scope";
        assert_eq!(
            resolve(root, "/../../../kubepods-besteffort.slice/kubepods-besteffort-podB.slice/cri-b.scope")
                .as_deref(),
            Some("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podB.slice/cri-b.scope")
        );
        assert_eq!(resolve(root, "/").as_deref(), Some(root));
        assert_eq!(resolve("/", "/a/b").as_deref(), Some("/a/b"));
        assert_eq!(
            resolve("/a", "/../../b"),
            None,
            "above the hierarchy's root"
        );
    }

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
