//! Root tier: the TCP probes against a link the test builds and makes lossy on purpose.
//!
//! Two network namespaces joined by a veth pair. Random loss: in the receiving namespace an
//! nftables rule drops a share of the segments arriving on one port (`numgen random mod 100 < N
//! drop`), the other port is clean. Congestion loss: the sender's own veth gets a token-bucket
//! qdisc slower than the sender with a short queue, which overflows (its drops include
//! retransmissions, which the kernel counts although the tracepoint reports the call failed). A
//! sender thread of this process moves into the sending namespace and writes a fixed amount; a
//! receiver thread in the other namespace reads it. The independent measures: the kernel's own
//! per-socket `TCP_INFO.tcpi_total_retrans`, the sending namespace's `nstat` `TcpRetransSegs`
//! (the only connection there), and the byte counts the test itself wrote and read.
//!
//! Traffic stays inside the namespaces the test creates.

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    os::fd::AsRawFd,
    process::Command,
    sync::Mutex,
    time::Duration,
};

use slo_probe::sources::ebpf::{
    EbpfSettings, Probes, Selection, NET_PROGRAMS, PROC_PROGRAMS, SCHED_PROGRAMS,
};
use slo_probe_common::{decode, AnyRecord, ConnStats, CONN_CLOSED};
use slo_probe_tests::{gettid, root_or_skip};

static SERIAL: Mutex<()> = Mutex::new(());

const LOSSY_PORT: u16 = 40001;
const CLEAN_PORT: u16 = 40002;
const BYTES: usize = 8 << 20;

fn sh(cmd: &str) {
    let out = Command::new("sh").arg("-c").arg(cmd).output().expect("sh");
    assert!(
        out.status.success(),
        "`{cmd}` failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Two namespaces and a veth pair; removed on drop.
struct Link {
    tx: String,
    rx: String,
    rx_addr: String,
}

impl Link {
    fn new(loss_percent: u32) -> Self {
        Self::with_tx_qdisc(loss_percent, None)
    }

    /// `tx_qdisc`: a root qdisc for the sender's veth (`tc qdisc add dev <veth> root ...`).
    fn with_tx_qdisc(loss_percent: u32, tx_qdisc: Option<&str>) -> Self {
        let id = std::process::id() % 10_000;
        let (tx, rx) = (format!("slotx{id}"), format!("slorx{id}"));
        let subnet = 10 + id % 200;
        let tx_addr = format!("10.231.{subnet}.1");
        let rx_addr = format!("10.231.{subnet}.2");
        let _ = Command::new("ip").args(["netns", "del", &tx]).output();
        let _ = Command::new("ip").args(["netns", "del", &rx]).output();
        sh(&format!(
            "ip netns add {tx} && ip netns add {rx} && \
             ip link add vt{id} netns {tx} type veth peer name vr{id} netns {rx} && \
             ip -n {tx} addr add {tx_addr}/24 dev vt{id} && ip -n {rx} addr add {rx_addr}/24 dev vr{id} && \
             ip -n {tx} link set vt{id} up && ip -n {rx} link set vr{id} up && \
             ip -n {tx} link set lo up && ip -n {rx} link set lo up"
        ));
        sh(&format!(
            "ip netns exec {rx} nft -f - <<'EOF'\n\
             table inet slo_loss {{\n\
               chain input {{\n\
                 type filter hook input priority 0; policy accept;\n\
                 tcp dport {LOSSY_PORT} numgen random mod 100 < {loss_percent} drop\n\
               }}\n\
             }}\n\
             EOF"
        ));
        if let Some(q) = tx_qdisc {
            sh(&format!(
                "ip netns exec {tx} tc qdisc add dev vt{id} root {q}"
            ));
        }
        Self { tx, rx, rx_addr }
    }

    /// A counter of the sending namespace (`nstat`, absolute: the namespace is new).
    fn tx_counter(&self, name: &str) -> u64 {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.tx, "nstat", "-asz", name])
            .output()
            .expect("nstat");
        assert!(out.status.success(), "nstat: {:?}", out);
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .find_map(|l| {
                let mut w = l.split_whitespace();
                (w.next() == Some(name)).then(|| w.next()?.parse().ok())?
            })
            .unwrap_or(0)
    }

    /// Packets the sender's qdisc dropped.
    fn tx_qdisc_drops(&self) -> u64 {
        let id = std::process::id() % 10_000;
        let out = Command::new("ip")
            .args([
                "netns", "exec", &self.tx, "tc", "-s", "qdisc", "show", "dev",
            ])
            .arg(format!("vt{id}"))
            .output()
            .expect("tc");
        let text = String::from_utf8_lossy(&out.stdout);
        text.split_once("dropped ")
            .and_then(|(_, rest)| {
                rest.split(|c: char| !c.is_ascii_digit())
                    .next()?
                    .parse()
                    .ok()
            })
            .unwrap_or(0)
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.tx]).output();
        let _ = Command::new("ip").args(["netns", "del", &self.rx]).output();
    }
}

