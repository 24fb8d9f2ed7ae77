//! The depth control loop end to end without a GPU: a child process (this test binary again)
//! runs the shim against a fake libcupti (`tests/fake_cupti.c`, built here with the C
//! compiler), marks 130 steps of ~4 ms with kernel and graph launches, asks for depth from the
//! script, is asked by "the agent" (this test, through the ring's control word), and hands
//! CUPTI over and back. This test plays the agent: it takes the shim's registration on a Unix
//! socket, maps its ring, and checks the depth records, the steps each sample window covered,
//! the CUPTI calls in their order, and the self-accounting counters in the header.
//!
//! Skips (saying so) where no C compiler is found; needs nothing else.

use std::{
    io::Read,
    os::{
        fd::{AsRawFd, FromRawFd, OwnedFd},
        unix::net::{UnixListener, UnixStream},
    },
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::atomic::Ordering,
    time::{Duration, Instant},
};

use slo_probe_common::{
    decode,
    gpu::{
        encode_launch, DEPTH_KERNELS, DEPTH_NODES, DEPTH_OFF, DEPTH_REASON_AGENT,
        DEPTH_REASON_DEFAULT, DEPTH_REASON_RELEASED, DEPTH_REASON_SAMPLE, DEPTH_REASON_SCRIPT,
        DEPTH_TIMING, STEP_END,
    },
    ring::{
        decode_shim_depth, encode_depth_request, DepthDuration, Ring, ShimHello,
        STATUS_NO_GRAPH_NODES,
    },
    AnyRecord,
};

const STEPS: u64 = 130;
const STEP_MS: u64 = 4;
/// See [`cuda_graph_launches_pin_kernel_tracing`].
const GRAPHS_FROM: u64 = 40;
const CHILD: &str = "SLO_PROBE_FAKE_CUPTI_CHILD";

fn fake_fn<T>(name: &std::ffi::CStr) -> T {
    // SAFETY: the fake libcupti the shim loaded; the symbol has the type the caller names.
    unsafe {
        let h = libc::dlopen(
            c"libcupti.so.13".as_ptr(),
            libc::RTLD_NOW | libc::RTLD_NOLOAD,
        );
        assert!(!h.is_null(), "the fake libcupti is not loaded");
        let p = libc::dlsym(h, name.as_ptr());
        assert!(!p.is_null(), "{name:?} missing");
        std::mem::transmute_copy::<*mut libc::c_void, T>(&p)
    }
}

/// The training process: runs only as the child of `depth_control_loop_against_a_fake_cupti`.
#[test]
fn child_process() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    use slo_probe_cupti::*;
    assert_eq!(InitializeInjection(), 1);
    let launch: extern "C" fn(u32, u32, u32) -> i32 = fake_fn(c"fake_launch");
    let capture: extern "C" fn(u32, u64, u32, u32) -> i32 = fake_fn(c"fake_capture");
    let mut captured = 0;
    let log: extern "C" fn() -> *const libc::c_char = fake_fn(c"fake_log");
    let mut corr = 1u32;
    let mut delivered = 0;
    // The "graphs" child launches its CUDA graph only from step GRAPHS_FROM on.
    let graphs_from = match std::env::var(CHILD).as_deref() {
        Ok("graphs") => GRAPHS_FROM,
        _ => 0,
    };
    // The "sync" child synchronises every 4 steps.
    let sync_every = match std::env::var(CHILD).as_deref() {
        Ok("sync") => 4,
        _ => 0,
    };
    let t0 = std::time::Instant::now();
    for step in 0..STEPS {
        slo_probe_step_begin(step);
        for (domain, cbid, n) in [(2, 211, 20), (1, 307, 5), (2, 311, 1)] {
            let n = if cbid == 311 && step < graphs_from {
                0
            } else {
                n
            };
            for _ in 0..n {
                delivered += launch(domain, cbid, corr);
                corr += 1;
            }
        }
        if graphs_from > 0 && (60..64).contains(&step) {
            // torch recapturing a graph: a kernel of 264 blocks of 32 threads, then 528 of 64.
            captured += capture(corr, 1000 + step, 264 << (step - 60), 32 << (step - 60));
            corr += 1;
        }
        std::thread::sleep(Duration::from_millis(STEP_MS));
        if sync_every > 0 && step % sync_every == 0 {
            // cuStreamSynchronize: its exit is a drained moment.
            launch(1, 126, corr);
            corr += 1;
        }
        slo_probe_step_end(step);
        match step {
            54 => assert_eq!(slo_probe_request_depth(2, 5), 0),
            56 => assert_eq!(slo_probe_request_depth(7, 5), -1),
            110 => assert_eq!(slo_probe_cupti_release(), 0),
            112 => assert_eq!(slo_probe_cupti_reacquire(), 0),
            _ => {}
        }
    }
    let loop_ms = t0.elapsed().as_millis();
    std::thread::sleep(Duration::from_millis(200));
    slo_probe_flush();
    // SAFETY: the fake's NUL-terminated log.
    let calls = unsafe { std::ffi::CStr::from_ptr(log()) }.to_string_lossy();
    println!("FAKE:depth {}", slo_probe_depth());
    println!("FAKE:loop_ms {loop_ms}");
    println!("FAKE:delivered {delivered}");
    println!("FAKE:captured {captured}");
    println!("FAKE:calls {calls}");
    std::thread::sleep(Duration::from_millis(100));
}

