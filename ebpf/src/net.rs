//! TCP per connection and per thread: payload bytes per thread (`sock_send_length`,
//! `sock_recv_length`, process context), connection ownership (the last followed thread that
//! used the socket), endpoints (`inet_sock_set_state`, `tcp_probe`, the socket itself), smoothed
//! RTT and congestion window (`tcp_probe`), retransmitted segments (`tcp_retransmit_skb`, which
//! runs in softirq or timer context, hence the ownership map). Retransmits are also sent one
//! call at a time through `NET_EVENTS`.
//!
//! Every program is a BTF tracepoint (`tp_btf`): no tracefs is needed to attach them, and unlike
//! classic tracepoints they are not skipped while another BPF program runs on the CPU (the shared
//! `bpf_prog_active` guard), which matters for `tcp_retransmit_skb` in softirq. Their arguments
//! are kernel pointers; the fields behind them are read at offsets the agent takes from BTF
//! (`SOCK_OFFSETS`).
//!
//! Retransmits are the socket's own `tcp_sock.total_retrans`, read at each `tcp_retransmit_skb`:
//! the kernel adds a buffer's segments there before handing it to the device, and keeps them
//! when the local queue then drops it (`NET_XMIT_DROP` under congestion), while the tracepoint
//! reports that call as failed; calls that fail before anything is sent (`-EBUSY`: the original
//! is still in the host queue) add nothing. Counting the tracepoint's segments instead undercounts
//! a sender whose own link queue overflows (18–31% in tests/tcp.rs's congestion test).
//!
//! Needs kernel 6.3+ (`sock_send_length`/`sock_recv_length`) and BTF.

use aya_ebpf::{
    helpers::{bpf_get_prandom_u32, bpf_ktime_get_ns},
    macros::{btf_tracepoint, map},
    maps::{HashMap, RingBuf},
    programs::BtfTracePointContext,
    EbpfContext,
};
use slo_probe_common::{
    net::{AF_INET, AF_INET6},
    ConnClosedRecord, ConnStats, Counter, RecordHeader, SockOffsets, TcpRetransmitRecord, TcpTuple,
    CONN_CLOSED,
};

use crate::shared::{
    count, global, is_tracked, read_kernel, BPF_NOEXIST, BPF_RB_NO_WAKEUP, FILTER_TRACKED, THREADS,
};

/// Offsets in `sock_common`, `sock`, `tcp_sock`, `sk_buff` and `tcp_skb_cb` (patched by the
/// agent from BTF).
#[unsafe(no_mangle)]
static SOCK_OFFSETS: SockOffsets = SockOffsets {
    daddr: 0,
    rcv_saddr: 0,
    dport: 0,
    num: 0,
    family: 0,
    state: 0,
    v6_daddr: 0,
    v6_rcv_saddr: 0,
    skb_cb: 0,
    tcp_gso_segs: 0,
    retransmit_has_err: 0,
    protocol: 0,
    total_retrans: 0,
    srtt_us: 0,
    snd_cwnd: 0,
    _pad: 0,
};

/// Kernel socket address → connection state. Sized by the agent.
#[map]
static CONNS: HashMap<u64, ConnStats> = HashMap::with_max_entries(4096, 0);

/// Retransmit and connection-closed records for the agent.
#[map]
static NET_EVENTS: RingBuf = RingBuf::with_byte_size(64 * 1024, 0);

const IPPROTO_TCP: u16 = 6;
const TCP_ESTABLISHED: i32 = 1;
const TCP_SYN_SENT: i32 = 2;
const TCP_CLOSE: i32 = 7;

const EMPTY: ConnStats = ConnStats {
    tuple: TcpTuple {
        saddr: [0; 16],
        daddr: [0; 16],
        sport: 0,
        dport: 0,
        family: 0,
        _pad: 0,
    },
    tgid: 0,
    tid: 0,
    retransmits: 0,
    srtt_us: 0,
    snd_cwnd: 0,
    last_ts: 0,
    flags: 0,
    generation: 0,
    retrans_base: 0,
    _pad: 0,
};

