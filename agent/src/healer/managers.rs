//! Managers that own knobs the healer could turn, detected so that the healer does not fight
//! them (it skips the knob and says why):
//!
//! - kubelet's CPU manager with the `static` policy (`/var/lib/kubelet/cpu_manager_state`,
//!   `"policyName":"static"`) re-syncs the cpusets of pods: no thread affinity or `cpuset.*`
//!   write for a process or cgroup under `kubepods`;
//! - systemd owns the cgroups of its units: no write to a cgroup below a `*.slice`, `*.service`
//!   or `*.scope` unless that unit is delegated (`Delegate=yes`, which systemd ≥ 251 marks with
//!   the `trusted.delegate` or `user.delegate` xattr on the unit's cgroup).

use std::path::{Path, PathBuf};

use super::knobs::Knob;

/// Default path of kubelet's CPU manager state.
pub use crate::config::KUBELET_CPU_MANAGER_STATE;

/// What owns what on this node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Managers {
    /// kubelet's CPU manager runs the static policy.
    pub kubelet_static: bool,
}

impl Managers {
    /// Reads kubelet's CPU manager state at `state`.
    pub fn detect(state: &Path) -> Self {
        let kubelet_static = std::fs::read_to_string(state)
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .and_then(|v| v.get("policyName")?.as_str().map(|p| p == "static"))
            .unwrap_or(false);
        Self { kubelet_static }
    }

    /// Who owns `knob`, if anyone but the healer may write it, as a sentence.
    pub fn owner(&self, knob: &Knob) -> Option<String> {
        match knob {
            Knob::Affinity { pid, .. } if self.kubelet_static => {
                let in_pod = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
                    .is_ok_and(|t| t.contains("kubepods"));
                in_pod.then(|| {
                    "kubelet's CPU manager (static policy) owns the cpusets of pods: not pinning \
                     threads of a pod"
                        .to_owned()
                })
            }
            Knob::Cgroup {
                cgroup, file, path, ..
            } => {
                if self.kubelet_static && file.starts_with("cpuset.") && cgroup.contains("kubepods")
                {
                    return Some(format!(
                        "kubelet's CPU manager (static policy) owns {file} of pods: not writing \
                         {}",
                        path.display()
                    ));
                }
                systemd_owner(cgroup, path)
            }
            _ => None,
        }
    }
}

const UNIT_SUFFIXES: [&str; 3] = [".slice", ".service", ".scope"];

fn delegated(dir: &Path) -> bool {
    ["trusted.delegate", "user.delegate"].iter().any(|name| {
        let Ok(p) = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()) else {
            return false;
        };
        let Ok(n) = std::ffi::CString::new(*name) else {
            return false;
        };
        let mut buf = [0u8; 8];
        // SAFETY: valid C strings and buffer.
        let len = unsafe {
            libc::getxattr(
                p.as_ptr(),
                n.as_ptr(),
                buf.as_mut_ptr() as *mut libc::c_void,
                buf.len(),
            )
        };
        len > 0 && buf[0] == b'1'
    })
}

/// systemd's claim on the cgroup `cgroup` whose file is `path`: the innermost unit in the path
/// and whether it is delegated.
fn systemd_owner(cgroup: &str, path: &Path) -> Option<String> {
    let parts: Vec<&str> = cgroup.split('/').filter(|c| !c.is_empty()).collect();
    let unit = parts
        .iter()
        .rposition(|c| UNIT_SUFFIXES.iter().any(|s| c.ends_with(s)))?;
    // The unit's own directory: walk up from the file by the components below the unit.
    let mut dir: PathBuf = path.parent()?.to_owned();
    for _ in unit + 1..parts.len() {
        dir = dir.parent()?.to_owned();
    }
    if delegated(&dir) {
        return None;
    }
    Some(format!(
        "systemd owns {} (unit {} without Delegate=yes): not writing {}",
        cgroup,
        parts[unit],
        path.display()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cg(cgroup: &str, file: &str) -> Knob {
        Knob::Cgroup {
            cgroup: cgroup.into(),
            file: file.into(),
            path: format!("/sys/fs/cgroup/cpu{cgroup}/{file}").into(),
        }
    }

    #[test]
    fn kubelet_static_policy_is_detected() {
        let dir = std::env::temp_dir().join(format!("slo-probe-kubelet-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let state = dir.join("cpu_manager_state");
        std::fs::write(
            &state,
            r#"{"policyName":"static","defaultCpuSet":"0-3","checksum":1}"#,
        )
        .expect("state");
        let m = Managers::detect(&state);
        assert!(m.kubelet_static);
        let owner = m
            .owner(&cg("/kubepods/pod1/c1", "cpuset.cpus"))
            .expect("owned");
        assert!(owner.contains("kubelet"), "{owner}");
        assert!(m.owner(&cg("/kubepods/pod1/c1", "cpu.shares")).is_none());
        std::fs::write(&state, r#"{"policyName":"none"}"#).expect("state");
        assert!(!Managers::detect(&state).kubelet_static);
        assert!(!Managers::detect(&dir.join("absent")).kubelet_static);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn systemd_units_are_not_written_unless_delegated() {
        let m = Managers::default();
        let owner = m
            .owner(&cg("/system.slice/batch.service", "cpu.shares"))
            .expect("systemd owns it");
        assert!(
            owner.contains("batch.service") && owner.contains("Delegate=yes"),
            "{owner}"
        );
        // Below the unit, still the unit's.
        assert!(m
            .owner(&cg("/user.slice/user-0.slice/x/y", "cpu.max"))
            .is_some());
        // Not a systemd path.
        assert!(m.owner(&cg("/neighbors", "cpu.shares")).is_none());
    }
}
