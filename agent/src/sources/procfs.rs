//! Reads of `/proc`: the process tree (parents, names), used to seed the job's process set, to
//! find processes that fork following missed, and for names of processes the probes have not
//! seen yet; each process's cgroups; and what a training process is ([`ProcessIdentity`]:
//! rank, job, executable, Kubernetes pod, GPU), read once when its shim registers; the node's
//! host name.

use std::collections::BTreeSet;

use slo_probe_core::snapshot::ProcessSnapshot;

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

/// What a training process is, read once when its shim registers (`/proc/<pid>/stat`,
/// `cgroup` and `environ`): the exporters and reports take it from the snapshot
/// ([`ProcessSnapshot`]) and never read `/proc` themselves. Unreadable parts are `None`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcessIdentity {
    /// Rank in the job: `RANK` (torchrun), else `SLURM_PROCID`, `OMPI_COMM_WORLD_RANK` or
    /// `PMI_RANK`.
    pub rank: Option<u32>,
    /// Job: `SLO_PROBE_JOB`, else `TORCHELASTIC_RUN_ID`, `SLURM_JOB_ID` or `JOB_ID` (at most
    /// 128 characters).
    pub job_id: Option<String>,
    /// Executable name (`comm`).
    pub executable: Option<String>,
    /// Kubernetes pod UID, from its cgroup path ([`pod_uid_of_cgroup`]).
    pub pod_uid: Option<String>,
    /// Kubernetes pod name: its `HOSTNAME` when `KUBERNETES_SERVICE_HOST` is set.
    pub pod_name: Option<String>,
    /// Kubernetes namespace: `POD_NAMESPACE`, else `K8S_NAMESPACE`.
    pub pod_namespace: Option<String>,
    /// The GPU its environment gives it, when that is exactly one GPU UUID
    /// (`NVIDIA_VISIBLE_DEVICES`, as the NVIDIA device plugin sets it, or
    /// `CUDA_VISIBLE_DEVICES`).
    pub gpu_uuid: Option<String>,
}

impl ProcessIdentity {
    /// Reads what `/proc/<pid>` says.
    pub fn read(pid: u32) -> Self {
        let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
        Self::parse(
            stat(pid).map(|i| i.name),
            &parse_cgroups(&cgroup),
            &Environ::of(pid),
        )
    }

    /// From the name in its `stat`, its cgroup lines and its environment.
    pub fn parse(executable: Option<String>, cgroups: &[CgroupLine], env: &Environ) -> Self {
        let rank = ["RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"]
            .iter()
            .find_map(|k| env.get(k).and_then(|v| v.parse().ok()));
        let job_id = [
            "SLO_PROBE_JOB",
            "TORCHELASTIC_RUN_ID",
            "SLURM_JOB_ID",
            "JOB_ID",
        ]
        .iter()
        .find_map(|k| env.get(k))
        .map(|j| j.chars().take(128).collect());
        let in_k8s = env.get("KUBERNETES_SERVICE_HOST").is_some();
        let gpu_uuid = ["NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"]
            .iter()
            .find_map(|k| env.get(k))
            .map(|v| v.trim().to_owned())
            .filter(|v| v.starts_with("GPU-") && !v.contains(','));
        Self {
            rank,
            job_id,
            executable,
            pod_uid: cgroups.iter().find_map(|l| pod_uid_of_cgroup(&l.path)),
            pod_name: if in_k8s { env.get("HOSTNAME") } else { None },
            pod_namespace: env
                .get("POD_NAMESPACE")
                .or_else(|| env.get("K8S_NAMESPACE")),
            gpu_uuid,
        }
    }

    /// Writes it into the process's snapshot fields.
    pub fn fill(self, p: &mut ProcessSnapshot) {
        p.rank = self.rank;
        p.job_id = self.job_id;
        p.executable = self.executable;
        p.pod_uid = self.pod_uid;
        p.pod_name = self.pod_name;
        p.pod_namespace = self.pod_namespace;
        p.gpu_uuid = self.gpu_uuid;
    }
}

