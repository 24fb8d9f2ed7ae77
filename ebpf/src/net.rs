//! TCP per connection and per thread: payload bytes per thread (`sock_send_length`,
//! `sock_recv_length`, process context), connection ownership (the last followed thread that
//! used the socket), endpoints (`inet_sock_set_state`, `tcp_probe`), smoothed RTT and congestion
//! window (`tcp_probe`), retransmitted segments (`tcp_retransmit_skb`, which runs in softirq or
//! timer context, hence the ownership map). Retransmits are also sent one by one through
//! `NET_EVENTS`.
//!
//! The classic tracepoints need tracefs to attach, and their field offsets come from the agent,
//! which reads each tracepoint's `format` file (`NET_TP_OFFSETS`). `tcp_retransmit_skb` is a BTF
//! tracepoint (the agent's `NET_BTF_PROGRAMS` says why), reading `sock_common` through offsets
//! the agent takes from BTF (`SOCK_OFFSETS`).

use aya_ebpf::{
    helpers::{bpf_get_prandom_u32, bpf_ktime_get_ns},
    macros::{btf_tracepoint, map, tracepoint},
    maps::{HashMap, RingBuf},
    programs::{BtfTracePointContext, TracePointContext},
    EbpfContext,
};
use slo_probe_common::{
    net::{AF_INET, AF_INET6},
    ConnClosedRecord, ConnStats, Counter, NetTpOffsets, RecordHeader, SockOffsets,
    TcpRetransmitRecord, TcpTuple, CONN_CLOSED,
};

use crate::shared::{
    count, global, is_tracked, read_kernel, BPF_NOEXIST, BPF_RB_NO_WAKEUP, FILTER_TRACKED, THREADS,
};

/// Offsets of the tracepoint fields (patched by the agent).
#[unsafe(no_mangle)]
static NET_TP_OFFSETS: NetTpOffsets = NetTpOffsets {
    sock_sk: 0,
    sock_family: 0,
    sock_protocol: 0,
    sock_ret: 0,
    state_skaddr: 0,
    state_newstate: 0,
    state_sport: 0,
    state_dport: 0,
    state_family: 0,
    state_protocol: 0,
    state_saddr: 0,
    state_daddr: 0,
    state_saddr_v6: 0,
    state_daddr_v6: 0,
    probe_skaddr: 0,
    probe_srtt: 0,
    probe_snd_cwnd: 0,
    probe_sport: 0,
    probe_dport: 0,
    probe_family: 0,
    probe_saddr: 0,
    probe_daddr: 0,
};

/// Offsets in `sock_common`, `sk_buff` and `tcp_skb_cb` (patched by the agent from BTF).
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

#[inline(always)]
fn offsets() -> NetTpOffsets {
    global(&NET_TP_OFFSETS)
}

#[inline(always)]
fn field<T>(ctx: &TracePointContext, offset: u32) -> Option<T> {
    // SAFETY: bpf_probe_read_kernel of the tracepoint's record, at an offset its format names.
    unsafe { ctx.read_at::<T>(offset as usize) }.ok()
}

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
};

/// The entry of socket `sk`, created with owner `tgid`/`tid` when `create`.
#[inline(always)]
fn conn(sk: u64, create: bool, tgid: u32, tid: u32) -> Option<*mut ConnStats> {
    if let Some(c) = CONNS.get_ptr_mut(sk) {
        return Some(c);
    }
    if !create {
        return None;
    }
    let mut fresh = EMPTY;
    fresh.tgid = tgid;
    fresh.tid = tid;
    fresh.generation = new_generation();
    if CONNS.insert(sk, fresh, BPF_NOEXIST).is_err() && unsafe { CONNS.get(sk) }.is_none() {
        count(Counter::ConnMapFull);
        return None;
    }
    CONNS.get_ptr_mut(sk)
}

/// A connection identity: random, never 0.
#[inline(always)]
fn new_generation() -> u32 {
    // SAFETY: no preconditions.
    (unsafe { bpf_get_prandom_u32() }) | 1
}

