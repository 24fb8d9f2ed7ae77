//! A real CPU workload shaped like a data-parallel training step, for machines without a GPU.
//!
//! Processes and threads (named as `top -H` and the probes see them), shaped like a PyTorch DDP
//! rank with DataLoader workers:
//! - `loader-N` worker processes (this binary re-run with `--loader-worker N`): produce batches
//!   (pseudo-random fill, blur passes as augmentation, normalisation) and write them to a pipe,
//!   like DataLoader worker processes;
//! - `pin-memory`: reads the workers' pipes in turn and hands batches to the training loop
//!   through a bounded queue, like PyTorch's pin-memory thread;
//! - `train-main`: each step takes a batch, runs a forward and a backward matrix product, hands
//!   the gradient to `comm-allreduce` and waits for the reduced gradient (the step boundary);
//! - `comm-allreduce`: sends each gradient over loopback TCP to `comm-peer` and returns the
//!   reply, like a communication thread doing an all-reduce with another rank;
//! - `comm-peer`: the other "rank": averages the gradient with its own and sends it back;
//! - `metrics-log`: wakes every 10 ms to record step times, like a logging thread.
//!
//! With the defaults it keeps more threads runnable than a 2-core machine has cores, so the
//! threads wait on run queues for real. Prints step-time statistics at the end.
//!
//! For the healing tests: `--work N` makes each step N forward/backward pairs (a fixed amount of
//! CPU work), `--pin-main CPU` pins `train-main` to a CPU (as a launcher pinning a rank would),
//! `--print-steps` prints `step <i> <end CLOCK_MONOTONIC ns> <duration ns>` per step, and with
//! `SLO_PROBE_SHIM` naming `libslo_probe_cupti.so` each step is marked through the shim
//! (`slo_probe_step_begin/end`), as the python client does, so that the agent sees iterations
//! without a GPU.

use std::{
    io::{Read, Write},
    net::{TcpListener, TcpStream},
    process::{ChildStdout, Command, Stdio},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        mpsc, Arc,
    },
    thread,
    time::{Duration, Instant},
};

const DIM: usize = 96;

struct Args {
    duration: Duration,
    loaders: usize,
    augment: usize,
    work: usize,
    pin_main: Option<usize>,
    print_steps: bool,
    /// Set in the worker processes: which worker this is.
    loader_worker: Option<usize>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        duration: Duration::from_secs(10),
        loaders: 3,
        augment: 128,
        work: 1,
        pin_main: None,
        print_steps: false,
        loader_worker: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .ok_or_else(|| format!("{name} needs a value"))
                .and_then(|v| v.parse::<f64>().map_err(|e| format!("{name} {v}: {e}")))
        };
        match a.as_str() {
            "--duration" => args.duration = Duration::from_secs_f64(value("--duration")?),
            "--loaders" => args.loaders = value("--loaders")? as usize,
            "--augment" => args.augment = value("--augment")? as usize,
            "--loader-worker" => args.loader_worker = Some(value("--loader-worker")? as usize),
            "--work" => args.work = (value("--work")? as usize).max(1),
            "--pin-main" => args.pin_main = Some(value("--pin-main")? as usize),
            "--print-steps" => args.print_steps = true,
            "-h" | "--help" => {
                println!(
                    "usage: slo-probe-workload [--duration SECS (10)] [--loaders N (3)] \
                     [--augment PASSES (128)] [--work PAIRS (1)] [--pin-main CPU] \
                     [--print-steps]\n\
                     A training-shaped CPU workload: loader worker processes, a pin-memory \
                     thread, a compute loop, a \
                     loopback gradient exchange."
                );
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other}; see --help")),
        }
    }
    Ok(args)
}

/// Names the calling thread for the kernel (`comm`), where std's thread names do not reach
/// (the main thread of a process).
fn name_this_thread(name: &str) {
    let _ = std::fs::write("/proc/thread-self/comm", name);
}

fn spawn<T: Send + 'static>(
    name: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> thread::JoinHandle<T> {
    let owned = name.to_owned();
    thread::Builder::new()
        .name(owned)
        .spawn(f)
        .unwrap_or_else(|e| panic!("cannot spawn thread {name}: {e}"))
}

/// xorshift64*, seeded per loader.
struct Rng(u64);

impl Rng {
    fn next_f32(&mut self) -> f32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    }
}

