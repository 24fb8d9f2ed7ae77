//! Plain tier: the shim's transport without a GPU. The real `libslo_probe_cupti.so` is loaded
//! by a python process (ctypes, as the `slo_probe` package does) that marks steps; the agent's
//! shim source registers it, keeps its records when the agent restarts (the shim registers
//! again), counts what the shim dropped while no agent was listening, and survives the process
//! being killed in the middle of its writes.

use std::{
    path::PathBuf,
    process::{Child, Command},
    time::{Duration, Instant},
};

use slo_probe_core::snapshot::ProcessSnapshot;
use slo_probe_tests::Shims;

fn shim_library() -> PathBuf {
    slo_probe_tests::artefact("libslo_probe_cupti.so", "slo-probe-cupti")
}

/// A python process that loads the shim and marks `steps` steps, `gap_ms` apart.
fn marker_process(socket: &PathBuf, steps: u32, gap_ms: u32, ring_mb: u32) -> Child {
    let script = format!(
        "import ctypes, sys, time\n\
         lib = ctypes.PyDLL({lib:?})\n\
         lib.slo_probe_step_begin.argtypes = [ctypes.c_uint64]\n\
         lib.slo_probe_step_end.argtypes = [ctypes.c_uint64]\n\
         for i in range({steps}):\n\
         \x20   lib.slo_probe_step_begin(i); lib.slo_probe_step_end(i)\n\
         \x20   if {gap_ms}: time.sleep({gap_ms} / 1000)\n\
         time.sleep(30)\n",
        lib = shim_library().display().to_string(),
    );
    Command::new("python3")
        .args(["-c", &script])
        .env("SLO_PROBE_SOCKET", socket)
        .env("SLO_PROBE_RING_MB", ring_mb.to_string())
        .env_remove("CUDA_INJECTION64_PATH")
        .spawn()
        .expect("python3")
}

fn wait_for(
    src: &Shims,
    pid: u32,
    what: &str,
    ok: impl Fn(&ProcessSnapshot) -> bool,
) -> ProcessSnapshot {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let Some(p) = src.processes().into_iter().find(|p| p.pid == pid) {
            if ok(&p) {
                return p;
            }
            assert!(Instant::now() < deadline, "{what}: {p:?}");
        } else {
            assert!(
                Instant::now() < deadline,
                "{what}: pid {pid} never registered"
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn socket_path(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!(
        "slo-probe-test-{tag}-{}/shim.sock",
        std::process::id()
    ))
}

#[test]
fn registration_agent_restart_and_process_death() {
    let socket = socket_path("restart");
    let src = Shims::live(&socket).expect("listen");
    // 600 steps, 10 ms apart: about 6 s of markers.
    let mut child = marker_process(&socket, 600, 10, 16);
    let pid = child.id();
    let first = wait_for(&src, pid, "first agent gets steps", |p| p.seen[5] >= 100);
    eprintln!("first agent: {} step records", first.seen[5]);
    assert!(first.connected);

    // The agent goes away and comes back on the same socket: the shim registers again and the
    // new agent continues where the first stopped (the ring's tail is shared).
    drop(src);
    std::thread::sleep(Duration::from_millis(500));
    let src = Shims::live(&socket).expect("listen again");
    let second = wait_for(&src, pid, "second agent gets steps", |p| p.seen[5] >= 200);
    eprintln!("second agent: {} step records", second.seen[5]);
    let total = first.seen[5] + second.seen[5];
    assert!(total <= 1200, "records delivered twice: {total}");

    // Killed in the middle of its writes: the agent notices and keeps what it read.
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    let _ = child.wait();
    let gone = wait_for(&src, pid, "disconnect noticed", |p| !p.connected);
    assert!(gone.seen[5] >= second.seen[5]);
    assert_eq!(gone.corrupt_bytes, 0);
    assert_eq!(gone.decode_failed, 0);
}

#[test]
fn records_beyond_the_ring_are_dropped_and_counted() {
    let socket = socket_path("full");
    // No agent yet: 100,000 steps (200,000 records of 32 bytes) into a 1 MiB ring.
    let mut child = marker_process(&socket, 100_000, 0, 1);
    std::thread::sleep(Duration::from_secs(3));
    let src = Shims::live(&socket).expect("listen");
    let p = wait_for(&src, child.id(), "registered with drops", |p| {
        p.dropped > 0 && p.seen[5] > 0
    });
    eprintln!(
        "ring of 1 MiB: {} step records kept, {} dropped",
        p.seen[5], p.dropped
    );
    // Everything is accounted for: kept in the ring, or dropped (ring or queue full).
    assert!(p.seen[5] + p.dropped >= 150_000, "{p:?}");
    assert!(p.seen[5] <= (1 << 20) / 32, "{p:?}");
    let _ = child.kill();
    let _ = child.wait();
}

/// Root tier: a training process in its own pid namespace (a Kubernetes pod without hostPID)
/// says its own pid, 1; the agent matches it to the host's pid through `NSpid` and registers
/// it under the host's pid, the one the eBPF probes and /proc know.
#[test]
fn a_process_in_its_own_pid_namespace_registers_under_its_host_pid() {
    if !slo_probe_tests::root_or_skip("pid namespace registration") {
        return;
    }
    let socket = socket_path("pidns");
    let src = Shims::live(&socket).expect("listen");
    let script = format!(
        "import ctypes, os, time\n\
         assert os.getpid() == 1, os.getpid()\n\
         lib = ctypes.PyDLL({lib:?})\n\
         lib.slo_probe_step_begin.argtypes = [ctypes.c_uint64]\n\
         lib.slo_probe_step_end.argtypes = [ctypes.c_uint64]\n\
         for i in range(50):\n\
         \x20   lib.slo_probe_step_begin(i); lib.slo_probe_step_end(i); time.sleep(0.01)\n\
         time.sleep(30)\n",
        lib = shim_library().display().to_string(),
    );
    let mut child = Command::new("unshare")
        .args(["--pid", "--fork", "--kill-child", "python3", "-c", &script])
        .env("SLO_PROBE_SOCKET", &socket)
        .env_remove("CUDA_INJECTION64_PATH")
        .spawn()
        .expect("unshare");
    // unshare forks python3: the registered pid is that child's, on the host.
    let deadline = Instant::now() + Duration::from_secs(15);
    let p = loop {
        if let Some(p) = src.processes().into_iter().find(|p| p.seen[5] >= 20) {
            break p;
        }
        assert!(
            Instant::now() < deadline,
            "the namespaced shim never registered"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let status = std::fs::read_to_string(format!("/proc/{}/status", p.pid)).expect("status");
    let nspid = status
        .lines()
        .find(|l| l.starts_with("NSpid:"))
        .expect("NSpid")
        .to_owned();
    let ppid: u32 = status
        .lines()
        .find_map(|l| l.strip_prefix("PPid:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("PPid");
    let _ = child.kill();
    let _ = child.wait();
    eprintln!("registered pid {} ({nspid}), parent {ppid}", p.pid);
    assert_eq!(
        ppid,
        child.id(),
        "the registered pid is unshare's child on the host"
    );
    assert!(nspid.trim_end().ends_with("\t1"), "{nspid}");
}
