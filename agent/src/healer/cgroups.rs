//! Where a cgroup's controller files are, for the actuators: the v1 hierarchies of the `cpu`,
//! `cpuset` and `memory` controllers and the v2 hierarchy (a controller lives in one of them),
//! and the neighbour cgroups `heal.neighbors` allows, expanded to the cgroups that exist.
//! Paths are as `/proc/<pid>/cgroup` shows them; paths outside the agent's cgroup namespace
//! (`/..`) are not acted on.

use std::path::{Path, PathBuf};

/// A controller the actuators write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Controller {
    /// `cpu`.
    Cpu,
    /// `cpuset`.
    Cpuset,
    /// `memory`.
    Memory,
}

impl Controller {
    fn name(self) -> &'static str {
        match self {
            Self::Cpu => "cpu",
            Self::Cpuset => "cpuset",
            Self::Memory => "memory",
        }
    }
}

/// The mounted hierarchies.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Hierarchies {
    /// v1 `cpu`.
    pub v1_cpu: Option<PathBuf>,
    /// v1 `cpuset`.
    pub v1_cpuset: Option<PathBuf>,
    /// v1 `memory`.
    pub v1_memory: Option<PathBuf>,
    /// v2.
    pub v2: Option<PathBuf>,
}

impl Hierarchies {
    /// From `/proc/self/mountinfo`.
    pub fn detect() -> Self {
        std::fs::read_to_string("/proc/self/mountinfo")
            .map(|t| Self::parse(&t))
            .unwrap_or_default()
    }

    /// Parses mountinfo text.
    pub fn parse(mountinfo: &str) -> Self {
        let mut out = Self::default();
        for line in mountinfo.lines() {
            let Some((left, right)) = line.split_once(" - ") else {
                continue;
            };
            let Some(mp) = left.split_whitespace().nth(4) else {
                continue;
            };
            let mut r = right.split_whitespace();
            let fstype = r.next();
            let options = r.nth(1).unwrap_or("");
            let has = |c: &str| options.split(',').any(|o| o == c);
            match fstype {
                Some("cgroup2") if out.v2.is_none() => out.v2 = Some(mp.into()),
                Some("cgroup") => {
                    if has("cpu") && out.v1_cpu.is_none() {
                        out.v1_cpu = Some(mp.into());
                    }
                    if has("cpuset") && out.v1_cpuset.is_none() {
                        out.v1_cpuset = Some(mp.into());
                    }
                    if has("memory") && out.v1_memory.is_none() {
                        out.v1_memory = Some(mp.into());
                    }
                }
                _ => {}
            }
        }
        out
    }

    /// The v1 mount of `c`, if it is mounted in v1.
    fn v1(&self, c: Controller) -> Option<&Path> {
        match c {
            Controller::Cpu => self.v1_cpu.as_deref(),
            Controller::Cpuset => self.v1_cpuset.as_deref(),
            Controller::Memory => self.v1_memory.as_deref(),
        }
    }

    /// The directory of `cgroup` for controller `c` and the cgroup version it is under.
    pub fn dir(&self, cgroup: &str, c: Controller) -> Option<(PathBuf, u8)> {
        if cgroup.starts_with("/..") || cgroup.contains("/../") {
            return None;
        }
        let rel = cgroup.trim_start_matches('/');
        if let Some(root) = self.v1(c) {
            let d = root.join(rel);
            return d.is_dir().then_some((d, 1));
        }
        let root = self.v2.as_deref()?;
        let d = root.join(rel);
        let enabled = std::fs::read_to_string(d.join("cgroup.controllers"))
            .is_ok_and(|t| t.split_whitespace().any(|x| x == c.name()));
        (d.is_dir() && enabled).then_some((d, 2))
    }

    /// The cgroups `patterns` name that exist in the cpu controller's hierarchy: exact paths,
    /// and for a pattern ending in `*` the cgroups one level below its directory whose names
    /// start with the rest (`/batch/*`: every child of `/batch`).
    pub fn expand(&self, patterns: &[String]) -> Vec<String> {
        let root = self.v1_cpu.as_deref().or(self.v2.as_deref());
        let Some(root) = root else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for p in patterns {
            match p.strip_suffix('*') {
                None => {
                    if root.join(p.trim_start_matches('/')).is_dir() {
                        out.push(p.clone());
                    }
                }
                Some(prefix) => {
                    let (dir, name) = match prefix.rfind('/') {
                        Some(i) => (&prefix[..i], &prefix[i + 1..]),
                        None => ("", prefix),
                    };
                    let Ok(entries) = std::fs::read_dir(root.join(dir.trim_start_matches('/')))
                    else {
                        continue;
                    };
                    for e in entries.flatten() {
                        let n = e.file_name().to_string_lossy().into_owned();
                        if e.path().is_dir() && n.starts_with(name) {
                            out.push(format!("{dir}/{n}"));
                        }
                    }
                }
            }
        }
        out.sort();
        out.dedup();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_of_a_hybrid_host() {
        let text = "\
30 25 0:26 / /sys/fs/cgroup/cpu rw,relatime shared:10 - cgroup cgroup rw,cpu
31 25 0:27 / /sys/fs/cgroup/cpuset rw,relatime shared:11 - cgroup cgroup rw,cpuset
32 25 0:28 / /sys/fs/cgroup/memory rw,relatime shared:12 - cgroup cgroup rw,memory
33 25 0:29 / /sys/fs/cgroup/unified rw,relatime shared:13 - cgroup2 cgroup2 rw
";
        let h = Hierarchies::parse(text);
        assert_eq!(h.v1_cpu.as_deref(), Some(Path::new("/sys/fs/cgroup/cpu")));
        assert_eq!(
            h.v1_cpuset.as_deref(),
            Some(Path::new("/sys/fs/cgroup/cpuset"))
        );
        assert_eq!(
            h.v1_memory.as_deref(),
            Some(Path::new("/sys/fs/cgroup/memory"))
        );
        assert_eq!(h.v2.as_deref(), Some(Path::new("/sys/fs/cgroup/unified")));
        assert!(h.dir("/../other", Controller::Cpu).is_none());
    }

    #[test]
    fn neighbour_patterns_expand_to_existing_cgroups() {
        let root = std::env::temp_dir().join(format!("slo-probe-cg-{}", std::process::id()));
        for d in ["batch/a", "batch/b", "solo", "jobs/x"] {
            std::fs::create_dir_all(root.join(d)).expect("mkdir");
        }
        let h = Hierarchies {
            v1_cpu: Some(root.clone()),
            ..Default::default()
        };
        let got = h.expand(&[
            "/batch/*".into(),
            "/solo".into(),
            "/absent".into(),
            "/jo*".into(),
        ]);
        assert_eq!(got, vec!["/batch/a", "/batch/b", "/jobs", "/solo"]);
        let _ = std::fs::remove_dir_all(&root);
    }
}