/// A batch: random fill, `passes` of a 3x3 blur (the "augmentation", the CPU cost of a loader),
/// then normalisation.
fn make_batch(rng: &mut Rng, passes: usize) -> Vec<f32> {
    let mut b: Vec<f32> = (0..DIM * DIM).map(|_| rng.next_f32()).collect();
    let mut tmp = vec![0f32; DIM * DIM];
    for _ in 0..passes {
        for y in 1..DIM - 1 {
            for x in 1..DIM - 1 {
                let mut acc = 0.0;
                for dy in 0..3 {
                    for dx in 0..3 {
                        acc += b[(y + dy - 1) * DIM + x + dx - 1];
                    }
                }
                tmp[y * DIM + x] = acc / 9.0;
            }
        }
        std::mem::swap(&mut b, &mut tmp);
    }
    let mean = b.iter().sum::<f32>() / b.len() as f32;
    let var = b.iter().map(|x| (x - mean) * (x - mean)).sum::<f32>() / b.len() as f32;
    let inv = 1.0 / (var.sqrt() + 1e-6);
    b.iter_mut().for_each(|x| *x = (*x - mean) * inv);
    b
}

/// A loader worker process: writes batches to stdout until the reader goes away.
fn loader_worker(i: usize, passes: usize) {
    name_this_thread(&format!("loader-{i}"));
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (i as u64 + 1));
    let mut out = std::io::stdout().lock();
    loop {
        if out
            .write_all(&as_bytes(&make_batch(&mut rng, passes)))
            .is_err()
        {
            return;
        }
    }
}

fn matmul(a: &[f32], b: &[f32], out: &mut [f32]) {
    out.iter_mut().for_each(|x| *x = 0.0);
    for i in 0..DIM {
        for k in 0..DIM {
            let aik = a[i * DIM + k];
            let row = &b[k * DIM..(k + 1) * DIM];
            let o = &mut out[i * DIM..(i + 1) * DIM];
            for (o, r) in o.iter_mut().zip(row) {
                *o += aik * r;
            }
        }
    }
}

fn as_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn from_bytes(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// The shim's step markers, when `SLO_PROBE_SHIM` names the library.
struct Shim {
    begin: extern "C" fn(u64),
    end: extern "C" fn(u64),
}

impl Shim {
    fn load() -> Option<Self> {
        let path = std::env::var("SLO_PROBE_SHIM")
            .ok()
            .filter(|p| !p.is_empty() && p != "none")?;
        let c = std::ffi::CString::new(path.clone()).ok()?;
        // SAFETY: a NUL-terminated path; the library stays loaded for the process's life.
        let lib = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW) };
        if lib.is_null() {
            eprintln!("slo-probe-workload: cannot load the shim {path}: running without markers");
            return None;
        }
        let sym = |name: &str| {
            let n = std::ffi::CString::new(name).ok()?;
            // SAFETY: a valid handle and symbol name.
            let p = unsafe { libc::dlsym(lib, n.as_ptr()) };
            (!p.is_null()).then_some(p)
        };
        let (b, e) = (sym("slo_probe_step_begin")?, sym("slo_probe_step_end")?);
        // SAFETY: the shim's ABI: `void slo_probe_step_begin(uint64_t)` and `..._end(uint64_t)`.
        Some(unsafe {
            Shim {
                begin: std::mem::transmute::<*mut libc::c_void, extern "C" fn(u64)>(b),
                end: std::mem::transmute::<*mut libc::c_void, extern "C" fn(u64)>(e),
            }
        })
    }
}