/// Moves the calling thread into a named network namespace.
fn enter_netns(name: &str) {
    let f = std::fs::File::open(format!("/var/run/netns/{name}")).expect("netns file");
    // SAFETY: a valid namespace fd; affects only the calling thread.
    let rc = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(
        rc,
        0,
        "setns into {name}: {}",
        std::io::Error::last_os_error()
    );
}

/// `TCP_INFO.tcpi_total_retrans` of a socket.
fn total_retrans(s: &TcpStream) -> u32 {
    // struct tcp_info: tcpi_total_retrans is the u32 at byte offset 100.
    let mut buf = [0u8; 232];
    let mut len = buf.len() as libc::socklen_t;
    // SAFETY: a valid socket and a buffer of `len` bytes.
    let rc = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            buf.as_mut_ptr().cast(),
            &mut len,
        )
    };
    assert_eq!(rc, 0, "TCP_INFO");
    u32::from_ne_bytes([buf[100], buf[101], buf[102], buf[103]])
}

struct Transfer {
    sender_tid: u32,
    receiver_tid: u32,
    sent: usize,
    received: usize,
    retrans: u32,
    local_port: u16,
}

/// Sends `BYTES` from the tx namespace to `port` in the rx namespace.
fn transfer(link: &Link, port: u16) -> Transfer {
    let addr: SocketAddr = format!("{}:{port}", link.rx_addr).parse().expect("addr");
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let rx_ns = link.rx.clone();
    let receiver = std::thread::Builder::new()
        .name("comm-rx".into())
        .spawn(move || {
            enter_netns(&rx_ns);
            let l = TcpListener::bind(addr).expect("bind");
            ready_tx.send(()).expect("ready");
            let (mut s, _) = l.accept().expect("accept");
            let mut buf = vec![0u8; 64 * 1024];
            let mut total = 0;
            loop {
                match s.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => total += n,
                    Err(e) => panic!("read: {e}"),
                }
            }
            (gettid(), total)
        })
        .expect("spawn receiver");
    ready_rx.recv().expect("receiver ready");
    let tx_ns = link.tx.clone();
    let sender = std::thread::Builder::new()
        .name("comm-tx".into())
        .spawn(move || {
            enter_netns(&tx_ns);
            let mut s =
                TcpStream::connect_timeout(&addr, Duration::from_secs(10)).expect("connect");
            let chunk = vec![0x5au8; 64 * 1024];
            let mut sent = 0;
            while sent < BYTES {
                s.write_all(&chunk).expect("write");
                sent += chunk.len();
            }
            s.flush().expect("flush");
            s.shutdown(std::net::Shutdown::Write).expect("shutdown");
            // Wait for the peer to finish reading, so that no retransmission is still pending.
            let mut b = [0u8; 1];
            let _ = s.read(&mut b);
            let local_port = s.local_addr().expect("local").port();
            (gettid(), sent, total_retrans(&s), local_port)
        })
        .expect("spawn sender");
    let (sender_tid, sent, retrans, local_port) = sender.join().expect("sender");
    let (receiver_tid, received) = receiver.join().expect("receiver");
    Transfer {
        sender_tid,
        receiver_tid,
        sent,
        received,
        retrans,
        local_port,
    }
}

fn settings() -> EbpfSettings {
    EbpfSettings {
        targets: Some(vec![std::process::id()]),
        ..Default::default()
    }
}

