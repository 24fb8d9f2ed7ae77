//! The record ABI shared by slo-probe's producers (eBPF programs, the CUPTI shim) and its consumer
//! (the agent).
//!
//! Every record starts with a [`RecordHeader`] `{ kind, version, len }`, is `#[repr(C)]`, `Copy`,
//! made only of fixed-width integers and byte arrays (so every bit pattern is a valid value), has
//! explicit padding and a pinned size. Producers write records; the agent decodes untrusted bytes
//! with [`decode`] / [`RecordIter`], which check the header against the length of the buffer and
//! never read out of bounds or panic.
//!
//! Record kinds are grouped in ranges so that families can grow without renumbering:
//!
//! | range | family | defined today |
//! |---|---|---|
//! | `0x0001..=0x00ff` | host scheduling and processes (eBPF) | [`RecordKind::RunqLatency`], [`RecordKind::ProcessEvent`] |
//! | `0x0100..=0x01ff` | host network (eBPF) | [`RecordKind::TcpRetransmit`], [`RecordKind::ConnClosed`] |
//! | `0x0200..=0x02ff` | GPU activity (CUPTI shim) | [`RecordKind::GpuKernel`], [`RecordKind::GpuGraph`], [`RecordKind::GpuMem`], [`RecordKind::GraphNode`], [`RecordKind::String`], [`RecordKind::GpuEvent`], [`RecordKind::Depth`] |
//! | `0x0300..=0x03ff` | job markers (python client, shim) | [`RecordKind::Step`] |
//!
//! Kind 0 is padding in a shared-memory ring ([`ring`]); it is never a record.
//!
//! No kernel, driver or CUDA requirement: this crate is `no_std` data definitions.
#![no_std]
#![deny(missing_docs)]

use core::{fmt, mem::size_of};

pub mod gpu;
#[cfg(feature = "host")]
pub mod host;
pub mod net;
pub mod proc;
#[cfg(not(target_arch = "bpf"))]
pub mod ring;
pub mod sched;

pub use gpu::{
    DepthRecord, GpuEventRecord, GpuGraphRecord, GpuKernelRecord, GpuMemRecord, GraphNodeRecord,
    StepRecord, StringRecord,
};
pub use net::{
    ConnClosedRecord, ConnStats, SockOffsets, TcpRetransmitRecord, TcpTuple, CONN_CLOSED,
};
pub use proc::{ProcessEventRecord, PROC_EXEC, PROC_EXIT, PROC_FORK};
pub use sched::{
    log2_slot, RunqLatencyRecord, SchedOffsets, ThreadStats, RUNQ_FLAG_PREEMPTED, RUNQ_SLOTS,
    THREAD_EXITED, THREAD_OFF_INVOLUNTARY,
};

/// Header at the start of every record.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct RecordHeader {
    /// One of [`RecordKind`] as a raw number (unknown numbers are rejected by [`decode`]).
    pub kind: u16,
    /// Layout version of that kind; bumped on any incompatible change.
    pub version: u16,
    /// Length of the whole record in bytes, header included.
    pub len: u32,
}
const _: () = assert!(size_of::<RecordHeader>() == 8);

impl RecordHeader {
    /// The header a record of type `R` carries.
    pub const fn of<R: Record>() -> Self {
        Self {
            kind: R::KIND as u16,
            version: R::VERSION,
            len: size_of::<R>() as u32,
        }
    }
}

/// The record kinds this build knows.
#[repr(u16)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordKind {
    /// [`RunqLatencyRecord`]: one run-queue wait above the outlier threshold.
    RunqLatency = 0x0001,
    /// [`ProcessEventRecord`]: fork, exec or exit of a process.
    ProcessEvent = 0x0002,
    /// [`TcpRetransmitRecord`]: one retransmitted TCP segment.
    TcpRetransmit = 0x0100,
    /// [`ConnClosedRecord`]: a followed TCP connection's last state at its close.
    ConnClosed = 0x0101,
    /// [`GpuKernelRecord`]: one kernel execution.
    GpuKernel = 0x0200,
    /// [`GpuGraphRecord`]: one CUDA graph launch (graph-level trace).
    GpuGraph = 0x0201,
    /// [`GpuMemRecord`]: one memcpy or memset.
    GpuMem = 0x0202,
    /// [`GraphNodeRecord`]: a graph node and its operator.
    GraphNode = 0x0203,
    /// [`StringRecord`]: a kernel or operator name (variable length).
    String = 0x0204,
    /// [`GpuEventRecord`]: a CUDA event reached on the GPU.
    GpuEvent = 0x0205,
    /// [`DepthRecord`]: the shim's tracing depth changed.
    Depth = 0x0206,
    /// [`StepRecord`]: an iteration marker.
    Step = 0x0300,
}