/// Pins the calling thread to `cpu`.
fn pin_this_thread(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; the pointers are valid.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if rc != 0 {
        eprintln!("slo-probe-workload: cannot pin train-main to CPU {cpu}");
    }
}

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("slo-probe-workload: {e}");
            std::process::exit(2);
        }
    };
    if let Some(i) = args.loader_worker {
        loader_worker(i, args.augment);
        return;
    }
    name_this_thread("train-main");
    let stop = Arc::new(AtomicBool::new(false));

    // Loader processes → pipes → pin-memory thread → bounded queue → main.
    let exe = std::env::current_exe().unwrap_or_else(|e| {
        eprintln!("slo-probe-workload: cannot find my own executable: {e}");
        std::process::exit(1);
    });
    let mut workers = Vec::new();
    for i in 0..args.loaders {
        match Command::new(&exe)
            .args([
                "--loader-worker",
                &i.to_string(),
                "--augment",
                &args.augment.to_string(),
            ])
            .stdout(Stdio::piped())
            .spawn()
        {
            Ok(c) => workers.push(c),
            Err(e) => {
                eprintln!("slo-probe-workload: cannot start loader worker {i}: {e}");
                std::process::exit(1);
            }
        }
    }
    let mut pipes: Vec<ChildStdout> = workers.iter_mut().filter_map(|c| c.stdout.take()).collect();
    let (batch_tx, batch_rx) = mpsc::sync_channel::<Vec<f32>>(4);
    let pin = spawn("pin-memory", move || {
        let mut buf = vec![0u8; DIM * DIM * 4];
        'outer: loop {
            for p in pipes.iter_mut() {
                if p.read_exact(&mut buf).is_err() || batch_tx.send(from_bytes(&buf)).is_err() {
                    break 'outer;
                }
            }
        }
    });

    // The other "rank": averages with its own gradient.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| {
        eprintln!("slo-probe-workload: cannot listen on loopback: {e}");
        std::process::exit(1);
    });
    let addr = listener
        .local_addr()
        .unwrap_or_else(|e| panic!("local_addr: {e}"));
    let bytes_per_grad = DIM * DIM * 4;
    let peer = spawn("comm-peer", move || {
        let Ok((mut s, _)) = listener.accept() else {
            return;
        };
        let _ = s.set_nodelay(true);
        let own = vec![0.25f32; DIM * DIM];
        let mut buf = vec![0u8; bytes_per_grad];
        while s.read_exact(&mut buf).is_ok() {
            let avg: Vec<f32> = from_bytes(&buf)
                .iter()
                .zip(&own)
                .map(|(a, b)| (a + b) / 2.0)
                .collect();
            if s.write_all(&as_bytes(&avg)).is_err() {
                break;
            }
        }
    });

    // Communication thread: main → comm-allreduce → TCP → comm-peer → back.
    let (grad_tx, grad_rx) = mpsc::sync_channel::<Vec<f32>>(1);
    let (reduced_tx, reduced_rx) = mpsc::sync_channel::<Vec<f32>>(1);
    let sync = spawn("comm-allreduce", move || {
        let Ok(mut s) = TcpStream::connect(addr) else {
            return;
        };
        let _ = s.set_nodelay(true);
        let mut buf = vec![0u8; bytes_per_grad];
        for g in grad_rx {
            if s.write_all(&as_bytes(&g)).is_err() || s.read_exact(&mut buf).is_err() {
                break;
            }
            if reduced_tx.send(from_bytes(&buf)).is_err() {
                break;
            }
        }
    });

    // Logger: wakes on a timer and reads the latest step time.
    let last_step_us = Arc::new(AtomicU64::new(0));
    let logger = {
        let stop = stop.clone();
        let last = last_step_us.clone();
        spawn("metrics-log", move || {
            let mut samples = 0u64;
            while !stop.load(Ordering::Relaxed) {
                thread::sleep(Duration::from_millis(10));
                if last.load(Ordering::Relaxed) > 0 {
                    samples += 1;
                }
            }
            samples
        })
    };

    let mut weights = vec![0.01f32; DIM * DIM];
    let mut act = vec![0f32; DIM * DIM];
    let mut grad = vec![0f32; DIM * DIM];
    let mut step_times = Vec::new();
    let shim = Shim::load();
    if let Some(cpu) = args.pin_main {
        pin_this_thread(cpu);
    }
    let start = Instant::now();
    let mut step = 0u64;
    while start.elapsed() < args.duration {
        let t0 = Instant::now();
        let m0 = monotonic_ns();
        if let Some(s) = &shim {
            (s.begin)(step);
        }
        let Ok(batch) = batch_rx.recv() else { break };
        for _ in 0..args.work {
            matmul(&batch, &weights, &mut act); // forward
            matmul(&act, &batch, &mut grad); // backward
        }
        if grad_tx.send(std::mem::take(&mut grad)).is_err() {
            break;
        }
        let Ok(reduced) = reduced_rx.recv() else {
            break;
        };
        for (w, g) in weights.iter_mut().zip(&reduced) {
            *w -= 1e-6 * g;
        }
        grad = reduced;
        if let Some(s) = &shim {
            (s.end)(step);
        }
        if args.print_steps {
            let m1 = monotonic_ns();
            println!("step {step} {m1} {}", m1 - m0);
        }
        step += 1;
        let dt = t0.elapsed();
        last_step_us.store(dt.as_micros() as u64, Ordering::Relaxed);
        step_times.push(dt);
    }

    stop.store(true, Ordering::Relaxed);
    drop(grad_tx);
    drop(batch_rx);
    for mut w in workers {
        let _ = w.kill();
        let _ = w.wait();
    }
    let _ = pin.join();
    let _ = sync.join();
    let _ = peer.join();
    let log_samples = logger.join().unwrap_or(0);

    step_times.sort();
    let n = step_times.len();
    if n == 0 {
        println!("slo-probe-workload: no step completed");
        return;
    }
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let mean = step_times.iter().map(|d| ms(*d)).sum::<f64>() / n as f64;
    println!(
        "slo-probe-workload: {n} steps in {:.1} s; step time mean {mean:.2} ms, p50 {:.2} ms, \
         p99 {:.2} ms, max {:.2} ms; {log_samples} log samples",
        start.elapsed().as_secs_f64(),
        ms(step_times[n / 2]),
        ms(step_times[(n * 99 / 100).min(n - 1)]),
        ms(step_times[n - 1]),
    );
}