/// Sets the owner to the current thread; a closed socket reused at the same address starts over.
#[inline(always)]
fn own(c: *mut ConnStats, tgid: u32, tid: u32) {
    // SAFETY: pointer from a map lookup; a racing writer can only leave another valid owner.
    unsafe {
        if (*c).flags & CONN_CLOSED != 0 {
            *c = EMPTY;
            (*c).generation = new_generation();
        }
        (*c).tgid = tgid;
        (*c).tid = tid;
    }
}

#[tracepoint(category = "sock", name = "sock_send_length")]
pub fn sock_send_length(ctx: TracePointContext) -> u32 {
    sock_length(&ctx, true);
    0
}

#[tracepoint(category = "sock", name = "sock_recv_length")]
pub fn sock_recv_length(ctx: TracePointContext) -> u32 {
    sock_length(&ctx, false);
    0
}

#[inline(always)]
fn sock_length(ctx: &TracePointContext, send: bool) {
    let o = offsets();
    let (Some(family), Some(protocol), Some(ret)) = (
        field::<u16>(ctx, o.sock_family),
        field::<u16>(ctx, o.sock_protocol),
        field::<i32>(ctx, o.sock_ret),
    ) else {
        return;
    };
    if protocol != IPPROTO_TCP || (family != AF_INET && family != AF_INET6) || ret <= 0 {
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
    let Some(sk) = field::<u64>(ctx, o.sock_sk) else {
        return;
    };
    let tgid = ctx.tgid();
    if let Some(c) = conn(sk, true, tgid, tid) {
        // SAFETY: pointer from a map lookup.
        if unsafe { (*c).tid != tid || (*c).flags & CONN_CLOSED != 0 } {
            own(c, tgid, tid);
        }
    }
}

#[inline(always)]
fn read_tuple_v4v6(
    ctx: &TracePointContext,
    family: u16,
    off_v4: (u32, u32),
    off_v6: (u32, u32),
    tuple: &mut TcpTuple,
) {
    if family == AF_INET {
        if let (Some(s), Some(d)) = (
            field::<[u8; 4]>(ctx, off_v4.0),
            field::<[u8; 4]>(ctx, off_v4.1),
        ) {
            tuple.saddr = [0; 16];
            tuple.daddr = [0; 16];
            tuple.saddr[..4].copy_from_slice(&s);
            tuple.daddr[..4].copy_from_slice(&d);
            tuple.family = family;
        }
    } else if family == AF_INET6 {
        if let (Some(s), Some(d)) = (
            field::<[u8; 16]>(ctx, off_v6.0),
            field::<[u8; 16]>(ctx, off_v6.1),
        ) {
            tuple.saddr = s;
            tuple.daddr = d;
            tuple.family = family;
        }
    }
}

#[tracepoint(category = "sock", name = "inet_sock_set_state")]
pub fn inet_sock_set_state(ctx: TracePointContext) -> u32 {
    let o = offsets();
    let (Some(protocol), Some(newstate), Some(sk)) = (
        field::<u16>(&ctx, o.state_protocol),
        field::<i32>(&ctx, o.state_newstate),
        field::<u64>(&ctx, o.state_skaddr),
    ) else {
        return 0;
    };
    if protocol != IPPROTO_TCP {
        return 0;
    }
    let c = if newstate == TCP_SYN_SENT {
        // connect(): process context, the current thread owns the socket.
        let tgid = ctx.tgid();
        if !is_tracked(tgid) {
            return 0;
        }
        let c = conn(sk, true, tgid, ctx.pid());
        if let Some(c) = c {
            own(c, tgid, ctx.pid());
        }
        c
    } else {
        conn(sk, false, 0, 0)
    };
    let Some(c) = c else { return 0 };
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
            return 0;
        };
        entry.write(ConnClosedRecord {
            header: RecordHeader::of::<ConnClosedRecord>(),
            skaddr: sk,
            stats,
        });
        entry.submit(BPF_RB_NO_WAKEUP);
        let _ = CONNS.remove(sk);
        return 0;
    }
    // SAFETY: pointer from a map lookup.
    unsafe {
        if newstate == TCP_ESTABLISHED || newstate == TCP_SYN_SENT {
            let family = field::<u16>(&ctx, o.state_family).unwrap_or(0);
            read_tuple_v4v6(
                &ctx,
                family,
                (o.state_saddr, o.state_daddr),
                (o.state_saddr_v6, o.state_daddr_v6),
                &mut (*c).tuple,
            );
            (*c).tuple.sport = field::<u16>(&ctx, o.state_sport).unwrap_or(0);
            (*c).tuple.dport = field::<u16>(&ctx, o.state_dport).unwrap_or(0);
        }
        (*c).last_ts = bpf_ktime_get_ns();
    }
    0
}