impl RecordKind {
    /// The kind for a raw header value, if this build knows it.
    pub const fn from_raw(raw: u16) -> Option<Self> {
        match raw {
            0x0001 => Some(Self::RunqLatency),
            0x0002 => Some(Self::ProcessEvent),
            0x0100 => Some(Self::TcpRetransmit),
            0x0101 => Some(Self::ConnClosed),
            0x0200 => Some(Self::GpuKernel),
            0x0201 => Some(Self::GpuGraph),
            0x0202 => Some(Self::GpuMem),
            0x0203 => Some(Self::GraphNode),
            0x0204 => Some(Self::String),
            0x0205 => Some(Self::GpuEvent),
            0x0206 => Some(Self::Depth),
            0x0300 => Some(Self::Step),
            _ => None,
        }
    }
}

/// A fixed-layout record type.
///
/// # Safety
/// Implementors are `#[repr(C)]`, contain a [`RecordHeader`] as their first field, have no
/// implicit padding, and consist only of integers and integer arrays, so that any byte pattern of
/// `size_of::<Self>()` bytes is a valid value and every byte of a value is initialised.
pub unsafe trait Record: Copy + 'static {
    /// The kind written in the header.
    const KIND: RecordKind;
    /// The layout version written in the header.
    const VERSION: u16;

    /// The record's header.
    fn header(&self) -> &RecordHeader;

    /// The record's bytes, as producers write them.
    fn as_bytes(&self) -> &[u8] {
        // SAFETY: the trait contract guarantees no padding and fully initialised bytes.
        unsafe {
            core::slice::from_raw_parts((self as *const Self).cast::<u8>(), size_of::<Self>())
        }
    }
}

/// Why bytes could not be decoded as a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// Fewer bytes than the header, or than the header's `len`, are available.
    Truncated {
        /// Bytes needed.
        need: usize,
        /// Bytes available.
        have: usize,
    },
    /// The header names a kind this build does not know.
    UnknownKind {
        /// The raw kind.
        kind: u16,
    },
    /// The kind is known but its layout version is not the one this build reads.
    WrongVersion {
        /// The raw kind.
        kind: u16,
        /// The version in the header.
        version: u16,
        /// The version this build reads.
        expected: u16,
    },
    /// The header's `len` is not the size of that kind's record.
    WrongLength {
        /// The raw kind.
        kind: u16,
        /// The length in the header.
        len: u32,
        /// The size of the record this build reads.
        expected: u32,
    },
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::Truncated { need, have } => {
                write!(f, "truncated record: need {need} bytes, have {have}")
            }
            Self::UnknownKind { kind } => write!(f, "unknown record kind {kind:#06x}"),
            Self::WrongVersion {
                kind,
                version,
                expected,
            } => write!(
                f,
                "record kind {kind:#06x} has version {version}, this build reads version \
                 {expected}; upgrade the agent or the producer so that they match"
            ),
            Self::WrongLength {
                kind,
                len,
                expected,
            } => write!(
                f,
                "record kind {kind:#06x} declares {len} bytes, its layout has {expected}"
            ),
        }
    }
}

impl core::error::Error for DecodeError {}

/// A decoded record of any known kind (strings borrow the decoded buffer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AnyRecord<'a> {
    /// See [`RunqLatencyRecord`].
    RunqLatency(RunqLatencyRecord),
    /// See [`ProcessEventRecord`].
    ProcessEvent(ProcessEventRecord),
    /// See [`TcpRetransmitRecord`].
    TcpRetransmit(TcpRetransmitRecord),
    /// See [`ConnClosedRecord`].
    ConnClosed(ConnClosedRecord),
    /// See [`GpuKernelRecord`].
    GpuKernel(GpuKernelRecord),
    /// See [`GpuGraphRecord`].
    GpuGraph(GpuGraphRecord),
    /// See [`GpuMemRecord`].
    GpuMem(GpuMemRecord),
    /// See [`GraphNodeRecord`].
    GraphNode(GraphNodeRecord),
    /// See [`StringRecord`].
    String(StringRecord<'a>),
    /// See [`GpuEventRecord`].
    GpuEvent(GpuEventRecord),
    /// See [`DepthRecord`].
    Depth(DepthRecord),
    /// See [`StepRecord`].
    Step(StepRecord),
}

