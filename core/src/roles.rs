//! Thread roles of a training job: main/compute, data-loader worker, communication, pin-memory,
//! other. Every host metric is reported per role.
//!
//! Roles come from thread names (the kernel's `comm`) and the process tree. The default patterns
//! are the names a real PyTorch 2.11 DDP job gives its threads (recorded on an H200 node:
//! `tests/fixtures/pytorch-threads/`): DataLoader worker processes and all their threads are
//! `pt_data_worker`, the pin-memory thread `pt_data_pin`, NCCL's watchdog and heartbeat
//! `pt_nccl_watchdg`/`pt_nccl_heartbt`, gloo's `pt_gloo_runloop`, the rendezvous store
//! `pt_tcpstore_uv`, the CUDA autograd engine `pt_autograd_0`; the main thread keeps the
//! interpreter's name (`python3`). NCCL's own proxy threads are `NCCL ...`. Users add patterns
//! for their own names in the config.

use std::fmt;

/// The role of a thread in the job.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// The training loop: the main thread of a training process, and the autograd engine's
    /// device threads that launch the backward pass.
    Main,
    /// DataLoader workers (processes and their threads).
    DataLoader,
    /// Collective communication and rendezvous: NCCL, gloo, the TCP store.
    Communication,
    /// The pin-memory thread that copies batches to page-locked memory.
    PinMemory,
    /// Anything else (CUDA driver threads, thread pools, compile workers, other processes).
    Other,
}

impl Role {
    /// Every role, in export order.
    pub const ALL: [Role; 5] = [
        Role::Main,
        Role::DataLoader,
        Role::Communication,
        Role::PinMemory,
        Role::Other,
    ];

    /// The metric label value.
    pub const fn as_str(self) -> &'static str {
        match self {
            Role::Main => "main",
            Role::DataLoader => "data_loader",
            Role::Communication => "communication",
            Role::PinMemory => "pin_memory",
            Role::Other => "other",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a process is to the job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProcessKind {
    /// A training process (a rank): a job root, or a process with framework threads (autograd,
    /// communication, pin-memory).
    Training,
    /// A DataLoader worker process.
    DataLoader,
    /// Anything else (launchers without framework threads, compile workers, helpers).
    Other,
}

impl ProcessKind {
    /// A short lowercase name.
    pub const fn as_str(self) -> &'static str {
        match self {
            ProcessKind::Training => "training",
            ProcessKind::DataLoader => "data_loader",
            ProcessKind::Other => "other",
        }
    }
}

/// A thread-name pattern: `*` matches any run of characters; matching ignores ASCII case.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pattern(String);

impl Pattern {
    /// A pattern from its text.
    pub fn new(text: &str) -> Self {
        Self(text.to_ascii_lowercase())
    }

