//! Reads of `/proc`: the process tree (parents, names), used to seed the job's process set, to
//! find processes that fork following missed, and for names of processes the probes have not
//! seen yet; each process's cgroups; the node's host name.

use std::collections::BTreeSet;

/// One process as `/proc` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcInfo {
    /// Process id.
    pub pid: u32,
    /// Parent process id.
    pub ppid: u32,
    /// Name (`comm`).
    pub name: String,
}

/// Parent pid and name of `pid` from `/proc/<pid>/stat` (`None` once it is gone).
pub fn stat(pid: u32) -> Option<ProcInfo> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(pid, &text)
}

/// Parses `/proc/<pid>/stat`. The name is in parentheses and may itself contain spaces and
/// parentheses, so the fields after it are found from the last `)`.
pub fn parse_stat(pid: u32, text: &str) -> Option<ProcInfo> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let name = text.get(open + 1..close)?.to_owned();
    let ppid = text
        .get(close + 1..)?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some(ProcInfo { pid, ppid, name })
}

/// The node's host name (empty when unreadable).
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

/// Every process now.
pub fn scan() -> Vec<ProcInfo> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(stat)
        .collect()
}

/// Adds every live descendant of a pid already in `tree` to it.
pub fn add_descendants(tree: &mut BTreeSet<u32>) {
    let all = scan();
    // Repeat until nothing is added, so grandchildren listed before their parent are found.
    loop {
        let before = tree.len();
        for p in &all {
            if !tree.contains(&p.pid) && tree.contains(&p.ppid) {
                tree.insert(p.pid);
            }
        }
        if tree.len() == before {
            break;
        }
    }
}

/// One line of `/proc/<pid>/cgroup`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CgroupLine {
    /// Hierarchy id (0 for cgroup v2).
    pub hierarchy: u32,
    /// Controllers of a v1 hierarchy (`cpu`, `cpuacct`, ...); empty for v2.
    pub controllers: Vec<String>,
    /// Path inside the hierarchy.
    pub path: String,
}

/// Parses `/proc/<pid>/cgroup`.
pub fn parse_cgroups(text: &str) -> Vec<CgroupLine> {
    text.lines()
        .filter_map(|l| {
            let mut f = l.splitn(3, ':');
            let hierarchy = f.next()?.parse().ok()?;
            let controllers = f
                .next()?
                .split(',')
                .filter(|c| !c.is_empty())
                .map(str::to_owned)
                .collect();
            let path = f.next()?.to_owned();
            Some(CgroupLine {
                hierarchy,
                controllers,
                path,
            })
        })
        .collect()
}

/// The cgroups of `pid` (empty once it is gone).
pub fn cgroups(pid: u32) -> Vec<CgroupLine> {
    std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .map(|t| parse_cgroups(&t))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_with_odd_names() {
        let p = parse_stat(7, "7 (a) b (c)) S 3 7 7 0 -1").expect("parse");
        assert_eq!((p.ppid, p.name.as_str()), (3, "a) b (c)"));
        assert_eq!(parse_stat(7, "garbage"), None);
    }

    #[test]
    fn parent_of_self_is_our_parent() {
        // SAFETY: getppid has no preconditions.
        let parent = unsafe { libc::getppid() } as u32;
        assert_eq!(stat(std::process::id()).map(|p| p.ppid), Some(parent));
    }

    #[test]
    fn descendants_include_a_grandchild() {
        let mut child = std::process::Command::new("sh")
            .args(["-c", "sleep 2 & wait"])
            .spawn()
            .expect("sh");
        std::thread::sleep(std::time::Duration::from_millis(300));
        let mut tree = BTreeSet::from([child.id()]);
        add_descendants(&mut tree);
        let _ = child.kill();
        let _ = child.wait();
        assert!(tree.len() >= 2, "{tree:?}");
    }

    #[test]
    fn cgroup_lines_v1_and_v2() {
        let text = "12:pids:/user.slice\n4:cpu,cpuacct:/job/a\n0::/system.slice/x.service\n";
        let lines = parse_cgroups(text);
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[1].controllers, ["cpu", "cpuacct"]);
        assert_eq!(lines[1].path, "/job/a");
        assert_eq!(lines[2].hierarchy, 0);
        assert!(lines[2].controllers.is_empty());
    }
}

/// A process's environment: `/proc/<pid>/environ`, NUL-separated `KEY=value` pairs. Reading
/// another user's needs root or CAP_SYS_PTRACE; unreadable is empty.
pub struct Environ(Vec<u8>);

impl Environ {
    /// The environment of `pid` (empty once it is gone or when unreadable).
    pub fn of(pid: u32) -> Self {
        Self(std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default())
    }

    /// A variable's value, when set and not empty.
    pub fn get(&self, key: &str) -> Option<String> {
        self.0
            .split(|b| *b == 0)
            .find_map(|kv| kv.strip_prefix(key.as_bytes())?.strip_prefix(b"="))
            .filter(|v| !v.is_empty())
            .map(|v| String::from_utf8_lossy(v).into_owned())
    }
}

/// Which rank of which job a training process is, from its environment: the rank from `RANK`
/// (torchrun), else `SLURM_PROCID`, `OMPI_COMM_WORLD_RANK` or `PMI_RANK`; the job from
/// `SLO_PROBE_JOB`, else `TORCHELASTIC_RUN_ID`, `SLURM_JOB_ID` or `JOB_ID`. An unreadable
/// environment gives `(None, None)`.
pub fn job_identity(pid: u32) -> (Option<u32>, Option<String>) {
    identity_of(&Environ::of(pid))
}

/// See [`job_identity`]: `environ` is NUL-separated `KEY=value` pairs.
pub fn parse_job_identity(environ: &[u8]) -> (Option<u32>, Option<String>) {
    identity_of(&Environ(environ.to_vec()))
}

fn identity_of(env: &Environ) -> (Option<u32>, Option<String>) {
    let rank = ["RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"]
        .iter()
        .find_map(|k| env.get(k).and_then(|v| v.parse().ok()));
    let job = [
        "SLO_PROBE_JOB",
        "TORCHELASTIC_RUN_ID",
        "SLURM_JOB_ID",
        "JOB_ID",
    ]
    .iter()
    .find_map(|k| env.get(k))
    .map(|j| j.chars().take(128).collect());
    (rank, job)
}

#[cfg(test)]
mod identity_tests {
    use super::*;

    #[test]
    fn rank_and_job_from_the_environment() {
        let env = b"PATH=/bin\0RANK=3\0LOCAL_RANK=1\0TORCHELASTIC_RUN_ID=llama-42\0";
        assert_eq!(parse_job_identity(env), (Some(3), Some("llama-42".into())));
        let env = b"SLURM_PROCID=7\0SLURM_JOB_ID=991\0SLO_PROBE_JOB=pretrain\0";
        assert_eq!(parse_job_identity(env), (Some(7), Some("pretrain".into())));
        assert_eq!(parse_job_identity(b"RANK=x\0JOB_ID=\0"), (None, None));
        assert_eq!(parse_job_identity(b""), (None, None));
        // Our own process: readable, usually neither is set.
        let _ = job_identity(std::process::id());
    }
}