/// Reads the header at the start of `bytes`.
pub fn decode_header(bytes: &[u8]) -> Result<RecordHeader, DecodeError> {
    let need = size_of::<RecordHeader>();
    match bytes.get(..need) {
        Some(h) => Ok(RecordHeader {
            kind: u16::from_ne_bytes([h[0], h[1]]),
            version: u16::from_ne_bytes([h[2], h[3]]),
            len: u32::from_ne_bytes([h[4], h[5], h[6], h[7]]),
        }),
        None => Err(DecodeError::Truncated {
            need,
            have: bytes.len(),
        }),
    }
}

/// Decodes one record of type `R` from the start of `bytes`, checking kind, version and length.
/// Bytes after the record are ignored.
pub fn decode_as<R: Record>(bytes: &[u8]) -> Result<R, DecodeError> {
    let header = decode_header(bytes)?;
    check_header::<R>(&header)?;
    let need = size_of::<R>();
    let body = bytes.get(..need).ok_or(DecodeError::Truncated {
        need,
        have: bytes.len(),
    })?;
    // SAFETY: `body` holds exactly size_of::<R>() bytes and the `Record` contract makes every byte
    // pattern a valid `R`; read_unaligned copes with any alignment of the input buffer.
    Ok(unsafe { core::ptr::read_unaligned(body.as_ptr().cast::<R>()) })
}

fn check_header<R: Record>(header: &RecordHeader) -> Result<(), DecodeError> {
    if header.kind != R::KIND as u16 {
        return Err(DecodeError::UnknownKind { kind: header.kind });
    }
    if header.version != R::VERSION {
        return Err(DecodeError::WrongVersion {
            kind: header.kind,
            version: header.version,
            expected: R::VERSION,
        });
    }
    let expected = size_of::<R>() as u32;
    if header.len != expected {
        return Err(DecodeError::WrongLength {
            kind: header.kind,
            len: header.len,
            expected,
        });
    }
    Ok(())
}

/// Decodes the record at the start of `bytes`, returning it and the number of bytes it used.
pub fn decode(bytes: &[u8]) -> Result<(AnyRecord<'_>, usize), DecodeError> {
    let header = decode_header(bytes)?;
    fn fixed<R: Record>(
        bytes: &[u8],
        wrap: fn(R) -> AnyRecord<'static>,
    ) -> Result<(AnyRecord<'static>, usize), DecodeError> {
        let r = decode_as::<R>(bytes)?;
        Ok((wrap(r), size_of::<R>()))
    }
    match RecordKind::from_raw(header.kind) {
        Some(RecordKind::GpuKernel) => fixed(bytes, AnyRecord::GpuKernel),
        Some(RecordKind::GpuGraph) => fixed(bytes, AnyRecord::GpuGraph),
        Some(RecordKind::GpuMem) => fixed(bytes, AnyRecord::GpuMem),
        Some(RecordKind::GraphNode) => fixed(bytes, AnyRecord::GraphNode),
        Some(RecordKind::Step) => fixed(bytes, AnyRecord::Step),
        Some(RecordKind::GpuEvent) => fixed(bytes, AnyRecord::GpuEvent),
        Some(RecordKind::Depth) => fixed(bytes, AnyRecord::Depth),
        Some(RecordKind::String) => {
            StringRecord::decode(bytes).map(|(s, used)| (AnyRecord::String(s), used))
        }
        Some(RecordKind::RunqLatency) => {
            let r = decode_as::<RunqLatencyRecord>(bytes)?;
            Ok((AnyRecord::RunqLatency(r), header.len as usize))
        }
        Some(RecordKind::ProcessEvent) => {
            let r = decode_as::<ProcessEventRecord>(bytes)?;
            Ok((AnyRecord::ProcessEvent(r), header.len as usize))
        }
        Some(RecordKind::TcpRetransmit) => {
            let r = decode_as::<TcpRetransmitRecord>(bytes)?;
            Ok((AnyRecord::TcpRetransmit(r), header.len as usize))
        }
        Some(RecordKind::ConnClosed) => {
            let r = decode_as::<ConnClosedRecord>(bytes)?;
            Ok((AnyRecord::ConnClosed(r), header.len as usize))
        }
        None => Err(DecodeError::UnknownKind { kind: header.kind }),
    }
}

