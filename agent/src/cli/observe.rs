//! `slo-probe observe`: run a command, follow its process tree in the kernel for a while, print
//! what the probes measured for it by thread role. The one-shot form of the agent, for trying it
//! out and for scripts.

use std::{
    collections::{BTreeMap, BTreeSet},
    io::Write as _,
    os::{fd::FromRawFd, unix::process::CommandExt},
    process::{Child, Command, ExitStatus},
    time::{Duration, Instant},
};

use slo_probe_core::{healer::HealerConfig, snapshot::Snapshot};

use crate::{
    collector::Collector,
    healer::shadow::{Decided, ShadowHealer},
    sources::ebpf::EbpfError,
};

/// Errors of `observe`.
#[derive(Debug, thiserror::Error)]
pub enum ObserveError {
    /// The command could not be started.
    #[error("cannot start `{command}`")]
    Spawn {
        /// The command line.
        command: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The command's process could not be added to the kernel's process set.
    #[error("cannot follow the command's process")]
    Track(#[source] EbpfError),
}

/// What `observe` ends with.
pub struct Observation {
    /// The last snapshot.
    pub snapshot: Snapshot,
    /// Process ids of the command and its descendants seen while observing.
    pub pids: BTreeSet<u32>,
    /// How long it observed.
    pub elapsed: Duration,
    /// The command's exit status, if it ended by itself.
    pub exit: Option<ExitStatus>,
    /// What a shadow healer decided for each GPU process followed (`heal` given to [`run`]).
    pub healers: BTreeMap<u32, Decided>,
}

fn stop_child(child: &mut Child) {
    let pid = child.id() as libc::pid_t;
    // SAFETY: signalling our own child by pid.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Environment for the command: the CUPTI shim to inject and the socket it registers on.
#[derive(Clone, Debug, Default)]
pub struct Inject {
    /// `CUDA_INJECTION64_PATH`.
    pub library: Option<std::path::PathBuf>,
    /// `SLO_PROBE_SOCKET`.
    pub socket: Option<std::path::PathBuf>,
    /// More environment (the Python bootstrap's, `python_boot`).
    pub env: Vec<(std::ffi::OsString, std::ffi::OsString)>,
}

impl Inject {
    /// Sets the command's environment: the shim (unless the user's own
    /// `CUDA_INJECTION64_PATH` is set: it wins), its socket, and the rest.
    pub(crate) fn apply(&self, cmd: &mut Command) {
        if let Some(lib) = &self.library {
            if std::env::var_os("CUDA_INJECTION64_PATH").is_none() {
                cmd.env("CUDA_INJECTION64_PATH", lib);
            }
        }
        if let Some(sock) = &self.socket {
            cmd.env("SLO_PROBE_SOCKET", sock);
        }
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
    }
}

/// Starts `command` held before it runs until the returned writer is written to or closed, so
/// that the probes follow it from its first instruction. Needs `/bin/sh`.
pub(crate) fn spawn_held(
    command: &[String],
    inject: &Inject,
) -> Result<(Child, std::fs::File), ObserveError> {
    let line = command.join(" ");
    let spawn_err = |source| ObserveError::Spawn {
        command: line.clone(),
        source,
    };
    let (program, args) = command.split_first().ok_or_else(|| {
        spawn_err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "empty command",
        ))
    })?;
    let mut fds = [0i32; 2];
    // SAFETY: valid pointer to two ints.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(spawn_err(std::io::Error::last_os_error()));
    }
    let (read_fd, write_fd) = (fds[0], fds[1]);
    // `Command::spawn` returns only once the child has exec'd, so the child cannot wait before
    // exec'ing the command itself: it exec's a shell that waits on fd 3, then exec's the command
    // in the same process (same pid).
    let mut cmd = Command::new("/bin/sh");
    cmd.arg("-c")
        .arg("read -r _ <&3; exec 3<&-; exec \"$@\"")
        .arg("slo-probe-held")
        .arg(program)
        .args(args);
    inject.apply(&mut cmd);
    // SAFETY: the hook only calls async-signal-safe functions (dup2, fcntl).
    unsafe {
        cmd.pre_exec(move || {
            // dup2 onto itself keeps FD_CLOEXEC, so clear it explicitly in that case.
            let rc = if read_fd == 3 {
                libc::fcntl(3, libc::F_SETFD, 0)
            } else {
                libc::dup2(read_fd, 3)
            };
            if rc < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn();
    // SAFETY: read_fd is ours and used nowhere else in the parent.
    unsafe { libc::close(read_fd) };
    // SAFETY: write_fd is ours; the File owns and closes it.
    let release = unsafe { std::fs::File::from_raw_fd(write_fd) };
    Ok((child.map_err(spawn_err)?, release))
}

/// Runs `command`, ticks the collector until `duration` has passed or the command ended, and
/// returns the final state. Progress goes to stderr once a second.
/// Follows the command for `duration` (or until it ends), ticking `collector` every second;
/// with `heal`, a shadow healer per GPU process decides at every tick (observe never acts).
pub fn run(
    collector: &mut Collector,
    command: &[String],
    duration: Duration,
    tick: Duration,
    inject: &Inject,
    heal: Option<&HealerConfig>,
) -> Result<Observation, ObserveError> {
    let mut healers: BTreeMap<u32, ShadowHealer> = BTreeMap::new();
    let mut decide = |s: &Snapshot| {
        let Some(config) = heal else { return };
        for p in &s.processes {
            healers
                .entry(p.pid)
                .or_insert_with(|| ShadowHealer::new(p.pid, config.clone()))
                .tick(p.clone(), s.taken_at_ns);
        }
    };
    let (mut child, mut release) = spawn_held(command, inject)?;
    let root = child.id();
    if let Err(e) = collector.add_root(root) {
        stop_child(&mut child);
        return Err(ObserveError::Track(e));
    }
    let _ = release.write_all(&[1]);
    drop(release);
    let start = Instant::now();
    let mut exit = None;
    let mut last_progress = Instant::now();
    let mut pids = BTreeSet::from([root]);
    loop {
        let remaining = duration.saturating_sub(start.elapsed());
        std::thread::sleep(remaining.min(tick).min(Duration::from_millis(200)));
        if let Ok(Some(status)) = child.try_wait() {
            exit = Some(status);
            break;
        }
        if start.elapsed() >= duration {
            break;
        }
        if last_progress.elapsed() >= Duration::from_secs(1) {
            last_progress = Instant::now();
            let s = collector.tick();
            decide(&s);
            if let Some(t) = &s.threads {
                pids.extend(t.processes.iter().map(|p| p.pid));
            }
            let waits: u64 = s
                .threads
                .iter()
                .flat_map(|t| &t.processes)
                .map(|p| p.counts.runq.count)
                .sum();
            eprintln!(
                "slo-probe: observing pid {root}: {:.0}/{:.0} s, {} processes, {waits} run-queue \
                 waits so far",
                start.elapsed().as_secs_f64(),
                duration.as_secs_f64(),
                pids.len()
            );
        }
    }
    // Read once more while the threads still exist (or just after they exited, so their final
    // entries are in), then stop the command if it is still running.
    if collector.shim().is_some() && exit.is_none() {
        // Give a shim that is still running one flush period to hand over its last records.
        std::thread::sleep(Duration::from_millis(300));
    }
    collector.finish_gpu();
    let snapshot = collector.tick();
    decide(&snapshot);
    collector.stop();
    if let Some(t) = &snapshot.threads {
        pids.extend(t.processes.iter().map(|p| p.pid));
    }
    let elapsed = start.elapsed();
    if exit.is_none() {
        stop_child(&mut child);
    }
    Ok(Observation {
        snapshot,
        pids,
        elapsed,
        exit,
        healers: healers.iter().map(|(p, h)| (*p, h.decided())).collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_child_runs_only_when_released() {
        let (mut child, mut release) = spawn_held(
            &["sh".into(), "-c".into(), "exit 7".into()],
            &Inject::default(),
        )
        .expect("spawn");
        std::thread::sleep(Duration::from_millis(200));
        assert!(
            child.try_wait().expect("try_wait").is_none(),
            "ran before release"
        );
        release.write_all(&[1]).expect("release");
        drop(release);
        assert_eq!(child.wait().expect("wait").code(), Some(7));
    }
}