/// `tcp_sock.total_retrans` of `sk`.
#[inline(always)]
fn total_retrans(sk: *const u8) -> Option<u32> {
    read_kernel::<u32>(sk, global(&SOCK_OFFSETS.total_retrans))
}

/// A fresh entry owned by `tgid`/`tid`, whose retransmits count from `base`.
#[inline(always)]
fn fresh(tgid: u32, tid: u32, base: u32) -> ConnStats {
    let mut c = EMPTY;
    c.tgid = tgid;
    c.tid = tid;
    c.generation = new_generation();
    c.retrans_base = base;
    c
}

/// The entry of socket `sk`, created (when `create`) with owner `tgid`/`tid` and its
/// retransmits counted from what the socket has now.
#[inline(always)]
fn conn(sk: *const u8, create: bool, tgid: u32, tid: u32) -> Option<*mut ConnStats> {
    if let Some(c) = CONNS.get_ptr_mut(sk as u64) {
        return Some(c);
    }
    if !create {
        return None;
    }
    insert(sk, fresh(tgid, tid, total_retrans(sk).unwrap_or(0)))
}

#[inline(always)]
fn insert(sk: *const u8, value: ConnStats) -> Option<*mut ConnStats> {
    let key = sk as u64;
    // SAFETY: only presence is used.
    if CONNS.insert(key, value, BPF_NOEXIST).is_err() && unsafe { CONNS.get(key) }.is_none() {
        count(Counter::ConnMapFull);
        return None;
    }
    CONNS.get_ptr_mut(key)
}

/// A connection identity: random, never 0.
#[inline(always)]
fn new_generation() -> u32 {
    // SAFETY: no preconditions.
    (unsafe { bpf_get_prandom_u32() }) | 1
}

/// Sets the owner to the current thread; a closed socket reused at the same address starts over.
#[inline(always)]
fn own(c: *mut ConnStats, sk: *const u8, tgid: u32, tid: u32) {
    // SAFETY: pointer from a map lookup; a racing writer can only leave another valid owner.
    unsafe {
        if (*c).flags & CONN_CLOSED != 0 {
            *c = fresh(tgid, tid, total_retrans(sk).unwrap_or(0));
        }
        (*c).tgid = tgid;
        (*c).tid = tid;
    }
}

/// TP_PROTO(struct sock *sk, int ret, int flags). Process context.
#[btf_tracepoint(function = "sock_send_length")]
pub fn sock_send_length(ctx: BtfTracePointContext) -> i32 {
    try_sock_length(&ctx, true);
    0
}

/// TP_PROTO(struct sock *sk, int ret, int flags). Process context.
#[btf_tracepoint(function = "sock_recv_length")]
pub fn sock_recv_length(ctx: BtfTracePointContext) -> i32 {
    try_sock_length(&ctx, false);
    0
}

/// Whether `sk` is a TCP socket over IPv4 or IPv6.
#[inline(always)]
fn is_tcp(sk: *const u8) -> bool {
    let o = global(&SOCK_OFFSETS);
    let (Some(family), Some(protocol)) = (
        read_kernel::<u16>(sk, o.family),
        read_kernel::<u16>(sk, o.protocol),
    ) else {
        return false;
    };
    protocol == IPPROTO_TCP && (family == AF_INET || family == AF_INET6)
}

#[inline(always)]
fn try_sock_length(ctx: &BtfTracePointContext, send: bool) {
    let sk: *const u8 = ctx.arg(0);
    let ret: i32 = ctx.arg(1);
    if ret <= 0 || !is_tcp(sk) {
        return;
    }
    let tid = ctx.pid();
    // Only threads the scheduling programs follow have an entry: that is the filter.
    let Some(t) = THREADS.get_ptr_mut(tid) else {
        return;
    };
    // SAFETY: pointer from a map lookup; a thread runs on one CPU at a time, so its own
    // counters are not written concurrently.
    unsafe {
        if send {
            (*t).tcp_sent_bytes += ret as u64;
        } else {
            (*t).tcp_recv_bytes += ret as u64;
        }
    }
    let tgid = ctx.tgid();
    if let Some(c) = conn(sk, true, tgid, tid) {
        // SAFETY: pointer from a map lookup.
        if unsafe { (*c).tid != tid || (*c).flags & CONN_CLOSED != 0 } {
            own(c, sk, tgid, tid);
        }
    }
}