/// Iterates over records laid end to end in a buffer. After the first error it yields `None`:
/// a corrupt length makes every later boundary a guess, so the rest of the buffer is dropped and
/// its size reported by [`RecordIter::dropped_bytes`] (the consumer counts it under
/// [`Counter::DecodeFailed`]).
pub struct RecordIter<'a> {
    rest: &'a [u8],
    dropped: usize,
}

impl<'a> RecordIter<'a> {
    /// Iterates over the records in `bytes`.
    pub const fn new(bytes: &'a [u8]) -> Self {
        Self {
            rest: bytes,
            dropped: 0,
        }
    }

    /// Bytes given up after a decoding error (0 while every record decoded).
    pub const fn dropped_bytes(&self) -> usize {
        self.dropped
    }
}

impl<'a> Iterator for RecordIter<'a> {
    type Item = Result<AnyRecord<'a>, DecodeError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        match decode(self.rest) {
            Ok((record, used)) => {
                // `decode` checked that `used` bytes are present.
                self.rest = self.rest.get(used..).unwrap_or_default();
                Some(Ok(record))
            }
            Err(e) => {
                self.dropped = self.rest.len();
                self.rest = &[];
                Some(Err(e))
            }
        }
    }
}

/// Drop and error counters, one slot each in the per-CPU `COUNTERS` map of the eBPF programs
/// (and in the agent's own tallies for the userspace side). Exported as
/// `slo_probe_events_dropped_total{reason}` / `slo_probe_errors_total{reason}`.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counter {
    /// An outlier could not be reserved in the ring buffer (userspace too slow): dropped.
    RingbufFull = 0,
    /// The per-thread map was full: a thread is not followed.
    ThreadMapFull = 1,
    /// A kernel memory read (`bpf_probe_read_kernel`) failed.
    ProbeReadFailed = 2,
    /// Outliers sent through the ring buffer (not an error; the denominator of the drop rate).
    OutliersSent = 3,
    /// Bytes that the agent could not decode as a record.
    DecodeFailed = 4,
    /// The process-target map was full: a forked process of the job is not followed.
    TrackedMapFull = 5,
    /// The connection map was full: a connection is not followed.
    ConnMapFull = 6,
    /// A process or network event could not be reserved in its ring buffer: dropped.
    EventRingFull = 7,
}

impl Counter {
    /// Number of counters, the size of the `COUNTERS` map.
    pub const COUNT: u32 = 8;
    /// Every counter, in slot order.
    pub const ALL: [Counter; Self::COUNT as usize] = [
        Self::RingbufFull,
        Self::ThreadMapFull,
        Self::ProbeReadFailed,
        Self::OutliersSent,
        Self::DecodeFailed,
        Self::TrackedMapFull,
        Self::ConnMapFull,
        Self::EventRingFull,
    ];

    /// Stable snake_case name, used as a metric label.
    pub const fn name(self) -> &'static str {
        match self {
            Self::RingbufFull => "ringbuf_full",
            Self::ThreadMapFull => "thread_map_full",
            Self::ProbeReadFailed => "probe_read_failed",
            Self::OutliersSent => "outliers_sent",
            Self::DecodeFailed => "decode_failed",
            Self::TrackedMapFull => "tracked_map_full",
            Self::ConnMapFull => "conn_map_full",
            Self::EventRingFull => "event_ring_full",
        }
    }

    /// Whether the counter counts lost data (a drop) rather than an error or a volume.
    pub const fn is_drop(self) -> bool {
        matches!(
            self,
            Self::RingbufFull
                | Self::ThreadMapFull
                | Self::TrackedMapFull
                | Self::ConnMapFull
                | Self::EventRingFull
        )
    }
}

#[cfg(test)]
mod tests;
