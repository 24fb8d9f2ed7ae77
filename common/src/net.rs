//! TCP: retransmits per connection with the owning process and thread, smoothed RTT and
//! congestion window sampled from `tcp_probe`. Produced by `ebpf/src/net.rs` from the classic
//! tracepoints `tcp/tcp_retransmit_skb`, `tcp/tcp_probe`, `sock/inet_sock_set_state`,
//! `sock/sock_send_length` and `sock/sock_recv_length` (tracefs needed for attach).
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
    /// `{ kind: TcpRetransmit, version: 1, len: 88 }`.
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
    /// Explicit padding; always 0.
    pub _pad: u32,
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
    /// Retransmitted segments.
    pub retransmits: u64,
    /// Smoothed RTT at the last `tcp_probe`, µs.
    pub srtt_us: u32,
    /// Congestion window at the last `tcp_probe`, segments.
    pub snd_cwnd: u32,
    /// CLOCK_MONOTONIC ns of the last update.
    pub last_ts: u64,
    /// [`CONN_CLOSED`] or 0.
    pub flags: u32,
    /// Explicit padding; always 0.
    pub _pad: u32,
}
const _: () = assert!(size_of::<ConnStats>() == 80);

#[cfg(feature = "user")]
mod pod {
    // SAFETY: plain old data (sizes pinned above).
    unsafe impl aya::Pod for super::TcpRetransmitRecord {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::ConnStats {}
}

/// Byte offsets of the classic tracepoint fields the network programs read, taken by the agent
/// from `/sys/kernel/tracing/events/*/*/format` (they can move between kernels) and patched into
/// the programs as the global `NET_TP_OFFSETS`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct NetTpOffsets {
    /// `tcp_retransmit_skb.skaddr`.
    pub retrans_skaddr: u32,
    /// `tcp_retransmit_skb.state`.
    pub retrans_state: u32,
    /// `tcp_retransmit_skb.sport`.
    pub retrans_sport: u32,
    /// `tcp_retransmit_skb.dport`.
    pub retrans_dport: u32,
    /// `tcp_retransmit_skb.family`.
    pub retrans_family: u32,
    /// `tcp_retransmit_skb.saddr` (IPv4).
    pub retrans_saddr: u32,
    /// `tcp_retransmit_skb.daddr` (IPv4).
    pub retrans_daddr: u32,
    /// `tcp_retransmit_skb.saddr_v6`.
    pub retrans_saddr_v6: u32,
    /// `tcp_retransmit_skb.daddr_v6`.
    pub retrans_daddr_v6: u32,
    /// `sock_send_length.sk` (also `sock_recv_length`: the two share a format).
    pub sock_sk: u32,
    /// `sock_send_length.family`.
    pub sock_family: u32,
    /// `sock_send_length.protocol`.
    pub sock_protocol: u32,
    /// `sock_send_length.ret`.
    pub sock_ret: u32,
    /// `inet_sock_set_state.skaddr`.
    pub state_skaddr: u32,
    /// `inet_sock_set_state.newstate`.
    pub state_newstate: u32,
    /// `inet_sock_set_state.sport`.
    pub state_sport: u32,
    /// `inet_sock_set_state.dport`.
    pub state_dport: u32,
    /// `inet_sock_set_state.family`.
    pub state_family: u32,
    /// `inet_sock_set_state.protocol`.
    pub state_protocol: u32,
    /// `inet_sock_set_state.saddr`.
    pub state_saddr: u32,
    /// `inet_sock_set_state.daddr`.
    pub state_daddr: u32,
    /// `inet_sock_set_state.saddr_v6`.
    pub state_saddr_v6: u32,
    /// `inet_sock_set_state.daddr_v6`.
    pub state_daddr_v6: u32,
    /// `tcp_probe.skaddr`.
    pub probe_skaddr: u32,
    /// `tcp_probe.srtt`.
    pub probe_srtt: u32,
    /// `tcp_probe.snd_cwnd`.
    pub probe_snd_cwnd: u32,
    /// `tcp_probe.sport`.
    pub probe_sport: u32,
    /// `tcp_probe.dport`.
    pub probe_dport: u32,
    /// `tcp_probe.family`.
    pub probe_family: u32,
    /// `tcp_probe.saddr` (a `sockaddr_in` or `sockaddr_in6`).
    pub probe_saddr: u32,
    /// `tcp_probe.daddr` (a `sockaddr_in` or `sockaddr_in6`).
    pub probe_daddr: u32,
    /// Explicit padding; always 0.
    pub _pad: u32,
}
const _: () = assert!(size_of::<NetTpOffsets>() == 128);

#[cfg(feature = "user")]
mod pod_offsets {
    // SAFETY: plain old data (size pinned above).
    unsafe impl aya::Pod for super::NetTpOffsets {}
}