    /// The pattern's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether `name` matches.
    pub fn matches(&self, name: &str) -> bool {
        glob(self.0.as_bytes(), name.to_ascii_lowercase().as_bytes())
    }
}

/// Iterative glob with `*` only (backtracking to the last star): linear in practice.
fn glob(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if p < pattern.len() && pattern[p] == b'*' {
            star = Some((p, t));
            p += 1;
        } else if p < pattern.len() && pattern[p] == text[t] {
            p += 1;
            t += 1;
        } else if let Some((sp, st)) = star {
            p = sp + 1;
            t = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

/// Name patterns per role.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RoleRules {
    /// DataLoader worker names.
    pub data_loader: Vec<Pattern>,
    /// Communication thread names.
    pub communication: Vec<Pattern>,
    /// Pin-memory thread names.
    pub pin_memory: Vec<Pattern>,
    /// Names of threads that belong to the training loop besides the main thread.
    pub main: Vec<Pattern>,
}

/// Default DataLoader patterns.
pub const DEFAULT_DATA_LOADER: &[&str] = &["pt_data_worker*", "loader*", "dataloader*"];
/// Default communication patterns.
pub const DEFAULT_COMMUNICATION: &[&str] = &[
    "pt_nccl*",
    "nccl*",
    "pt_gloo*",
    "gloo*",
    "pt_tcpstore*",
    "comm-*",
];
/// Default pin-memory patterns.
pub const DEFAULT_PIN_MEMORY: &[&str] = &["pt_data_pin*", "pin-memory*", "pin_memory*"];
/// Default patterns of extra training-loop threads.
pub const DEFAULT_MAIN: &[&str] = &["pt_autograd*"];

impl Default for RoleRules {
    fn default() -> Self {
        let p = |v: &[&str]| v.iter().map(|s| Pattern::new(s)).collect();
        Self {
            data_loader: p(DEFAULT_DATA_LOADER),
            communication: p(DEFAULT_COMMUNICATION),
            pin_memory: p(DEFAULT_PIN_MEMORY),
            main: p(DEFAULT_MAIN),
        }
    }
}

impl RoleRules {
    /// The role a thread name alone implies, if any.
    pub fn role_of_name(&self, name: &str) -> Option<Role> {
        let any = |ps: &[Pattern]| ps.iter().any(|p| p.matches(name));
        if any(&self.data_loader) {
            Some(Role::DataLoader)
        } else if any(&self.pin_memory) {
            Some(Role::PinMemory)
        } else if any(&self.communication) {
            Some(Role::Communication)
        } else if any(&self.main) {
            Some(Role::Main)
        } else {
            None
        }
    }

    /// What a process is: a DataLoader worker when its main thread has a DataLoader name; a
    /// training process when it is a job root or runs framework threads; else other.
    pub fn process_kind<'a>(
        &self,
        is_root: bool,
        main_thread_name: &str,
        thread_names: impl IntoIterator<Item = &'a str>,
    ) -> ProcessKind {
        if self.role_of_name(main_thread_name) == Some(Role::DataLoader) {
            return ProcessKind::DataLoader;
        }
        if is_root
            || thread_names.into_iter().any(|n| {
                matches!(
                    self.role_of_name(n),
                    Some(Role::Main | Role::Communication | Role::PinMemory)
                )
            })
        {
            return ProcessKind::Training;
        }
        ProcessKind::Other
    }

    /// The role of thread `tid` named `name` in process `pid` of kind `kind`.
    pub fn thread_role(&self, kind: ProcessKind, pid: u32, tid: u32, name: &str) -> Role {
        if let Some(r) = self.role_of_name(name) {
            return r;
        }
        match kind {
            ProcessKind::DataLoader => Role::DataLoader,
            ProcessKind::Training if tid == pid => Role::Main,
            _ => Role::Other,
        }
    }
}

/// A NUL-padded kernel `comm` as a string (lossy for non-UTF-8 names).
pub fn comm_to_string(comm: &[u8; 16]) -> String {
    let end = comm.iter().position(|&b| b == 0).unwrap_or(comm.len());
    String::from_utf8_lossy(&comm[..end]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glob_patterns() {
        let p = Pattern::new("pt_nccl*");
        assert!(p.matches("pt_nccl_watchdg"));
        assert!(p.matches("PT_NCCL"));
        assert!(!p.matches("xpt_nccl"));
        assert!(Pattern::new("*memory*").matches("pin-memory-0"));
        assert!(Pattern::new("a*b*c").matches("axxbyyc"));
        assert!(!Pattern::new("a*b*c").matches("axxbyy"));
        assert!(Pattern::new("exact").matches("exact"));
        assert!(!Pattern::new("exact").matches("exactly"));
        assert!(Pattern::new("*").matches(""));
    }

    /// A process and its threads as dumped by `examples/train_ddp.py --dump-threads`.
    struct Dumped {
        pid: u32,
        cmdline: String,
        threads: Vec<(u32, String)>,
    }

    fn parse_dump(text: &str) -> Vec<Dumped> {
        let mut out: Vec<Dumped> = Vec::new();
        for line in text.lines() {
            let mut f = line.split_whitespace();
            match f.next() {
                Some("process") => out.push(Dumped {
                    pid: f.next().and_then(|p| p.parse().ok()).expect("pid"),
                    cmdline: f.collect::<Vec<_>>().join(" "),
                    threads: Vec::new(),
                }),
                Some("thread") => {
                    let tid = f.next().and_then(|p| p.parse().ok()).expect("tid");
                    let name = f.collect::<Vec<_>>().join(" ");
                    out.last_mut()
                        .expect("process first")
                        .threads
                        .push((tid, name));
                }
                _ => {}
            }
        }
        out
    }

    fn roles_of(dump: &str) -> Vec<(u32, u32, String, Role)> {
        let rules = RoleRules::default();
        let procs = parse_dump(dump);
        let root = procs[0].pid;
        let mut out = Vec::new();
        for p in &procs {
            let main_name = p
                .threads
                .iter()
                .find(|(t, _)| *t == p.pid)
                .map_or("", |(_, n)| n.as_str());
            let kind = rules.process_kind(
                p.pid == root,
                main_name,
                p.threads.iter().map(|(_, n)| n.as_str()),
            );
            for (tid, name) in &p.threads {
                out.push((
                    p.pid,
                    *tid,
                    name.clone(),
                    rules.thread_role(kind, p.pid, *tid, name),
                ));
            }
            assert!(!p.cmdline.is_empty());
        }
        out
    }

    fn role(rows: &[(u32, u32, String, Role)], name: &str) -> Vec<Role> {
        rows.iter().filter(|r| r.2 == name).map(|r| r.3).collect()
    }

    /// The real PyTorch 2.11 NCCL job recorded on an H200 node.
    #[test]
    fn real_pytorch_nccl_job() {
        let rows = roles_of(include_str!(
            "../../tests/fixtures/pytorch-threads/h200-torch2.11-threads-eager.txt"
        ));
        let main: Vec<_> = rows.iter().filter(|r| r.3 == Role::Main).collect();
        // The main thread and the autograd thread.
        assert_eq!(main.len(), 2, "{main:?}");
        assert!(main.iter().any(|r| r.0 == r.1 && r.2 == "python3"));
        assert_eq!(role(&rows, "pt_data_pin"), [Role::PinMemory]);
        assert_eq!(role(&rows, "pt_nccl_watchdg"), [Role::Communication]);
        assert_eq!(role(&rows, "pt_tcpstore_uv"), [Role::Communication]);
        let loaders = role(&rows, "pt_data_worker");
        assert_eq!(loaders.len(), 6);
        assert!(loaders.iter().all(|r| *r == Role::DataLoader));
        assert_eq!(role(&rows, "cuda-EvtHandlr"), [Role::Other]);
    }

    /// With compile workers: their process has no framework threads, so it is not training.
    #[test]
    fn real_pytorch_compile_job() {
        let rows = roles_of(include_str!(
            "../../tests/fixtures/pytorch-threads/h200-torch2.11-threads-compile.txt"
        ));
        let compile_worker: Vec<_> = rows.iter().filter(|r| r.0 == 589).collect();
        assert!(!compile_worker.is_empty());
        assert!(compile_worker.iter().all(|r| r.3 == Role::Other));
        assert_eq!(rows.iter().filter(|r| r.3 == Role::Main).count(), 2);
    }

    #[test]
    fn real_pytorch_gloo_job() {
        let rows = roles_of(include_str!(
            "../../tests/fixtures/pytorch-threads/h200-torch2.11-threads-gloo.txt"
        ));
        assert_eq!(
            role(&rows, "pt_gloo_runloop"),
            [Role::Communication, Role::Communication]
        );
        assert_eq!(role(&rows, "pt_data_worker").len(), 6);
    }

    #[test]
    fn launcher_without_framework_threads_is_other_unless_root() {
        let rules = RoleRules::default();
        let kind = rules.process_kind(false, "python3", ["python3", "python3"]);
        assert_eq!(kind, ProcessKind::Other);
        assert_eq!(rules.thread_role(kind, 10, 10, "python3"), Role::Other);
        let kind = rules.process_kind(true, "python3", ["python3"]);
        assert_eq!(rules.thread_role(kind, 10, 10, "python3"), Role::Main);
        assert_eq!(rules.thread_role(kind, 10, 11, "python3"), Role::Other);
    }
}
