//! slo-probe's eBPF programs, one module per family. Built for `bpfel-unknown-none` by
//! `agent/build.rs` (aya-build) and embedded in the agent.
//!
//! Needs kernel 5.8+ (ring buffers), BTF (`/sys/kernel/btf/vmlinux`) for the `tp_btf` programs,
//! and nothing else: every program is a BTF tracepoint (no tracefs).
#![no_std]
#![no_main]

mod net;
mod proc;
mod sched;
mod shared;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // The verifier proves that no panic path is reachable; this is never entered.
    loop {}
}

/// bpf_probe_read_kernel and BTF tracepoints are GPL-only helpers.
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
