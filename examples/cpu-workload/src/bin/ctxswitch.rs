//! Context-switch microbenchmark: two threads pinned to one CPU pass a byte back and forth
//! through two pipes, so every hand-off is a wakeup plus a context switch. Prints the time per
//! context switch; `bench/sched-overhead` runs it with and without tracers attached.
//!
//! Usage: `ctxswitch [ROUND_TRIPS (200000)] [CPU (0)]`.

use std::{
    fs::File,
    io::{Read, Write},
    os::fd::FromRawFd,
    time::Instant,
};

fn pipe() -> (File, File) {
    let mut fds = [0i32; 2];
    // SAFETY: valid pointer to two ints.
    let rc = unsafe { libc::pipe(fds.as_mut_ptr()) };
    assert_eq!(rc, 0, "pipe: {}", std::io::Error::last_os_error());
    // SAFETY: fresh fds owned by the Files.
    unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) }
}

fn pin(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is an empty set; valid pointers.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    assert_eq!(
        rc,
        0,
        "sched_setaffinity: {}",
        std::io::Error::last_os_error()
    );
}

fn main() {
    let mut args = std::env::args().skip(1);
    let rounds: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(200_000);
    let cpu: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(0);
    let (mut a_rx, mut a_tx) = pipe();
    let (mut b_rx, mut b_tx) = pipe();
    pin(cpu);
    let echo = std::thread::spawn(move || {
        pin(cpu);
        let mut b = [0u8; 1];
        for _ in 0..rounds {
            a_rx.read_exact(&mut b).expect("read");
            b_tx.write_all(&b).expect("write");
        }
    });
    let mut b = [0u8; 1];
    let t0 = Instant::now();
    for _ in 0..rounds {
        a_tx.write_all(&b).expect("write");
        b_rx.read_exact(&mut b).expect("read");
    }
    let elapsed = t0.elapsed();
    echo.join().expect("echo thread");
    let per_switch = elapsed.as_nanos() as f64 / (2 * rounds) as f64;
    println!("{per_switch:.1}");
}
