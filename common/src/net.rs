//! TCP: retransmits per connection with the owning process and thread, smoothed RTT and
//! congestion window sampled from `tcp_probe`. Produced by `ebpf/src/net.rs` from the BTF
//! tracepoints (`tp_btf`, no tracefs needed) `tcp_retransmit_skb`, `tcp_probe`,
//! `inet_sock_set_state`, `sock_send_length` and `sock_recv_length`.
//!
//! Addresses are 16 bytes: IPv6 as is, IPv4 in the first 4 bytes with the rest zero; ports are
//! in host byte order.

use core::mem::size_of;

use crate::{Record, RecordHeader, RecordKind};

/// `AF_INET`.
pub const AF_INET: u16 = 2;
/// `AF_INET6`.
pub const AF_INET6: u16 = 10;

/// A TCP connection's endpoints.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Hash, PartialOrd, Ord)]
pub struct TcpTuple {
    /// Local address.
    pub saddr: [u8; 16],
    /// Remote address.
    pub daddr: [u8; 16],
    /// Local port.
    pub sport: u16,
    /// Remote port.
    pub dport: u16,
    /// [`AF_INET`] or [`AF_INET6`]; 0 while not yet known.
    pub family: u16,
    /// Explicit padding; always 0.
    pub _pad: u16,
}
const _: () = assert!(size_of::<TcpTuple>() == 40);

/// One TCP retransmission of a connection the agent follows, sent through `NET_EVENTS`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TcpRetransmitRecord {
    /// `{ kind: TcpRetransmit, version: 1, len: 80 }`.
    pub header: RecordHeader,
    /// CLOCK_MONOTONIC ns of the retransmission.
    pub ts_ns: u64,
    /// Kernel address of the socket (joins with the `CONNS` map).
    pub skaddr: u64,
    /// Owning process (last process that sent or received on it); 0 if unknown.
    pub tgid: u32,
    /// Owning thread; 0 if unknown.
    pub tid: u32,
    /// The connection.
    pub tuple: TcpTuple,
    /// TCP state (`TCP_ESTABLISHED` = 1, `TCP_SYN_SENT` = 2, ...).
    pub state: u32,
    /// Segments the kernel counted as retransmitted by this call (`tcp_sock.total_retrans`
    /// grew by this much; one socket buffer can carry several under TSO/GSO).
    pub segments: u32,
}
const _: () = assert!(size_of::<TcpRetransmitRecord>() == 80);

// SAFETY: repr(C), header first, integers only, no implicit padding (size pinned above).
unsafe impl Record for TcpRetransmitRecord {
    const KIND: RecordKind = RecordKind::TcpRetransmit;
    const VERSION: u16 = 1;

    fn header(&self) -> &RecordHeader {
        &self.header
    }
}

/// [`ConnStats::flags`] bit: the socket reached `TCP_CLOSE`; the agent reads it a last time and
/// deletes it.
pub const CONN_CLOSED: u32 = 1;

/// Per-connection state, the value type of the `CONNS` map (key: kernel socket address).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnStats {
    /// The connection (zero until a state change, probe or retransmit shows it).
    pub tuple: TcpTuple,
    /// Owning process (last process that sent or received on it); 0 if unknown.
    pub tgid: u32,
    /// Owning thread; 0 if unknown.
    pub tid: u32,
    /// Retransmitted segments since the entry was made: the socket's own
    /// `tcp_sock.total_retrans` (what `TCP_INFO.tcpi_total_retrans` reports) less
    /// [`ConnStats::retrans_base`].
    pub retransmits: u64,
    /// Smoothed RTT at the last `tcp_probe`, µs.
    pub srtt_us: u32,
    /// Congestion window at the last `tcp_probe`, segments.
    pub snd_cwnd: u32,
    /// CLOCK_MONOTONIC ns of the last update.
    pub last_ts: u64,
    /// [`CONN_CLOSED`] or 0.
    pub flags: u32,
    /// Which connection at this socket address: a new one at a reused address gets another
    /// (random, never 0), so the agent tells them apart even within one read.
    pub generation: u32,
    /// `tcp_sock.total_retrans` when the entry was made (a socket followed from its first
    /// packet has 0; one first seen at a retransmit has what it had before that call).
    pub retrans_base: u32,
    /// Explicit padding; always 0.
    pub _pad: u32,
}
const _: () = assert!(size_of::<ConnStats>() == 88);

/// A connection's last state when it reached `TCP_CLOSE`, sent through `NET_EVENTS` before its
/// `CONNS` entry is deleted, so that a socket address reused right away cannot overwrite it.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnClosedRecord {
    /// `{ kind: ConnClosed, version: 2, len: 104 }`.
    pub header: RecordHeader,
    /// Kernel address of the socket (the `CONNS` key it had).
    pub skaddr: u64,
    /// The entry as it was at the close (with [`CONN_CLOSED`]).
    pub stats: ConnStats,
}
const _: () = assert!(size_of::<ConnClosedRecord>() == 104);

// SAFETY: repr(C), header first, integers only, no implicit padding (size pinned above).
unsafe impl Record for ConnClosedRecord {
    const KIND: RecordKind = RecordKind::ConnClosed;
    /// 2: [`ConnStats`] grew `retrans_base` (88 bytes).
    const VERSION: u16 = 2;

    fn header(&self) -> &RecordHeader {
        &self.header
    }
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: plain old data (sizes pinned above).
    unsafe impl aya::Pod for super::TcpRetransmitRecord {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::ConnStats {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::ConnClosedRecord {}
}

/// Byte offsets in kernel structs that the network programs read, from kernel BTF (the agent
/// patches them in as the global `SOCK_OFFSETS`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SockOffsets {
    /// `sock_common.skc_daddr` (remote IPv4, network order).
    pub daddr: u32,
    /// `sock_common.skc_rcv_saddr` (local IPv4).
    pub rcv_saddr: u32,
    /// `sock_common.skc_dport` (remote port, network order).
    pub dport: u32,
    /// `sock_common.skc_num` (local port, host order).
    pub num: u32,
    /// `sock_common.skc_family`.
    pub family: u32,
    /// `sock_common.skc_state`.
    pub state: u32,
    /// `sock_common.skc_v6_daddr`.
    pub v6_daddr: u32,
    /// `sock_common.skc_v6_rcv_saddr`.
    pub v6_rcv_saddr: u32,
    /// `sk_buff.cb`.
    pub skb_cb: u32,
    /// `tcp_skb_cb.tcp_gso_segs` (segments in a buffer, `tcp_skb_pcount`).
    pub tcp_gso_segs: u32,
    /// 1 when `tcp_retransmit_skb` has its third argument, `err` (kernel 6.11+).
    pub retransmit_has_err: u32,
    /// `sock.sk_protocol` (a `u16` since 5.6).
    pub protocol: u32,
    /// `tcp_sock.total_retrans` (segments retransmitted, as `TCP_INFO` reports them).
    pub total_retrans: u32,
    /// `tcp_sock.srtt_us` (smoothed RTT in µs, shifted left by 3).
    pub srtt_us: u32,
    /// `tcp_sock.snd_cwnd`.
    pub snd_cwnd: u32,
    /// Explicit padding; always 0.
    pub _pad: u32,
}
const _: () = assert!(size_of::<SockOffsets>() == 64);

#[cfg(feature = "user")]
mod pod_offsets {
    // SAFETY: plain old data (size pinned above).
    unsafe impl aya::Pod for super::SockOffsets {}
}