/// The connection of `tid` from `local_port`: its map entry, or, once closed, the final state
/// the kernel handed over in a `ConnClosedRecord` (its map entry is gone then, so that a new
/// socket at the same address cannot overwrite it).
fn conn_of(
    read: &slo_probe::sources::ebpf::EbpfRead,
    tid: u32,
    local_port: u16,
) -> Option<ConnStats> {
    let closed = read.records.iter().filter_map(|b| match decode(b) {
        Ok((AnyRecord::ConnClosed(r), _)) => Some(r.stats),
        _ => None,
    });
    read.conns
        .iter()
        .map(|c| c.stats)
        .chain(closed)
        .find(|c| c.tid == tid && c.tuple.sport == local_port)
}

fn thread_bytes(read: &slo_probe::sources::ebpf::EbpfRead, tid: u32) -> (u64, u64) {
    read.threads
        .iter()
        .find(|t| t.tid == tid)
        .map_or((0, 0), |t| (t.stats.tcp_sent_bytes, t.stats.tcp_recv_bytes))
}

#[test]
fn retransmits_on_a_lossy_link_and_exactly_those_of_a_clean_one() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !root_or_skip("tcp_retransmits") {
        return;
    }
    let link = Link::new(5);
    let mut probes = Probes::load(&settings()).expect("load probes");
    assert!(
        probes.statuses().iter().any(|s| s.name == "tcp" && s.up),
        "TCP probes down: {:?}",
        probes.statuses()
    );

    let lossy = transfer(&link, LOSSY_PORT);
    let clean = transfer(&link, CLEAN_PORT);
    let read = probes.read().expect("read");

    let l = conn_of(&read, lossy.sender_tid, lossy.local_port).unwrap_or_else(|| {
        panic!(
            "lossy connection (tid {}, port {}) not followed; connections: {:?}",
            lossy.sender_tid,
            lossy.local_port,
            read.conns
                .iter()
                .map(|c| (
                    c.stats.tid,
                    c.stats.tuple.sport,
                    c.stats.tuple.dport,
                    c.stats.retransmits
                ))
                .collect::<Vec<_>>()
        )
    });
    let c = conn_of(&read, clean.sender_tid, clean.local_port).expect("clean connection followed");
    eprintln!(
        "lossy link (5% drop): probe {} retransmits | TCP_INFO total_retrans {} | srtt {} us, cwnd {} | {}",
        l.retransmits,
        lossy.retrans,
        l.srtt_us,
        l.snd_cwnd,
        if l.flags & CONN_CLOSED != 0 { "closed (final state from the close record)" } else { "open" }
    );
    eprintln!(
        "clean link: probe {} retransmits | TCP_INFO total_retrans {}",
        c.retransmits, clean.retrans
    );
    assert!(
        lossy.retrans > 10,
        "the link lost too little: {}",
        lossy.retrans
    );
    assert_eq!(l.retransmits, u64::from(lossy.retrans), "lossy retransmits");
    assert_eq!(c.retransmits, u64::from(clean.retrans), "clean retransmits");
    // The clean link drops nothing, but on a loaded 2-core machine a receiver that is not
    // scheduled in time makes the sender fire tail-loss probes and timeouts (seen in CI: 91
    // against the lossy link's 343). Those are real retransmits of that connection, and the
    // probe must count exactly them, no more: the equality above is the check, not zero.
    assert_eq!(l.tgid, std::process::id());
    assert!(l.srtt_us > 0 && l.snd_cwnd > 0, "{l:?}");
    assert_eq!(l.tuple.dport, LOSSY_PORT);

    // Bytes per thread against what the test wrote and read.
    let (tx_sent, _) = thread_bytes(&read, lossy.sender_tid);
    let (_, rx_recv) = thread_bytes(&read, lossy.receiver_tid);
    eprintln!(
        "bytes: sender thread {tx_sent} (wrote {}), receiver thread {rx_recv} (read {})",
        lossy.sent, lossy.received
    );
    assert_eq!(tx_sent, lossy.sent as u64);
    assert_eq!(rx_recv, lossy.received as u64);
    assert_eq!(lossy.received, lossy.sent);

    // The retransmissions came through the ring buffer too, with the owner.
    let records: Vec<slo_probe_common::TcpRetransmitRecord> = read
        .records
        .iter()
        .filter_map(|b| slo_probe_common::decode_as(b).ok())
        .filter(|r: &slo_probe_common::TcpRetransmitRecord| r.tuple.sport == lossy.local_port)
        .collect();
    let segments: u64 = records.iter().map(|r| u64::from(r.segments)).sum();
    eprintln!(
        "ring: {} retransmit records carrying {segments} segments",
        records.len()
    );
    assert_eq!(segments, l.retransmits);
    assert!(records.iter().all(|r| r.tid == lossy.sender_tid));
}