/// A fresh directory with the fake libcupti and, with `driver`, an empty `libcuda.so.1` (the
/// shim calls libcupti only where a CUDA driver is there).
fn fake_libs(cc: &str, name: &str, driver: bool) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "slo-probe-fake-cupti-{name}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let cupti = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fake_cupti.c");
    let cuda = dir.join("fake_cuda.c");
    std::fs::write(&cuda, "int fake_cuda_driver(void) { return 1; }\n").expect("write");
    let libs: &[(&str, &PathBuf)] = if driver {
        &[("libcupti.so.13", &cupti), ("libcuda.so.1", &cuda)]
    } else {
        &[("libcupti.so.13", &cupti)]
    };
    for (soname, src) in libs {
        let st = Command::new(cc)
            .args(["-shared", "-fPIC", "-O1"])
            .arg(format!("-Wl,-soname,{soname}"))
            .arg("-o")
            .arg(dir.join(soname))
            .arg(src)
            .arg("-lpthread")
            .status()
            .expect("cc");
        assert!(st.success(), "building the fake {soname} failed");
    }
    dir
}

/// The training process of `no_cupti_call_without_a_cuda_driver`: libcupti loaded (as a CUDA
/// build of PyTorch loads it), no CUDA driver, the shim loaded for step markers only (the
/// python client's way: no `InitializeInjection`).
#[test]
fn child_without_a_driver() {
    if std::env::var_os(CHILD).is_none_or(|v| v != "no-driver") {
        return;
    }
    // SAFETY: a NUL-terminated name; the fake library has no initialiser with preconditions.
    let h = unsafe { libc::dlopen(c"libcupti.so.13".as_ptr(), libc::RTLD_NOW) };
    assert!(!h.is_null(), "the fake libcupti did not load");
    let log: extern "C" fn() -> *const libc::c_char = fake_fn(c"fake_log");
    for step in 0..20 {
        slo_probe_cupti::slo_probe_step_begin(step);
        std::thread::sleep(Duration::from_millis(2));
        slo_probe_cupti::slo_probe_step_end(step);
    }
    slo_probe_cupti::slo_probe_flush();
    std::thread::sleep(Duration::from_millis(200));
    // SAFETY: the fake's NUL-terminated log.
    let calls = unsafe { std::ffi::CStr::from_ptr(log()) }.to_string_lossy();
    println!("FAKE:calls [{calls}]");
}