/// TP_PROTO(const struct sock *sk, const int oldstate, const int newstate).
#[btf_tracepoint(function = "inet_sock_set_state")]
pub fn inet_sock_set_state(ctx: BtfTracePointContext) -> i32 {
    try_inet_sock_set_state(&ctx);
    0
}

#[inline(always)]
fn try_inet_sock_set_state(ctx: &BtfTracePointContext) {
    let sk: *const u8 = ctx.arg(0);
    let newstate: i32 = ctx.arg(2);
    let o = global(&SOCK_OFFSETS);
    if read_kernel::<u16>(sk, o.protocol) != Some(IPPROTO_TCP) {
        return;
    }
    let c = if newstate == TCP_SYN_SENT {
        // connect(): process context, the current thread owns the socket.
        let tgid = ctx.tgid();
        if !is_tracked(tgid) {
            return;
        }
        let c = conn(sk, true, tgid, ctx.pid());
        if let Some(c) = c {
            own(c, sk, tgid, ctx.pid());
        }
        c
    } else {
        conn(sk, false, 0, 0)
    };
    let Some(c) = c else { return };
    if newstate == TCP_CLOSE {
        // Hand the final state over through the ring and free the address for reuse; if the
        // ring is full, leave the entry flagged for the agent's next read instead.
        // SAFETY: pointer from a map lookup.
        let stats = unsafe {
            (*c).flags |= CONN_CLOSED;
            (*c).last_ts = bpf_ktime_get_ns();
            *c
        };
        let Some(mut entry) = NET_EVENTS.reserve::<ConnClosedRecord>(0) else {
            count(Counter::EventRingFull);
            return;
        };
        entry.write(ConnClosedRecord {
            header: RecordHeader::of::<ConnClosedRecord>(),
            skaddr: sk as u64,
            stats,
        });
        entry.submit(BPF_RB_NO_WAKEUP);
        let _ = CONNS.remove(sk as u64);
        return;
    }
    // SAFETY: pointer from a map lookup.
    unsafe {
        if newstate == TCP_ESTABLISHED || newstate == TCP_SYN_SENT {
            read_sock_tuple(sk, &o, &mut (*c).tuple);
        }
        (*c).last_ts = bpf_ktime_get_ns();
    }
}

/// TP_PROTO(const struct sock *sk, const struct sk_buff *skb[, int err]) (err: 6.11+, when
/// the tracepoint also fires for failed attempts). Runs in softirq or timer context: the owner
/// comes from `CONNS`, the endpoints from the socket.
#[btf_tracepoint(function = "tcp_retransmit_skb")]
pub fn tcp_retransmit_skb(ctx: BtfTracePointContext) -> i32 {
    try_tcp_retransmit_skb(&ctx);
    0
}

