//! What this machine allows: privileges and kernel BTF. Checked before loading eBPF so that a
//! missing piece gets a message naming it and the fix, not a bare `EPERM` from the loader. (No
//! tracefs: every program is a BTF tracepoint, attached through `bpf()` alone.)

use std::{fmt, path::Path};

use super::btf::VMLINUX_BTF;

/// Capability numbers from `linux/capability.h`.
const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// One finding of the preflight check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    /// What was checked.
    pub what: &'static str,
    /// Whether it is usable.
    pub ok: bool,
    /// What was found, and when not ok, how to fix it.
    pub detail: String,
}

/// The result of all checks.
#[derive(Clone, Debug)]
pub struct Preflight {
    /// Kernel release (`uname -r`).
    pub kernel: String,
    /// The privileges finding.
    pub privileges: Finding,
    /// The kernel BTF finding.
    pub btf: Finding,
}

impl Preflight {
    /// Runs every check.
    pub fn run() -> Self {
        Self {
            kernel: kernel_release(),
            privileges: check_privileges(),
            btf: check_btf(Path::new(VMLINUX_BTF)),
        }
    }

    /// The first finding that stops the probes.
    pub fn blocker(&self) -> Option<&Finding> {
        [&self.privileges, &self.btf].into_iter().find(|f| !f.ok)
    }
}

impl fmt::Display for Preflight {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "kernel      {}", self.kernel)?;
        for finding in [&self.privileges, &self.btf] {
            let mark = if finding.ok { "ok  " } else { "MISSING" };
            writeln!(f, "{:<11} {mark} {}", finding.what, finding.detail)?;
        }
        Ok(())
    }
}

fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "unknown".to_owned())
}

/// Effective capabilities of this process, from `/proc/self/status`.
fn effective_caps() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
    u64::from_str_radix(hex.trim(), 16).ok()
}

fn check_privileges() -> Finding {
    let what = "privileges";
    let Some(caps) = effective_caps() else {
        return Finding {
            what,
            ok: false,
            detail: "cannot read CapEff from /proc/self/status".to_owned(),
        };
    };
    let has = |cap: u32| caps & (1u64 << cap) != 0;
    if has(CAP_BPF) && has(CAP_PERFMON) {
        return Finding {
            what,
            ok: true,
            detail: "CAP_BPF and CAP_PERFMON".to_owned(),
        };
    }
    if has(CAP_SYS_ADMIN) {
        return Finding {
            what,
            ok: true,
            detail: "CAP_SYS_ADMIN".to_owned(),
        };
    }
    let missing: Vec<&str> = [(CAP_BPF, "CAP_BPF"), (CAP_PERFMON, "CAP_PERFMON")]
        .into_iter()
        .filter(|(c, _)| !has(*c))
        .map(|(_, n)| n)
        .collect();
    Finding {
        what,
        ok: false,
        detail: format!(
            "{} missing: run as root (sudo), or grant the binary the capabilities \
             (`sudo setcap cap_bpf,cap_perfmon+ep \"$(command -v slo-probe)\"`), or pass --no-ebpf",
            missing.join(" and ")
        ),
    }
}

fn check_btf(path: &Path) -> Finding {
    let what = "btf";
    match std::fs::metadata(path) {
        Ok(_) => Finding {
            what,
            ok: true,
            detail: path.display().to_string(),
        },
        Err(e) => Finding {
            what,
            ok: false,
            detail: format!(
                "{} unreadable ({e}): the scheduling probes need a kernel built with \
                 CONFIG_DEBUG_INFO_BTF=y (5.4+); use such a kernel or pass --no-ebpf",
                path.display()
            ),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_btf_names_the_fix() {
        let f = check_btf(Path::new("/nonexistent/vmlinux"));
        assert!(!f.ok);
        assert!(f.detail.contains("CONFIG_DEBUG_INFO_BTF"), "{}", f.detail);
        assert!(f.detail.contains("--no-ebpf"), "{}", f.detail);
    }

    #[test]
    fn report_lists_every_check() {
        let text = Preflight::run().to_string();
        for what in ["kernel", "privileges", "btf"] {
            assert!(text.contains(what), "{text}");
        }
    }
}