/// Where no CUDA driver can be loaded the shim calls nothing in libcupti (CUPTI 13 overflows
/// the stack in cuptiGetVersion there: the training process died of SIGSEGV) and the step
/// markers still reach the agent.
#[test]
fn no_cupti_call_without_a_cuda_driver() {
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    // SAFETY: a NUL-terminated name.
    if !unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_LAZY) }.is_null() {
        eprintln!("skipped: this machine has a CUDA driver");
        return;
    }
    let Some(cc) = compiler() else {
        eprintln!("skipped: no C compiler to build the fake libcupti");
        return;
    };
    let dir = fake_libs(&cc, "no-driver", false);
    let socket = dir.join("shim.sock");
    let listener = UnixListener::bind(&socket).expect("bind");
    listener.set_nonblocking(true).expect("nonblocking");
    let child = Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            "child_without_a_driver",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "no-driver")
        .env("LD_LIBRARY_PATH", &dir)
        .env("SLO_PROBE_SOCKET", &socket)
        .env("SLO_PROBE_SHIM_LOG", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("child");
    let deadline = Instant::now() + Duration::from_secs(30);
    let (_stream, ring) = registered_ring(&listener, deadline);
    let out = child.wait_with_output().expect("child");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success(),
        "child failed: {:?}\n{stdout}\n{stderr}",
        out.status
    );
    assert!(
        stdout.contains("FAKE:calls []"),
        "libcupti was called:\n{stdout}"
    );
    assert!(stderr.contains("no CUDA driver"), "{stderr}");
    let mut buf = vec![0u8; 1 << 16];
    let mut ends = 0;
    ring.drain(&mut buf, |r| {
        if let Ok((AnyRecord::Step(s), _)) = decode(r) {
            ends += u32::from(s.phase == STEP_END);
        }
    });
    assert_eq!(ends, 20, "step ends in the ring");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Plays the agent's side of a registration: the shim's connection on `listener` (before
/// `deadline`), its hello, and its ring mapped (for the rest of the test). The connection is
/// returned so that it stays open.
fn registered_ring(listener: &UnixListener, deadline: Instant) -> (UnixStream, Ring) {
    let stream = loop {
        match listener.accept() {
            Ok((s, _)) => break s,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                assert!(Instant::now() < deadline, "the shim never registered");
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => panic!("accept: {e}"),
        }
    };
    stream.set_nonblocking(false).expect("blocking");
    let (hello, fd) = recv_with_fd(&stream);
    let hello = ShimHello::from_bytes(&hello).expect("a hello of this ring version");
    let len = hello.ring_len as usize;
    // SAFETY: the shim's memfd, `len` bytes long.
    let base = unsafe { slo_probe_common::host::map_shared(fd.as_raw_fd(), len) }.expect("mmap");
    // SAFETY: mapped for the rest of the test (never unmapped).
    let ring = unsafe { Ring::open(base.as_ptr(), len) }.expect("ring");
    (stream, ring)
}

fn compiler() -> Option<String> {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    for c in [cc.as_str(), "cc", "gcc", "clang"] {
        if Command::new(c)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
        {
            return Some(c.to_owned());
        }
    }
    None
}

fn recv_with_fd(s: &UnixStream) -> (Vec<u8>, OwnedFd) {
    let mut data = vec![0u8; 64];
    let mut iov = libc::iovec {
        iov_base: data.as_mut_ptr().cast(),
        iov_len: data.len(),
    };
    // SAFETY: pure computation.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<i32>() as u32) } as usize;
    let mut control = vec![0u8; space];
    // SAFETY: zeroed msghdr is valid; buffers outlive recvmsg.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: valid socket and message.
    let n = unsafe { libc::recvmsg(s.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    assert!(n > 0, "recvmsg: {}", std::io::Error::last_os_error());
    data.truncate(n as usize);
    // SAFETY: walking the control buffer recvmsg filled.
    let fd = unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        assert!(!cmsg.is_null(), "no fd attached");
        std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<i32>())
    };
    // SAFETY: a descriptor the kernel just installed for us.
    (data, unsafe { OwnedFd::from_raw_fd(fd) })
}

#[derive(Debug, Clone, Copy)]
struct Depth {
    from_ns: u64,
    depth: u32,
    reason: u32,
}

/// Builds the fake libraries in a fresh directory named after `name`, listens on its shim
/// socket and starts the child (`variant` in [`CHILD`]) against them, with the settings both
/// depth tests share and `envs`, its stdout piped. `None` (said) where no C compiler is found.
fn spawn_child(
    name: &str,
    variant: &str,
    envs: &[(&str, &str)],
) -> Option<(PathBuf, UnixListener, Child)> {
    let Some(cc) = compiler() else {
        eprintln!("skipped: no C compiler to build the fake libcupti");
        return None;
    };
    let dir = fake_libs(&cc, name, true);
    let socket = dir.join("shim.sock");
    let _ = std::fs::remove_file(&socket);
    let listener = UnixListener::bind(&socket).expect("bind");
    listener.set_nonblocking(true).expect("nonblocking");
    let mut cmd = Command::new(std::env::current_exe().expect("test binary"));
    cmd.args([
        "--exact",
        "child_process",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(CHILD, variant)
    .env("LD_LIBRARY_PATH", &dir)
    .env("SLO_PROBE_SOCKET", &socket)
    .env("SLO_PROBE_FLUSH_MS", "20")
    .env("SLO_PROBE_RING_MB", "4")
    // The fake delivers no kernel record: windows close on their steps, not held open for a
    // lag they never measure (the hold is the planner's unit tests').
    .env("SLO_PROBE_HOLD_LAG_MS", "0")
    .env_remove("SLO_PROBE_GRAPH_FLOOR")
    .env_remove("SLO_PROBE_GRAPH_NODES")
    .env_remove("SLO_PROBE_CAPTURE_LAUNCH")
    .env_remove("SLO_PROBE_DEPTH")
    .env_remove("SLO_PROBE_DIAGNOSTIC")
    .stdout(Stdio::piped());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let child = cmd.spawn().expect("child");
    Some((dir, listener, child))
}

/// Plays the agent until `child` exits: takes its registration on `listener`, and drains its
/// ring, calling `tick` with the ring and the step ends so far after each drain. Returns the
/// connection (open), the ring, the depth records and the step ends (step, time).
/// What [`drain_child`] read: the connection, the ring, depth records, step ends (step, ns),
/// graph nodes (node id, launch configuration).
type Drained = (
    UnixStream,
    Ring,
    Vec<Depth>,
    Vec<(u64, u64)>,
    Vec<(u64, u32)>,
);

fn drain_child(
    child: &mut Child,
    listener: &UnixListener,
    mut tick: impl FnMut(&Ring, usize),
) -> Drained {
    let deadline = Instant::now() + Duration::from_secs(30);
    let (stream, ring) = registered_ring(listener, deadline);
    let mut buf = vec![0u8; 1 << 16];
    let (mut depths, mut ends) = (Vec::<Depth>::new(), Vec::<(u64, u64)>::new());
    let mut nodes = Vec::new();
    loop {
        let exited = child.try_wait().expect("wait").is_some();
        ring.drain(&mut buf, |r| match decode(r) {
            Ok((AnyRecord::Depth(d), _)) => depths.push(Depth {
                from_ns: d.from_ns,
                depth: d.depth,
                reason: d.reason,
            }),
            Ok((AnyRecord::Step(s), _)) if s.phase == STEP_END => ends.push((s.step, s.ts_ns)),
            Ok((AnyRecord::GraphNode(n), _)) => nodes.push((n.node_id, n.launch)),
            _ => {}
        });
        tick(&ring, ends.len());
        if exited {
            return (stream, ring, depths, ends, nodes);
        }
        assert!(Instant::now() < deadline, "the child did not finish");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The child's output, once it has exited successfully.
fn child_output(child: &mut Child) -> String {
    let mut out = String::new();
    child
        .stdout
        .take()
        .expect("stdout")
        .read_to_string(&mut out)
        .expect("child output");
    assert!(
        child.wait().expect("wait").success(),
        "child failed:\n{out}"
    );
    out
}

/// What the child printed after `FAKE:<key> `.
fn fake_line(out: &str, key: &str) -> String {
    // The test harness may have printed on the same line before.
    let tag = format!("FAKE:{key} ");
    out.lines()
        .find_map(|l| l.find(&tag).map(|i| &l[i + tag.len()..]))
        .unwrap_or_else(|| panic!("no {key} in:\n{out}"))
        .to_owned()
}

#[test]
fn depth_control_loop_against_a_fake_cupti() {
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    let Some((dir, listener, mut child)) = spawn_child(
        "depth",
        "1",
        &[
            ("SLO_PROBE_SAMPLE_EVERY", "30"),
            ("SLO_PROBE_SAMPLE_STEPS", "3"),
            // The child launches a graph every step: without this, kernel tracing is pinned on
            // from the first (see `cuda_graph_launches_pin_kernel_tracing`) and no window opens.
            ("SLO_PROBE_GRAPH_FLOOR", "0"),
            // Nor would the script's request for node level be given (see
            // `cuda_graph_launches_pin_kernel_tracing`).
            ("SLO_PROBE_GRAPH_NODES", "1"),
        ],
    ) else {
        return;
    };
    let mut asked = false;
    let (_stream, ring, depths, ends, _) = drain_child(&mut child, &listener, |ring, ends| {
        if !asked && ends >= 80 {
            // The agent asks for kernels during 4 steps.
            ring.header().control.store(
                encode_depth_request(1, DEPTH_KERNELS, DepthDuration::Steps(4)),
                Ordering::Release,
            );
            asked = true;
        }
    });
    let step_ends: Vec<u64> = ends.iter().map(|&(_, t)| t).collect();
    let out = child_output(&mut child);
    let line = |key: &str| fake_line(&out, key);
    let calls = line("calls");
    let seq: Vec<(u32, u32)> = depths.iter().map(|d| (d.depth, d.reason)).collect();
    eprintln!("depth records: {seq:?}");

    // Tracing starts at depth 0 with graph-level, memcpy and memset activity and no kernels.
    assert_eq!(seq[0], (DEPTH_TIMING, DEPTH_REASON_DEFAULT));
    let start = calls.find("enable 51;").expect("GRAPH_TRACE enabled");
    assert!(!calls[..start].contains("enable 10;"), "{calls}");
    // CUPTI's worker flushes every 250 ms, set before any activity is enabled: without it no
    // kernel buffer came back while the job ran on the H200.
    let period = calls.find("flush period 250;").expect("flush period set");
    assert!(period < start, "{calls}");
    assert!(
        !calls[..start].contains("cb+ 2:211"),
        "kernel callbacks before a window: {calls}"
    );
    // The runtime copies and fills are traced from the start, for their operator.
    assert!(
        calls[..start].contains("cb+ 2:41;") && calls[..start].contains("cb+ 2:51;"),
        "copy callbacks: {calls}"
    );
    // Every sample window covered 3 complete steps + the one running when it opened (4 step
    // ends), then stayed open MIN_DRAIN_NS (25 ms, ~6 steps of ~4 ms) so that the agent counts
    // its steps as traced: about 10 step ends (8 to 13 on a loaded machine, whose sleeps and
    // flusher wake-ups run late).
    let windows: Vec<(u64, u64)> = depths
        .windows(2)
        .filter(|w| (w[0].depth, w[0].reason) == (DEPTH_KERNELS, DEPTH_REASON_SAMPLE))
        .map(|w| (w[0].from_ns, w[1].from_ns))
        .collect();
    assert!(windows.len() >= 3, "{seq:?}");
    let covered: Vec<usize> = windows
        .iter()
        .map(|(from, to)| step_ends.iter().filter(|&&t| t > *from && t <= *to).count())
        .collect();
    eprintln!("step ends per window: {covered:?}");
    assert!(
        covered.iter().all(|&n| (8..=13).contains(&n)),
        "{covered:?}"
    );
    // The first window opened after step 10 (its 10th step end), the next 30 steps later.
    let first_end = |from: u64| step_ends.iter().filter(|&&t| t <= from).count();
    assert_eq!(first_end(windows[0].0), 10);
    assert_eq!(first_end(windows[1].0), 40);
    // The script's and the agent's requests, and the hand-over.
    assert!(seq.contains(&(DEPTH_NODES, DEPTH_REASON_SCRIPT)), "{seq:?}");
    assert!(
        seq.contains(&(DEPTH_KERNELS, DEPTH_REASON_AGENT)),
        "{seq:?}"
    );
    let off = seq
        .iter()
        .position(|&d| d == (DEPTH_OFF, DEPTH_REASON_RELEASED))
        .expect("released");
    assert_eq!(seq[off + 1], (DEPTH_TIMING, DEPTH_REASON_DEFAULT));
    // CUPTI calls in order: callbacks before kernel activity, a flush before it goes off.
    let on = calls.find("enable 10;").expect("kernels on");
    assert!(calls[..on].contains("cb+ 2:211;") && calls[..on].contains("cb+ 1:307;"));
    let off_at = calls.find("disable 10;").expect("kernels off");
    assert!(calls[..off_at].ends_with("flush;"), "{}", &calls[..off_at]);
    // ... and no forced one once it is off unless asked for (SLO_PROBE_FORCED_FLUSH=1): on
    // CUDA 13 it corrupts the correlation ids of later kernel records.
    // (Releasing CUPTI flushes forced: nothing is traced after it.)
    let release = calls.find("disable 51;").unwrap_or(calls.len());
    assert!(!calls[..release].contains("flush forced;"), "{calls}");
    assert!(calls.contains("disable 51;") && calls.contains("unsubscribe;"));
    // What the shim published.
    let h = ring.header();
    let c = h.shim_counters();
    assert_eq!(h.control_ack.load(Ordering::Relaxed), 1);
    assert_eq!(c.steps_seen, STEPS);
    assert!(c.sampled_steps >= 3 * 4, "{c:?}");
    assert!(c.launches_seen > STEPS && c.callback_ns > 0, "{c:?}");
    assert!(h.depth_changes.load(Ordering::Relaxed) >= 10);
    let d = decode_shim_depth(line("depth").parse().expect("depth word"));
    // (The window due at step 130 may have opened as the loop ended.)
    assert!(d.depth == DEPTH_TIMING || d.depth == DEPTH_KERNELS, "{d:?}");
    assert_eq!((d.window, d.period, d.millis), (3, 30, false));
    // Kernel launches reached the shim only while kernels were traced.
    let delivered: u64 = line("delivered").parse().expect("count");
    assert!(
        delivered < STEPS * 26 / 2,
        "{delivered} of {} delivered",
        STEPS * 26
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A job that launches its first CUDA graph at step 40 (the fake's graph-launch callback):
/// sample windows come and go before it; from it on, kernel tracing stays on (depth 1, reason
/// sample) until CUPTI is handed over at step 110; the script's depth-2 request gets depth 1;
/// kernel launches captured into a graph give their nodes their launch configuration (by
/// default: `SLO_PROBE_CAPTURE_LAUNCH` is unset here).
#[test]
fn cuda_graph_launches_pin_kernel_tracing() {
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    let Some((dir, listener, mut child)) = spawn_child(
        "graphs",
        "graphs",
        &[
            ("SLO_PROBE_SAMPLE_EVERY", "10"),
            ("SLO_PROBE_SAMPLE_STEPS", "2"),
        ],
    ) else {
        return;
    };
    let (_stream, ring, depths, ends, nodes) = drain_child(&mut child, &listener, |_, _| {});
    assert!(child.wait().expect("wait").success(), "child failed");
    // The kernel launches captured at steps 60-63 (kernel tracing pinned on): each node carries
    // its launch's configuration, read from the launch callback's parameters.
    let want: Vec<(u64, u32)> = (0..4)
        .map(|i| {
            let launch = encode_launch([264 << i, 1, 1], [32 << i, 1, 1]);
            (1060 + i, launch)
        })
        .collect();
    assert_eq!(nodes, want);
    // The status says it, so that the agent does not ask for node level.
    assert_ne!(
        ring.header().status.load(Ordering::Relaxed) & STATUS_NO_GRAPH_NODES,
        0
    );
    let end_of = |step: u64| {
        ends.iter()
            .find(|&&(s, _)| s == step)
            .map(|&(_, t)| t)
            .unwrap_or_else(|| panic!("no end of step {step}"))
    };
    let seq: Vec<(u32, u32)> = depths.iter().map(|d| (d.depth, d.reason)).collect();
    eprintln!("depth records: {seq:?}");
    let (graphs, released) = (end_of(GRAPHS_FROM), end_of(109));
    let before: Vec<&Depth> = depths.iter().filter(|d| d.from_ns < graphs).collect();
    assert!(
        before
            .windows(2)
            .any(|w| w[0].depth == DEPTH_KERNELS && w[1].depth == DEPTH_TIMING),
        "no window closed before the first graph: {seq:?}"
    );
    // A few steps for the flusher to see the first graph launch, then never back to timing
    // until the hand-over.
    let pinned_from = end_of(GRAPHS_FROM + 5);
    let during: Vec<(u32, u32)> = depths
        .iter()
        .filter(|d| d.from_ns > pinned_from && d.from_ns < released)
        .map(|d| (d.depth, d.reason))
        .collect();
    assert!(
        during.iter().all(|&(d, _)| d != DEPTH_TIMING),
        "switched to timing under graphs: {seq:?}"
    );
    // The script's request for node level (step 54) gets kernel level under graphs: leaving
    // node level under them crashed a job in graph replay (`Config::graph_nodes`).
    assert!(
        during.iter().all(|&(d, _)| d != DEPTH_NODES),
        "node level switched under graphs: {seq:?}"
    );
    assert!(
        during.contains(&(DEPTH_KERNELS, DEPTH_REASON_SCRIPT))
            && during.contains(&(DEPTH_KERNELS, DEPTH_REASON_SAMPLE)),
        "{seq:?}"
    );
    // Tracing taken back: pinned again.
    assert_eq!(
        seq.last(),
        Some(&(DEPTH_KERNELS, DEPTH_REASON_SAMPLE)),
        "{seq:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs the child `variant` with sample windows every 30 steps (3 steps long, no graph floor)
/// and `extra`: its output, once it exited; `None` where no C compiler builds the fake.
fn windowed_child(name: &str, variant: &str, extra: &[(&str, &str)]) -> Option<String> {
    let mut envs = vec![
        ("SLO_PROBE_SAMPLE_EVERY", "30"),
        ("SLO_PROBE_SAMPLE_STEPS", "3"),
        ("SLO_PROBE_GRAPH_FLOOR", "0"),
    ];
    envs.extend_from_slice(extra);
    let (dir, listener, mut child) = spawn_child(name, variant, &envs)?;
    let _ = drain_child(&mut child, &listener, |_, _| {});
    let out = child_output(&mut child);
    let _ = std::fs::remove_dir_all(&dir);
    Some(out)
}

/// The child's steps (130 of 4 ms) never waited for the flusher: a release at step 110 once
/// waited 3 s for the lock the flusher held while it waited for a drained moment.
fn assert_steps_did_not_wait(out: &str) {
    let loop_ms: u64 = fake_line(out, "loop_ms").parse().expect("loop_ms");
    assert!(loop_ms < 3_000, "the steps took {loop_ms} ms");
}

/// `SLO_PROBE_MEM_ACTIVITY=window`: memcpy and memset activity go on right after kernel
/// activity and off right before it, never at the start.
#[test]
fn memory_activity_can_follow_the_kernel_windows() {
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    let Some(out) = windowed_child("mem-window", "1", &[("SLO_PROBE_MEM_ACTIVITY", "window")])
    else {
        return;
    };
    let calls = fake_line(&out, "calls");
    let start = calls.find("enable 51;").expect("GRAPH_TRACE enabled");
    let first_kernels = calls.find("enable 10;").expect("kernels on");
    assert!(!calls[..first_kernels].contains("enable 1;"), "{calls}");
    assert!(start < first_kernels, "{calls}");
    let ons = calls.matches("enable 10;enable 1;enable 2;").count();
    let offs = calls.matches("disable 1;disable 2;disable 10;").count();
    assert!(ons >= 3 && offs >= 3, "{ons} on, {offs} off: {calls}");
    assert_eq!(calls.matches("enable 10;").count(), ons, "{calls}");
}

/// `SLO_PROBE_TOGGLE_AT_SYNC=inline`: kernel and memory activity are switched inside the exit
/// callback of a synchronising call (the job's thread, which goes on), never by the flusher,
/// and only then; the flusher flushes. The shim's callback once looked only at the park's flag,
/// so no inline switch ran (H100, 2026-12-06, call 10).
#[test]
fn kernel_activity_switches_inside_synchronising_calls() {
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    let extra = [
        ("SLO_PROBE_HOLD_AT_START", "0"),
        ("SLO_PROBE_MEM_ACTIVITY", "window"),
        ("SLO_PROBE_TOGGLE_AT_SYNC", "inline"),
    ];
    let Some(out) = windowed_child("inline-sync", "sync", &extra) else {
        return;
    };
    assert_steps_did_not_wait(&out);
    let all = fake_line(&out, "calls");
    // Up to step 110's release (its forced flush, then everything off: CUPTI handed over from
    // the script's thread).
    let calls = &all[..all.find("flush forced;").expect("released")];
    // The flusher's own log lines may come between the three calls of one switch.
    let ons = calls.matches("enable 10 in cb;").count();
    let offs = calls.matches("disable 10 in cb;").count();
    assert!(ons >= 2 && offs >= 2, "{ons} on, {offs} off: {calls}");
    for kind in [1, 2] {
        let n = |what: &str| calls.matches(&format!("{what} {kind} in cb;")).count();
        assert_eq!((n("enable"), n("disable")), (ons, offs), "{calls}");
    }
    // Kernel activity never switched outside a synchronising call.
    assert_eq!(calls.matches("enable 10").count(), ons, "{calls}");
    assert_eq!(calls.matches("disable 10").count(), offs, "{calls}");
}

/// `SLO_PROBE_TOGGLE_AT_SYNC=1` (the park): the release at step 110 does not wait for a flusher
/// that waits, under the lock, for a thread to park.
#[test]
fn a_release_does_not_wait_for_a_drained_moment() {
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    let extra = [
        ("SLO_PROBE_HOLD_AT_START", "0"),
        ("SLO_PROBE_TOGGLE_AT_SYNC", "1"),
    ];
    let Some(out) = windowed_child("park-sync", "sync", &extra) else {
        return;
    };
    assert_steps_did_not_wait(&out);
    assert!(fake_line(&out, "calls").contains("enable 10;"), "{out}");
}

/// `SLO_PROBE_CAPTURE_LAUNCH=0`: the same graph job's nodes carry no launch configuration.
#[test]
fn capture_time_launch_configurations_can_be_turned_off() {
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    let Some((dir, listener, mut child)) = spawn_child(
        "graphs-no-launch",
        "graphs",
        &[("SLO_PROBE_CAPTURE_LAUNCH", "0")],
    ) else {
        return;
    };
    let (_stream, _ring, _depths, _ends, nodes) = drain_child(&mut child, &listener, |_, _| {});
    assert!(child.wait().expect("wait").success(), "child failed");
    let want: Vec<(u64, u32)> = (0..4).map(|i| (1060 + i, 0)).collect();
    assert_eq!(nodes, want);
    let _ = std::fs::remove_dir_all(&dir);
}