/// Without the retransmit program the same check fails: the probe sees none.
#[test]
fn check_fails_without_the_retransmit_program() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !root_or_skip("tcp_check_fails") {
        return;
    }
    let link = Link::new(5);
    let only: Vec<&'static str> = SCHED_PROGRAMS
        .into_iter()
        .chain(PROC_PROGRAMS)
        .chain(NET_PROGRAMS)
        .filter(|n| *n != "tcp_retransmit_skb")
        .collect();
    let mut probes =
        Probes::load_selected(&settings(), &Selection { only: Some(only) }).expect("load");
    let lossy = transfer(&link, LOSSY_PORT);
    let read = probes.read().expect("read");
    let seen = conn_of(&read, lossy.sender_tid, lossy.local_port).map_or(0, |c| c.retransmits);
    eprintln!(
        "broken probe: {seen} retransmits seen, TCP_INFO says {}",
        lossy.retrans
    );
    assert!(lossy.retrans > 10);
    assert_ne!(seen, u64::from(lossy.retrans));
}

/// Congestion loss: the sender's own link queue overflows. The kernel counts a retransmission
/// when it hands the buffer to the device, also when the full local queue then drops it (the
/// tracepoint reports that call with an error); the probe must count what the kernel counts.
#[test]
fn retransmits_under_congestion_loss_match_the_kernel() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !root_or_skip("tcp_congestion") {
        return;
    }
    // 100 Mbit/s with a 30 KB queue: a sender on veth (no pacing limit of its own) overflows it.
    let link = Link::with_tx_qdisc(0, Some("tbf rate 100mbit burst 32kbit limit 30000"));
    let mut probes = Probes::load(&settings()).expect("load probes");
    let t = transfer(&link, CLEAN_PORT);
    let read = probes.read().expect("read");
    let c = conn_of(&read, t.sender_tid, t.local_port).expect("connection followed");
    let nstat = link.tx_counter("TcpRetransSegs");
    let failed = link.tx_counter("TcpExtTCPRetransFail");
    let drops = link.tx_qdisc_drops();
    eprintln!(
        "congested link: probe {} retransmits | TCP_INFO total_retrans {} | nstat RetransSegs \
         {nstat} | retransmissions the local queue dropped (TCPRetransFail) {failed} | qdisc \
         drops {drops}",
        c.retransmits, t.retrans
    );
    assert!(
        drops > 0,
        "the queue never overflowed: no congestion loss to count"
    );
    assert!(
        t.retrans > 10,
        "too few retransmits to compare: {}",
        t.retrans
    );
    assert_eq!(t.received, t.sent);
    // TCP_INFO and nstat are the kernel's own counts of this one connection: within 1%.
    let within = |probe: u64, kernel: u64| probe.abs_diff(kernel) * 100 <= kernel;
    assert!(
        within(c.retransmits, u64::from(t.retrans)),
        "probe {} vs TCP_INFO {}",
        c.retransmits,
        t.retrans
    );
    assert!(
        within(c.retransmits, nstat),
        "probe {} vs nstat RetransSegs {nstat}",
        c.retransmits
    );
    let segments: u64 = read
        .records
        .iter()
        .filter_map(|b| slo_probe_common::decode_as(b).ok())
        .filter(|r: &slo_probe_common::TcpRetransmitRecord| r.tuple.sport == t.local_port)
        .map(|r| u64::from(r.segments))
        .sum();
    // Thousands of retransmissions in a second outrun the 64 KiB event ring between two reads:
    // those records are dropped and counted; the per-connection count above does not depend on
    // them.
    let dropped = read.counters[slo_probe_common::Counter::EventRingFull as usize];
    eprintln!("ring: {segments} segments in records, {dropped} records dropped (ring full)");
    if dropped == 0 {
        assert_eq!(
            segments, c.retransmits,
            "ring records vs the connection's count"
        );
    } else {
        // The dropped records may be other events' (or another connection's): at most the count
        // (clean-clone CI 2026-12-05: 2 dropped, 1490 of 1490 segments in records).
        assert!(segments <= c.retransmits, "{segments} vs {}", c.retransmits);
    }
}