/// TP_PROTO(const struct sock *sk, const struct sk_buff *skb[, int err]) (err: 6.11+, when
/// the tracepoint also fires for failed attempts). Runs in softirq or timer context: the owner
/// comes from `CONNS`, the endpoints from the socket.
#[btf_tracepoint(function = "tcp_retransmit_skb")]
pub fn tcp_retransmit_skb(ctx: BtfTracePointContext) -> i32 {
    let o = global(&SOCK_OFFSETS);
    if o.retransmit_has_err != 0 && ctx.arg::<i32>(2) != 0 {
        return 0;
    }
    let sk: *const u8 = ctx.arg(0);
    let skb: *const u8 = ctx.arg(1);
    // Unfollowed sockets are counted only when the whole node is followed (owner unknown).
    let Some(c) = conn(sk as u64, global(&FILTER_TRACKED) == 0, 0, 0) else {
        return 0;
    };
    // One buffer can carry several segments (TSO/GSO): count them as TCP_INFO does.
    let segments = u32::from(
        read_kernel::<u16>(skb, o.skb_cb + o.tcp_gso_segs)
            .unwrap_or(1)
            .max(1),
    );
    let now = unsafe { bpf_ktime_get_ns() };
    let state = u32::from(read_kernel::<u8>(sk, o.state).unwrap_or(0));
    // SAFETY: pointer from a map lookup. Retransmits of one socket run under its lock.
    let (tuple, tgid, tid) = unsafe {
        read_sock_tuple(sk, &o, &mut (*c).tuple);
        (*c).retransmits += u64::from(segments);
        (*c).last_ts = now;
        ((*c).tuple, (*c).tgid, (*c).tid)
    };
    let Some(mut entry) = NET_EVENTS.reserve::<TcpRetransmitRecord>(0) else {
        count(Counter::EventRingFull);
        return 0;
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
    0
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

#[tracepoint(category = "tcp", name = "tcp_probe")]
pub fn tcp_probe(ctx: TracePointContext) -> u32 {
    let o = offsets();
    let Some(sk) = field::<u64>(&ctx, o.probe_skaddr) else {
        return 0;
    };
    let Some(c) = conn(sk, false, 0, 0) else {
        return 0;
    };
    // SAFETY: pointer from a map lookup.
    unsafe {
        (*c).srtt_us = field::<u32>(&ctx, o.probe_srtt).unwrap_or(0);
        (*c).snd_cwnd = field::<u32>(&ctx, o.probe_snd_cwnd).unwrap_or(0);
        (*c).last_ts = bpf_ktime_get_ns();
        if (*c).tuple.family == 0 {
            // saddr/daddr are sockaddr_in (address at +4) or sockaddr_in6 (address at +8).
            let family = field::<u16>(&ctx, o.probe_family).unwrap_or(0);
            read_tuple_v4v6(
                &ctx,
                family,
                (o.probe_saddr + 4, o.probe_daddr + 4),
                (o.probe_saddr + 8, o.probe_daddr + 8),
                &mut (*c).tuple,
            );
            (*c).tuple.sport = field::<u16>(&ctx, o.probe_sport).unwrap_or(0);
            (*c).tuple.dport = field::<u16>(&ctx, o.probe_dport).unwrap_or(0);
        }
    }
    0
}