#[inline(always)]
fn try_tcp_retransmit_skb(ctx: &BtfTracePointContext) {
    let o = global(&SOCK_OFFSETS);
    let sk: *const u8 = ctx.arg(0);
    let Some(total) = total_retrans(sk) else {
        return;
    };
    let c = match CONNS.get_ptr_mut(sk as u64) {
        Some(c) => c,
        // Unfollowed sockets are counted only when the whole node is followed (owner unknown).
        None if global(&FILTER_TRACKED) == 0 => {
            // First seen now: count from before this call. A failure after the count (the
            // local queue dropped it: a positive NET_XMIT code) is counted by the kernel; one
            // before it (a negative errno) is not.
            let err = if o.retransmit_has_err != 0 {
                ctx.arg::<i32>(2)
            } else {
                0
            };
            let this_call = if err >= 0 {
                let skb: *const u8 = ctx.arg(1);
                u32::from(
                    read_kernel::<u16>(skb, o.skb_cb + o.tcp_gso_segs)
                        .unwrap_or(1)
                        .max(1),
                )
            } else {
                0
            };
            let Some(c) = insert(sk, fresh(0, 0, total.wrapping_sub(this_call))) else {
                return;
            };
            c
        }
        None => return,
    };
    let now = unsafe { bpf_ktime_get_ns() };
    // SAFETY: pointer from a map lookup. Retransmits of one socket run under its lock.
    let (segments, tuple, tgid, tid) = unsafe {
        let counted = u64::from(total.wrapping_sub((*c).retrans_base));
        if counted <= (*c).retransmits {
            return; // failed before anything was sent: the kernel counted nothing
        }
        let segments = (counted - (*c).retransmits) as u32;
        (*c).retransmits = counted;
        (*c).last_ts = now;
        read_sock_tuple(sk, &o, &mut (*c).tuple);
        (segments, (*c).tuple, (*c).tgid, (*c).tid)
    };
    let state = u32::from(read_kernel::<u8>(sk, o.state).unwrap_or(0));
    let Some(mut entry) = NET_EVENTS.reserve::<TcpRetransmitRecord>(0) else {
        count(Counter::EventRingFull);
        return;
    };
    entry.write(TcpRetransmitRecord {
        header: RecordHeader::of::<TcpRetransmitRecord>(),
        ts_ns: now,
        skaddr: sk as u64,
        tgid,
        tid,
        tuple,
        state,
        segments,
    });
    entry.submit(BPF_RB_NO_WAKEUP);
}

/// The endpoints of a socket, from `sock_common`.
#[inline(always)]
fn read_sock_tuple(sk: *const u8, o: &SockOffsets, tuple: &mut TcpTuple) {
    let family = read_kernel::<u16>(sk, o.family).unwrap_or(0);
    if family == AF_INET {
        if let (Some(s), Some(d)) = (
            read_kernel::<[u8; 4]>(sk, o.rcv_saddr),
            read_kernel::<[u8; 4]>(sk, o.daddr),
        ) {
            tuple.saddr = [0; 16];
            tuple.daddr = [0; 16];
            tuple.saddr[..4].copy_from_slice(&s);
            tuple.daddr[..4].copy_from_slice(&d);
        }
    } else if family == AF_INET6 {
        if let (Some(s), Some(d)) = (
            read_kernel::<[u8; 16]>(sk, o.v6_rcv_saddr),
            read_kernel::<[u8; 16]>(sk, o.v6_daddr),
        ) {
            tuple.saddr = s;
            tuple.daddr = d;
        }
    } else {
        return;
    }
    tuple.family = family;
    tuple.sport = read_kernel::<u16>(sk, o.num).unwrap_or(0);
    tuple.dport = u16::from_be(read_kernel::<u16>(sk, o.dport).unwrap_or(0));
}

/// TP_PROTO(struct sock *sk, const struct sk_buff *skb). RTT and window of a followed socket.
#[btf_tracepoint(function = "tcp_probe")]
pub fn tcp_probe(ctx: BtfTracePointContext) -> i32 {
    try_tcp_probe(&ctx);
    0
}

#[inline(always)]
fn try_tcp_probe(ctx: &BtfTracePointContext) {
    let sk: *const u8 = ctx.arg(0);
    let Some(c) = conn(sk, false, 0, 0) else {
        return;
    };
    let o = global(&SOCK_OFFSETS);
    // SAFETY: pointer from a map lookup.
    unsafe {
        // srtt_us holds 8 × the smoothed RTT (as the classic tracepoint's `srtt` undoes).
        (*c).srtt_us = read_kernel::<u32>(sk, o.srtt_us).unwrap_or(0) >> 3;
        (*c).snd_cwnd = read_kernel::<u32>(sk, o.snd_cwnd).unwrap_or(0);
        (*c).last_ts = bpf_ktime_get_ns();
        if (*c).tuple.family == 0 {
            read_sock_tuple(sk, &o, &mut (*c).tuple);
        }
    }
}