/// The pod UID in a cgroup path: `…/pod<uid>/…` (cgroupfs driver) or
/// `…-pod<uid with _>.slice/…` (systemd driver).
pub fn pod_uid_of_cgroup(path: &str) -> Option<String> {
    path.split('/').find_map(|seg| {
        let i = seg.rfind("pod")?;
        let rest = seg[i + 3..].trim_end_matches(".slice");
        let uid = rest.replace('_', "-");
        (uid.len() == 36 && uid.chars().all(|c| c.is_ascii_hexdigit() || c == '-')).then_some(uid)
    })
}

#[cfg(test)]
mod identity_tests {
    use super::*;

    fn identity(cgroup: &str, environ: &[u8]) -> ProcessIdentity {
        ProcessIdentity::parse(
            Some("python3".into()),
            &parse_cgroups(cgroup),
            &Environ(environ.to_vec()),
        )
    }

    #[test]
    fn rank_and_job_from_the_environment() {
        let id = identity(
            "",
            b"PATH=/bin\0RANK=3\0LOCAL_RANK=1\0TORCHELASTIC_RUN_ID=llama-42\0",
        );
        assert_eq!((id.rank, id.job_id.as_deref()), (Some(3), Some("llama-42")));
        let id = identity(
            "",
            b"SLURM_PROCID=7\0SLURM_JOB_ID=991\0SLO_PROBE_JOB=pretrain\0",
        );
        assert_eq!((id.rank, id.job_id.as_deref()), (Some(7), Some("pretrain")));
        let id = identity("", b"RANK=x\0JOB_ID=\0");
        assert_eq!((id.rank, id.job_id), (None, None));
        assert_eq!(
            identity("", b""),
            ProcessIdentity {
                executable: Some("python3".into()),
                ..Default::default()
            }
        );
        // Our own process: readable.
        assert!(ProcessIdentity::read(std::process::id())
            .executable
            .is_some());
    }

    #[test]
    fn a_pod_from_the_cgroup_and_the_environment() {
        let id = identity(
            "0::/kubepods.slice/kubepods-burstable.slice/\
             kubepods-burstable-pod8f1c2d3e_1111_2222_3333_444455556666.slice/cri-x.scope\n",
            b"KUBERNETES_SERVICE_HOST=10.0.0.1\0HOSTNAME=trainer-0\0POD_NAMESPACE=ml\0\
              NVIDIA_VISIBLE_DEVICES=GPU-8d6c1f2e-aaaa\0",
        );
        assert_eq!(
            id.pod_uid.as_deref(),
            Some("8f1c2d3e-1111-2222-3333-444455556666")
        );
        assert_eq!(id.pod_name.as_deref(), Some("trainer-0"));
        assert_eq!(id.pod_namespace.as_deref(), Some("ml"));
        assert_eq!(id.gpu_uuid.as_deref(), Some("GPU-8d6c1f2e-aaaa"));
        // Outside Kubernetes HOSTNAME is the machine's; several GPUs name none.
        let id = identity(
            "",
            b"HOSTNAME=node-3\0K8S_NAMESPACE=batch\0CUDA_VISIBLE_DEVICES=GPU-a,GPU-b\0",
        );
        assert_eq!(id.pod_name, None);
        assert_eq!(id.pod_namespace.as_deref(), Some("batch"));
        assert_eq!(id.gpu_uuid, None);
        assert_eq!(identity("", b"CUDA_VISIBLE_DEVICES=0\0").gpu_uuid, None);
    }

    #[test]
    fn pod_uid_from_both_cgroup_drivers() {
        assert_eq!(
            pod_uid_of_cgroup("/kubepods/burstable/pod8f1c2d3e-1111-2222-3333-444455556666/abc123")
                .as_deref(),
            Some("8f1c2d3e-1111-2222-3333-444455556666")
        );
        assert_eq!(
            pod_uid_of_cgroup(
                "/kubepods.slice/kubepods-burstable.slice/\
                 kubepods-burstable-pod8f1c2d3e_1111_2222_3333_444455556666.slice/cri-x.scope"
            )
            .as_deref(),
            Some("8f1c2d3e-1111-2222-3333-444455556666")
        );
        assert_eq!(pod_uid_of_cgroup("/user.slice/user-0.slice"), None);
    }
}
