//! The shared-memory ring between the CUPTI shim (one producer, inside the training process)
//! and the agent (one consumer). A [`RingHeader`] page, then `capacity` bytes of records, each
//! 8-byte aligned, never split at the end of the buffer (a padding record of kind 0 fills the
//! rest instead).
//!
//! - The producer never blocks: a record that does not fit is dropped and counted.
//! - `head` (bytes committed) is published with release ordering only after a record is fully
//!   written, so a producer that dies mid-write leaves nothing half-visible.
//! - `tail` (bytes consumed) lives in the shared header, so a restarted agent continues where the
//!   previous one stopped.
//! - The consumer treats the memory as untrusted: every length is checked, a corrupt one makes
//!   it skip to `head`, counted, and nothing is read outside the buffer.
//!
//! ## Tracing depth: the `control` and `depth` words
//!
//! The agent asks a shim for a tracing depth (`gpu::DEPTH_*`: 0 timing, 1 kernels, 2 graph
//! nodes) by storing a request in [`RingHeader::control`] ([`encode_depth_request`]):
//!
//! ```text
//!  63                 32 31  30..28 27..24 23                 0
//! +--------------------+---+------+------+--------------------+
//! |     generation     | U |  0   | depth|      duration      |
//! +--------------------+---+------+------+--------------------+
//! ```
//! - generation (32 bits, never 0): the shim applies a request once, when the generation differs
//!   from the last one it applied, and then echoes it in [`RingHeader::control_ack`].
//! - U (bit 31): unit of the duration, 0 = steps (iterations the script marks), 1 = 100 ms. A
//!   duration in steps for a process that marks no steps counts 100 ms per step.
//! - depth (bits 24..27): the depth wanted, 0..=2. The shim runs at the highest of the agent's
//!   request, the script's request, a sample window and its configured tier; a request for depth
//!   0 withdraws the agent's request.
//! - duration (24 bits): how long the request holds; 0 = until the next request.
//!
//! The shim publishes where it is in [`RingHeader::depth`] ([`decode_shim_depth`]):
//!
//! ```text
//!  63 62                    32 31              16 15      8 7       0
//! +--+------------------------+------------------+---------+---------+
//! |M |   period (31 bits)     |  window (16 b)   | reason  |  depth  |
//! +--+------------------------+------------------+---------+---------+
//! ```
//! - depth: the current depth (`gpu::DEPTH_*`, 0xff = off); reason: `gpu::DEPTH_REASON_*`.
//! - window and period: the duty cycle of the always-on tier: kernels are traced for `window`
//!   out of every `period` (both saturate; period 0 = no sampling). M (bit 63): their unit, 0 =
//!   steps, 1 = milliseconds (a process that marks no steps is sampled by time).
//!
//! ## What the shim costs the job
//!
//! The shim counts its own time on the launching threads: [`RingHeader::callback_ns`] (time
//! inside its CUPTI callbacks), [`RingHeader::launches_seen`], [`RingHeader::kernel_records`],
//! [`RingHeader::sampled_steps`]. CUPTI's own work per kernel record (instrumenting the launch,
//! filling the record) happens inside the driver, where the shim cannot time it: it is
//! estimated as `kernel_records × record_cost_ns` ([`SHIM_COST_PER_KERNEL_RECORD_NS`] unless
//! the shim was told otherwise). [`ShimCounters::estimated_cost_ns`] adds both; over an interval,
//! its growth divided by the time the process spent in steps is the shim's share of step time.

use core::{
    mem::{offset_of, size_of},
    ptr,
    sync::atomic::{AtomicU32, AtomicU64, Ordering},
};

use crate::RecordHeader;

/// `RingHeader::magic`.
pub const RING_MAGIC: u64 = u64::from_le_bytes(*b"SLORING1");
/// Layout version of the ring (2: depth control, self-accounting counters).
pub const RING_VERSION: u32 = 2;
/// Bytes before the data area (one page).
pub const RING_HEADER_LEN: usize = 4096;

/// [`RingHeader::status`] bit: the shim is subscribed to CUPTI and tracing.
pub const STATUS_TRACING: u64 = 1;
/// [`RingHeader::status`] bit: the shim is connected to an agent.
pub const STATUS_CONNECTED: u64 = 1 << 1;
/// [`RingHeader::status`] bit: another CUPTI subscriber was first; the shim does not trace.
pub const STATUS_LOST_RACE: u64 = 1 << 2;
/// [`RingHeader::status`] bit: node-level (diagnostic) graph tracing is on.
pub const STATUS_DIAGNOSTIC: u64 = 1 << 3;
/// [`RingHeader::status`] bit: CUPTI was handed to another tool (`slo_probe.cupti_released()`).
pub const STATUS_RELEASED: u64 = 1 << 4;
/// [`RingHeader::status`] bit: kernels are traced now (depth 1 or 2).
pub const STATUS_KERNELS: u64 = 1 << 5;
/// [`RingHeader::status`] bit: the process launches CUDA graphs and the shim answers requests
/// for node level (depth 2) with kernel level (`SLO_PROBE_GRAPH_NODES`), so the agent does not
/// ask it for node-level samples.
pub const STATUS_NO_GRAPH_NODES: u64 = 1 << 6;
/// [`RingHeader::status`] bit: the GPU runs far behind the process's launches, and the shim
/// switches kernel tracing only at the exit of synchronising calls (`SLO_PROBE_TOGGLE_AT_SYNC`),
/// so a sample window or a requested depth starts and ends at the job's next such call.
pub const STATUS_DRAINED_SWITCHING: u64 = 1 << 7;

/// Estimated time CUPTI itself spends on the launching thread per kernel record
/// (`CONCURRENT_KERNEL` instrumentation), which the shim cannot measure: 4 µs. Calibrated with
/// `scripts/gpu-overhead` on an H200 (CUDA 13.0, PyTorch 2.11) in the launch-bound regime,
/// where the host's time per launch is the step time: depth 1 against CUPTI released, less the
/// shim's own callback time, came to 4.08, 3.69 and 3.73 µs per record in three calls
/// (2026-12-02, 2026-12-04, 2026-12-05; `bench/results/gpu-overhead-h200.md`). It was 1.5 µs
/// before, from shared/research/cupti.md §9, so the duty cycle cost ~2.5× its budget there.
/// A shim started with `SLO_PROBE_RECORD_COST_NS` publishes its own figure in
/// [`RingHeader::record_cost_ns`].
pub const SHIM_COST_PER_KERNEL_RECORD_NS: u64 = 4_000;

/// The shortest a shim's sample window stays open after its steps, ns, even when the GPU keeps
/// up with the launches. The agent counts an iteration as traced only if kernel tracing stayed
/// on 20 ms after the GPU finished it (`TRACED_MARGIN_NS` in slo-probe-core: its last records
/// may reach the flush that the depth change makes), so a window of 5 steps under ~4 ms each
/// ended before any of its steps counted. In the known-answer simulator with sampling on
/// (`synth::sampled`), top-1 went 59/70 → 69/70 with this drain.
pub const SHIM_MIN_DRAIN_NS: u64 = 25_000_000;

/// `ShimHello::magic`.
pub const HELLO_MAGIC: u64 = u64::from_le_bytes(*b"SLOHELO1");

/// The message a shim sends when it connects to the agent's Unix socket, with the ring's memfd
/// attached (`SCM_RIGHTS`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShimHello {
    /// [`HELLO_MAGIC`].
    pub magic: u64,
    /// [`RING_VERSION`].
    pub version: u32,
    /// The training process.
    pub pid: u32,
    /// Bytes mapped (header + capacity).
    pub ring_len: u64,
    /// `cuptiGetVersion` (0 when CUPTI is not in use).
    pub cupti_version: u32,
    /// `STATUS_*` bits at connection time.
    pub status: u32,
}
const _: () = assert!(size_of::<ShimHello>() == 32);

impl ShimHello {
    /// The message's bytes.
    pub fn to_bytes(&self) -> [u8; 32] {
        let mut out = [0u8; 32];
        out[..8].copy_from_slice(&self.magic.to_ne_bytes());
        out[8..12].copy_from_slice(&self.version.to_ne_bytes());
        out[12..16].copy_from_slice(&self.pid.to_ne_bytes());
        out[16..24].copy_from_slice(&self.ring_len.to_ne_bytes());
        out[24..28].copy_from_slice(&self.cupti_version.to_ne_bytes());
        out[28..32].copy_from_slice(&self.status.to_ne_bytes());
        out
    }

    /// Parses a message; `None` unless it is a hello of this version.
    pub fn from_bytes(b: &[u8]) -> Option<Self> {
        let b: &[u8; 32] = b.get(..32)?.try_into().ok()?;
        let u32_at = |i: usize| u32::from_ne_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at = |i: usize| {
            u64::from_ne_bytes([
                b[i],
                b[i + 1],
                b[i + 2],
                b[i + 3],
                b[i + 4],
                b[i + 5],
                b[i + 6],
                b[i + 7],
            ])
        };
        let h = Self {
            magic: u64_at(0),
            version: u32_at(8),
            pid: u32_at(12),
            ring_len: u64_at(16),
            cupti_version: u32_at(24),
            status: u32_at(28),
        };
        (h.magic == HELLO_MAGIC && h.version == RING_VERSION).then_some(h)
    }
}

/// The first page of the shared memory.
#[repr(C)]
pub struct RingHeader {
    /// [`RING_MAGIC`].
    pub magic: u64,
    /// [`RING_VERSION`].
    pub version: u32,
    /// [`RING_HEADER_LEN`].
    pub header_len: u32,
    /// Size of the data area, a power of two.
    pub capacity: u64,
    /// Process id of the producer.
    pub pid: u32,
    /// API domains whose kernel-launch callbacks the shim uses now: 1 driver, 2 runtime.
    pub launch_domains: AtomicU32,
    /// Step end markers seen.
    pub steps_seen: AtomicU64,
    /// Depth changes made.
    pub depth_changes: AtomicU64,
    /// Time the shim spent switching CUPTI (enabling, disabling, flushing around it), ns, on
    /// its own thread.
    pub toggle_ns: AtomicU64,
    /// CUPTI's estimated cost per kernel record that the shim assumes, ns
    /// ([`SHIM_COST_PER_KERNEL_RECORD_NS`] unless configured).
    pub record_cost_ns: AtomicU64,
    /// Bytes committed by the producer (monotonic). Producer-owned cache line.
    pub head: AtomicU64,
    /// Records committed.
    pub records: AtomicU64,
    /// Records dropped because the ring was full.
    pub dropped_records: AtomicU64,
    /// Bytes of the dropped records.
    pub dropped_bytes: AtomicU64,
    /// Records CUPTI itself dropped (`cuptiActivityGetNumDroppedRecords`).
    pub cupti_dropped: AtomicU64,
    _pad1: [u64; 3],
    /// Bytes consumed by the agent (monotonic). Consumer-owned cache line.
    pub tail: AtomicU64,
    /// Bytes the consumer skipped as corrupt.
    pub corrupt_bytes: AtomicU64,
    _pad2: [u64; 6],
    /// Depth requests from the agent ([`encode_depth_request`]; layout in the module docs).
    pub control: AtomicU64,
    /// The shim's state: `STATUS_*` bits.
    pub status: AtomicU64,
    /// The shim's depth and duty cycle ([`decode_shim_depth`]).
    pub depth: AtomicU64,
    /// Generation of the last agent request the shim applied (low 32 bits).
    pub control_ack: AtomicU64,
    /// Time spent inside the shim's callbacks on the launching threads, ns.
    pub callback_ns: AtomicU64,
    /// Launch callbacks taken (kernel and graph launches).
    pub launches_seen: AtomicU64,
    /// Kernel records CUPTI delivered.
    pub kernel_records: AtomicU64,
    /// Step end markers seen while kernels were traced (depth 1 or 2).
    pub sampled_steps: AtomicU64,
}
const _: () = assert!(size_of::<RingHeader>() == 256);
const _: () = assert!(size_of::<RingHeader>() <= RING_HEADER_LEN);
// One cache line per writer: init and the shim's slow counters, the producer, the consumer, the
// control words and the shim's accounting.
const _: () = assert!(offset_of!(RingHeader, head) == 64);
const _: () = assert!(offset_of!(RingHeader, tail) == 128);
const _: () = assert!(offset_of!(RingHeader, control) == 192);

/// How long a depth request holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DepthDuration {
    /// Until the next request.
    UntilNext,
    /// For this many steps (1..2^24), or 100 ms per step for a process that marks none.
    Steps(u32),
    /// For this many 100 ms units (1..2^24).
    Tenths(u32),
}

/// A depth request as the shim reads it from [`RingHeader::control`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DepthRequest {
    /// Changes with every new request; never 0.
    pub generation: u32,
    /// `gpu::DEPTH_*` (0..=2).
    pub depth: u32,
    /// How long it holds.
    pub duration: DepthDuration,
}

const DURATION_MAX: u32 = (1 << 24) - 1;
const UNIT_TENTHS: u64 = 1 << 31;

/// The control word asking for `depth` (clamped to 0..=2) for `duration` (clamped to 24 bits),
/// as request `generation` (use [`next_generation`] of the current word).
pub const fn encode_depth_request(generation: u32, depth: u32, duration: DepthDuration) -> u64 {
    let depth = if depth > 2 { 2 } else { depth } as u64;
    let (unit, n) = match duration {
        DepthDuration::UntilNext => (0, 0),
        DepthDuration::Steps(n) => (0, if n > DURATION_MAX { DURATION_MAX } else { n }),
        DepthDuration::Tenths(n) => (UNIT_TENTHS, if n > DURATION_MAX { DURATION_MAX } else { n }),
    };
    ((generation as u64) << 32) | unit | (depth << 24) | n as u64
}

/// The generation after the one in control word `word` (skips 0, which means "no request").
pub const fn next_generation(word: u64) -> u32 {
    let g = ((word >> 32) as u32).wrapping_add(1);
    if g == 0 {
        1
    } else {
        g
    }
}

/// The request in control word `word`; `None` when no request was ever made (generation 0).
/// A depth above 2 reads as 2.
pub const fn decode_depth_request(word: u64) -> Option<DepthRequest> {
    let generation = (word >> 32) as u32;
    if generation == 0 {
        return None;
    }
    let depth = ((word >> 24) & 0xf) as u32;
    let n = (word & DURATION_MAX as u64) as u32;
    let duration = if n == 0 {
        DepthDuration::UntilNext
    } else if word & UNIT_TENTHS != 0 {
        DepthDuration::Tenths(n)
    } else {
        DepthDuration::Steps(n)
    };
    Some(DepthRequest {
        generation,
        depth: if depth > 2 { 2 } else { depth },
        duration,
    })
}

/// The shim's depth and duty cycle, as published in [`RingHeader::depth`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ShimDepth {
    /// `gpu::DEPTH_*` (0xff = off).
    pub depth: u32,
    /// `gpu::DEPTH_REASON_*`.
    pub reason: u32,
    /// Length of a sample window (steps, or ms when `millis`), saturating at 65535.
    pub window: u32,
    /// One window starts every `period` (steps, or ms when `millis`), saturating at 2^31 - 1;
    /// 0 = no sampling.
    pub period: u32,
    /// `window` and `period` are in milliseconds (the process marks no steps), else steps.
    pub millis: bool,
}

/// The word the shim stores in [`RingHeader::depth`] for `d`.
pub const fn encode_shim_depth(d: ShimDepth) -> u64 {
    let window = if d.window > 0xffff { 0xffff } else { d.window } as u64;
    let period = if d.period > 0x7fff_ffff {
        0x7fff_ffff
    } else {
        d.period
    } as u64;
    ((d.millis as u64) << 63)
        | (period << 32)
        | (window << 16)
        | (((d.reason & 0xff) as u64) << 8)
        | (d.depth & 0xff) as u64
}

/// The shim's depth and duty cycle from the word in [`RingHeader::depth`].
pub const fn decode_shim_depth(word: u64) -> ShimDepth {
    ShimDepth {
        depth: (word & 0xff) as u32,
        reason: ((word >> 8) & 0xff) as u32,
        window: ((word >> 16) & 0xffff) as u32,
        period: ((word >> 32) & 0x7fff_ffff) as u32,
        millis: word >> 63 != 0,
    }
}

/// The shim's self-accounting counters at one moment (cumulative since it started).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ShimCounters {
    /// [`RingHeader::callback_ns`].
    pub callback_ns: u64,
    /// [`RingHeader::launches_seen`].
    pub launches_seen: u64,
    /// [`RingHeader::kernel_records`].
    pub kernel_records: u64,
    /// [`RingHeader::sampled_steps`].
    pub sampled_steps: u64,
    /// [`RingHeader::steps_seen`].
    pub steps_seen: u64,
    /// [`RingHeader::toggle_ns`].
    pub toggle_ns: u64,
    /// [`RingHeader::record_cost_ns`] (0 read as [`SHIM_COST_PER_KERNEL_RECORD_NS`]).
    pub record_cost_ns: u64,
}

impl ShimCounters {
    /// Estimated time the shim and CUPTI took from the launching threads, ns: the callbacks'
    /// measured time plus the estimated CUPTI cost of every kernel record. (The flusher's
    /// `toggle_ns` runs on the shim's own thread and is not included.)
    pub const fn estimated_cost_ns(&self) -> u64 {
        let per = if self.record_cost_ns == 0 {
            SHIM_COST_PER_KERNEL_RECORD_NS
        } else {
            self.record_cost_ns
        };
        self.callback_ns
            .saturating_add(self.kernel_records.saturating_mul(per))
    }

    /// The shim's share of `step_ns` (time the process spent in steps between `earlier` and
    /// `self`), 0 when `step_ns` is 0.
    pub fn share_of(&self, earlier: &ShimCounters, step_ns: u64) -> f64 {
        if step_ns == 0 {
            return 0.0;
        }
        let cost = self
            .estimated_cost_ns()
            .saturating_sub(earlier.estimated_cost_ns());
        cost as f64 / step_ns as f64
    }
}

impl RingHeader {
    /// The shim's self-accounting counters now.
    pub fn shim_counters(&self) -> ShimCounters {
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ShimCounters {
            callback_ns: r(&self.callback_ns),
            launches_seen: r(&self.launches_seen),
            kernel_records: r(&self.kernel_records),
            sampled_steps: r(&self.sampled_steps),
            steps_seen: r(&self.steps_seen),
            toggle_ns: r(&self.toggle_ns),
            record_cost_ns: r(&self.record_cost_ns),
        }
    }
}

/// A ring over a mapped region. The caller guarantees the region is mapped for the ring's
/// lifetime; the type only keeps pointers.
pub struct Ring {
    header: *mut RingHeader,
    data: *mut u8,
    capacity: u64,
}

// SAFETY: the ring's shared state is accessed through atomics; the data area is written only
// by the single producer (below `head`) and read only by the single consumer (between `tail`
// and `head`).
unsafe impl Send for Ring {}

/// Why a region cannot be used as a ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RingError {
    /// Smaller than the header plus a minimal data area.
    TooSmall,
    /// The header does not carry [`RING_MAGIC`] and [`RING_VERSION`].
    BadHeader,
    /// The capacity in the header is not a power of two or does not fit the region.
    BadCapacity,
}

impl core::fmt::Display for RingError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            RingError::TooSmall => "shared ring region too small",
            RingError::BadHeader => "shared ring has a foreign header (magic or version)",
            RingError::BadCapacity => "shared ring capacity is not a power of two that fits",
        })
    }
}

impl core::error::Error for RingError {}

impl Ring {
    /// Initialises a fresh region of `len` bytes (zeroed by the caller, e.g. a new memfd) as a
    /// ring with the largest power-of-two capacity that fits, and returns the producer's view.
    ///
    /// # Safety
    /// `base` must point to `len` writable bytes, 8-byte aligned, mapped as long as the ring is
    /// used, and not used as a ring by anyone else yet.
    pub unsafe fn init(base: *mut u8, len: usize, pid: u32) -> Result<Self, RingError> {
        if len < RING_HEADER_LEN + 64 {
            return Err(RingError::TooSmall);
        }
        let avail = (len - RING_HEADER_LEN) as u64;
        let capacity = 1u64 << (63 - avail.leading_zeros());
        let header = base.cast::<RingHeader>();
        // SAFETY: the caller guarantees the region; all fields are integers or atomics.
        unsafe {
            ptr::write_bytes(base, 0, RING_HEADER_LEN);
            (*header).version = RING_VERSION;
            (*header).header_len = RING_HEADER_LEN as u32;
            (*header).capacity = capacity;
            (*header).pid = pid;
            // Magic last: a consumer that sees it sees a complete header.
            core::sync::atomic::fence(Ordering::Release);
            ptr::write_volatile(&mut (*header).magic, RING_MAGIC);
        }
        Ok(Self {
            header,
            // SAFETY: within the region.
            data: unsafe { base.add(RING_HEADER_LEN) },
            capacity,
        })
    }

    /// Opens a region another process initialised (the consumer's view), checking its header.
    ///
    /// # Safety
    /// `base` must point to `len` readable and writable bytes, 8-byte aligned, mapped as long as
    /// the ring is used.
    pub unsafe fn open(base: *mut u8, len: usize) -> Result<Self, RingError> {
        if len < RING_HEADER_LEN + 64 {
            return Err(RingError::TooSmall);
        }
        let header = base.cast::<RingHeader>();
        // SAFETY: the region holds at least a header.
        let (magic, version, capacity) = unsafe {
            (
                ptr::read_volatile(&(*header).magic),
                ptr::read_volatile(&(*header).version),
                ptr::read_volatile(&(*header).capacity),
            )
        };
        if magic != RING_MAGIC || version != RING_VERSION {
            return Err(RingError::BadHeader);
        }
        if !capacity.is_power_of_two() || capacity < 64 || capacity > (len - RING_HEADER_LEN) as u64
        {
            return Err(RingError::BadCapacity);
        }
        Ok(Self {
            header,
            // SAFETY: within the region.
            data: unsafe { base.add(RING_HEADER_LEN) },
            capacity,
        })
    }

    /// The shared header.
    pub fn header(&self) -> &RingHeader {
        // SAFETY: valid for the ring's lifetime by the constructors' contracts.
        unsafe { &*self.header }
    }

    /// Data capacity in bytes.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Producer: appends one record (its length rounded up to 8). Returns false, and counts
    /// the drop, when it does not fit. Never blocks.
    pub fn push(&self, record: &[u8]) -> bool {
        let h = self.header();
        let len = (record.len() as u64).div_ceil(8) * 8;
        if len == 0 || len > self.capacity / 2 {
            h.dropped_records.fetch_add(1, Ordering::Relaxed);
            h.dropped_bytes.fetch_add(len, Ordering::Relaxed);
            return false;
        }
        let head = h.head.load(Ordering::Relaxed);
        if head % 8 != 0 {
            // Only this producer writes `head`, always a multiple of 8: another writer of the
            // shared region corrupted it. Writing at an unaligned position could run past the
            // data area (a padding header needs 8 bytes; found by fuzz/fuzz_targets/ring.rs):
            // realign instead (the consumer skips what lies between as corrupt) and drop this
            // record.
            h.head.store((head | 7).wrapping_add(1), Ordering::Release);
            h.dropped_records.fetch_add(1, Ordering::Relaxed);
            h.dropped_bytes.fetch_add(len, Ordering::Relaxed);
            return false;
        }
        let tail = h.tail.load(Ordering::Acquire);
        let pos = head & (self.capacity - 1);
        let to_end = self.capacity - pos;
        let need = if len <= to_end { len } else { to_end + len };
        if need > self.capacity.saturating_sub(head.wrapping_sub(tail)) {
            h.dropped_records.fetch_add(1, Ordering::Relaxed);
            h.dropped_bytes.fetch_add(len, Ordering::Relaxed);
            return false;
        }
        let mut head = head;
        // SAFETY: every write below stays inside the data area: `pos + to_end == capacity`,
        // and a record is written at `pos` only when `len <= to_end`, or at 0.
        unsafe {
            if len > to_end {
                let pad = RecordHeader {
                    kind: 0,
                    version: 0,
                    len: to_end as u32,
                };
                ptr::write_unaligned(self.data.add(pos as usize).cast::<RecordHeader>(), pad);
                head = head.wrapping_add(to_end);
            }
            let at = self.data.add((head & (self.capacity - 1)) as usize);
            ptr::copy_nonoverlapping(record.as_ptr(), at, record.len());
            ptr::write_bytes(at.add(record.len()), 0, len as usize - record.len());
        }
        // Positions are free-running counters: wrapping, as a hostile start near u64::MAX
        // would make plain addition overflow (found by fuzz/fuzz_targets/ring.rs).
        h.head.store(head.wrapping_add(len), Ordering::Release);
        h.records.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Consumer: copies every committed record into `buf` and hands each to `f` (padding
    /// skipped), then releases the space. Returns the number of records handed over.
    pub fn drain(&self, buf: &mut [u8], mut f: impl FnMut(&[u8])) -> usize {
        let h = self.header();
        let head = h.head.load(Ordering::Acquire);
        let mut tail = h.tail.load(Ordering::Relaxed);
        let mut n = 0;
        // A producer cannot be more than a capacity ahead, and both positions are multiples of
        // 8 (records are); anything else is corruption (reading a record header at an unaligned
        // position could run past the data area).
        if head.wrapping_sub(tail) > self.capacity || tail % 8 != 0 {
            h.corrupt_bytes
                .fetch_add(head.wrapping_sub(tail), Ordering::Relaxed);
            h.tail.store(head, Ordering::Release);
            return 0;
        }
        while tail != head {
            let pos = (tail & (self.capacity - 1)) as usize;
            let to_end = self.capacity as usize - pos;
            let mut hb = [0u8; 8];
            // SAFETY: pos + 8 <= capacity because pos is 8-aligned and capacity is a multiple
            // of 8.
            unsafe { ptr::copy_nonoverlapping(self.data.add(pos), hb.as_mut_ptr(), 8) };
            let kind = u16::from_ne_bytes([hb[0], hb[1]]);
            let len = u32::from_ne_bytes([hb[4], hb[5], hb[6], hb[7]]) as usize;
            let valid = len >= 8
                && len % 8 == 0
                && len <= to_end
                && (len as u64) <= head.wrapping_sub(tail)
                && (kind == 0 || len <= buf.len());
            if !valid {
                h.corrupt_bytes
                    .fetch_add(head.wrapping_sub(tail), Ordering::Relaxed);
                tail = head;
                break;
            }
            if kind != 0 {
                // SAFETY: pos + len <= capacity and len <= buf.len(), checked above.
                unsafe { ptr::copy_nonoverlapping(self.data.add(pos), buf.as_mut_ptr(), len) };
                f(&buf[..len]);
                n += 1;
            }
            tail = tail.wrapping_add(len as u64);
        }
        h.tail.store(tail, Ordering::Release);
        n
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::{vec, vec::Vec};

    use super::*;
    use crate::{decode, AnyRecord, GpuKernelRecord, Record, RecordHeader, StepRecord};

    fn region(len: usize) -> Vec<u64> {
        vec![0u64; len / 8]
    }

    /// A fresh ring over `mem` (pid 7): the producer's view and the consumer's. `mem` must
    /// outlive both.
    fn producer_and_consumer(mem: &mut [u64]) -> (Ring, Ring) {
        let (base, len) = (mem.as_mut_ptr().cast::<u8>(), mem.len() * 8);
        // SAFETY: `len` bytes at `base`, 8-aligned; the caller keeps `mem` alive.
        let p = unsafe { Ring::init(base, len, 7) }.expect("init");
        // SAFETY: as above.
        let c = unsafe { Ring::open(base, len) }.expect("open");
        (p, c)
    }

    fn step(i: u64) -> StepRecord {
        StepRecord {
            header: RecordHeader::of::<StepRecord>(),
            step: i,
            ts_ns: i * 10,
            tid: 1,
            phase: 1,
        }
    }

    #[test]
    fn push_drain_wraps_with_padding() {
        let mut mem = region(RING_HEADER_LEN + 256);
        let base = mem.as_mut_ptr().cast::<u8>();
        // SAFETY: the Vec outlives both views.
        let producer = unsafe { Ring::init(base, mem.len() * 8, 7) }.expect("init");
        // SAFETY: as above.
        let consumer = unsafe { Ring::open(base, mem.len() * 8) }.expect("open");
        assert_eq!(producer.capacity(), 256);
        let mut buf = vec![0u8; 1024];
        let mut seen = Vec::new();
        for i in 0..100u64 {
            // 32-byte records: the ring holds 8; drain every 5 so positions wrap unevenly.
            assert!(producer.push(step(i).as_bytes()), "push {i}");
            if i % 5 == 4 {
                consumer.drain(&mut buf, |r| {
                    if let Ok((AnyRecord::Step(s), _)) = decode(r) {
                        seen.push(s.step);
                    }
                });
            }
        }
        assert_eq!(seen, (0..100).collect::<Vec<_>>());
        assert_eq!(producer.header().dropped_records.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn full_ring_drops_and_counts() {
        let mut mem = region(RING_HEADER_LEN + 256);
        let base = mem.as_mut_ptr().cast::<u8>();
        // SAFETY: the Vec outlives the view.
        let r = unsafe { Ring::init(base, mem.len() * 8, 7) }.expect("init");
        let k = [0u8; size_of::<GpuKernelRecord>()]; // 112 bytes: two fit in 256
        assert!(r.push(&k));
        assert!(r.push(&k));
        assert!(!r.push(&k));
        assert_eq!(r.header().dropped_records.load(Ordering::Relaxed), 1);
        assert_eq!(r.header().dropped_bytes.load(Ordering::Relaxed), 112);
    }

    #[test]
    fn corrupt_lengths_are_skipped_not_followed() {
        let mut mem = region(RING_HEADER_LEN + 256);
        let (p, c) = producer_and_consumer(&mut mem);
        assert!(p.push(step(1).as_bytes()));
        // Scribble a huge length over the committed record, as a buggy process could.
        let base = mem.as_mut_ptr().cast::<u8>();
        // SAFETY: inside the region.
        unsafe { ptr::write_unaligned(base.add(RING_HEADER_LEN + 4).cast::<u32>(), 0xffff_fff8) };
        let mut buf = vec![0u8; 1024];
        let n = c.drain(&mut buf, |_| panic!("a corrupt record was handed over"));
        assert_eq!(n, 0);
        assert_eq!(c.header().corrupt_bytes.load(Ordering::Relaxed), 32);
        // The ring keeps working.
        assert!(p.push(step(2).as_bytes()));
        assert_eq!(c.drain(&mut buf, |_| {}), 1);
    }

    #[test]
    fn unaligned_positions_are_corruption_not_an_overflow() {
        let mut mem = region(RING_HEADER_LEN + 256);
        let (p, c) = producer_and_consumer(&mut mem);
        // A hostile writer leaves both positions 3 bytes before the end of the data area.
        p.header().head.store(253, Ordering::Relaxed);
        p.header().tail.store(253, Ordering::Relaxed);
        assert!(
            !p.push(step(1).as_bytes()),
            "no write at an unaligned position"
        );
        assert_eq!(p.header().dropped_records.load(Ordering::Relaxed), 1);
        assert_eq!(p.header().head.load(Ordering::Relaxed), 256);
        let mut buf = vec![0u8; 1024];
        assert_eq!(c.drain(&mut buf, |_| panic!("nothing to hand over")), 0);
        assert_eq!(c.header().tail.load(Ordering::Relaxed), 256);
        // Both sides aligned again: the ring works.
        assert!(p.push(step(2).as_bytes()));
        assert_eq!(c.drain(&mut buf, |_| {}), 1);
    }

    #[test]
    fn positions_wrap_past_u64_max() {
        let mut mem = region(RING_HEADER_LEN + 256);
        let (p, c) = producer_and_consumer(&mut mem);
        let start = u64::MAX - 7; // 8 bytes before the counters wrap
        p.header().head.store(start, Ordering::Relaxed);
        p.header().tail.store(start, Ordering::Relaxed);
        let mut buf = vec![0u8; 1024];
        let mut seen = Vec::new();
        for i in 0..20u64 {
            assert!(p.push(step(i).as_bytes()), "push {i}");
            c.drain(&mut buf, |r| {
                if let Ok((AnyRecord::Step(s), _)) = decode(r) {
                    seen.push(s.step);
                }
            });
        }
        assert_eq!(seen, (0..20).collect::<Vec<_>>());
        assert_eq!(c.header().corrupt_bytes.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn depth_requests_round_trip() {
        for (depth, duration) in [
            (2, DepthDuration::Steps(20)),
            (1, DepthDuration::Tenths(50)),
            (0, DepthDuration::UntilNext),
            (1, DepthDuration::Steps(DURATION_MAX)),
        ] {
            let w = encode_depth_request(7, depth, duration);
            assert_eq!(
                decode_depth_request(w),
                Some(DepthRequest {
                    generation: 7,
                    depth,
                    duration
                })
            );
        }
        // The documented layout, bit for bit.
        assert_eq!(
            encode_depth_request(3, 2, DepthDuration::Tenths(10)),
            (3 << 32) | (1 << 31) | (2 << 24) | 10
        );
        // Out-of-range values are clamped, never spill into other fields.
        let w = encode_depth_request(1, 9, DepthDuration::Steps(u32::MAX));
        assert_eq!(
            decode_depth_request(w),
            Some(DepthRequest {
                generation: 1,
                depth: 2,
                duration: DepthDuration::Steps(DURATION_MAX)
            })
        );
        // Tenths(0) and Steps(0) both mean "until the next request".
        assert_eq!(
            decode_depth_request(encode_depth_request(1, 1, DepthDuration::Tenths(0)))
                .map(|r| r.duration),
            Some(DepthDuration::UntilNext)
        );
        assert_eq!(decode_depth_request(0), None);
        assert_eq!(decode_depth_request(u64::from(u32::MAX)), None);
        assert_eq!(next_generation(0), 1);
        assert_eq!(
            next_generation(encode_depth_request(41, 1, DepthDuration::UntilNext)),
            42
        );
        assert_eq!(next_generation(u64::MAX), 1);
    }

    #[test]
    fn shim_depth_round_trips_and_saturates() {
        let d = ShimDepth {
            depth: 1,
            reason: 1,
            window: 5,
            period: 120,
            millis: false,
        };
        assert_eq!(decode_shim_depth(encode_shim_depth(d)), d);
        let big = ShimDepth {
            depth: crate::gpu::DEPTH_OFF,
            reason: crate::gpu::DEPTH_REASON_RELEASED,
            window: 1 << 20,
            period: u32::MAX,
            millis: true,
        };
        let got = decode_shim_depth(encode_shim_depth(big));
        assert_eq!(
            got,
            ShimDepth {
                window: 0xffff,
                period: 0x7fff_ffff,
                ..big
            }
        );
        assert_eq!(encode_shim_depth(ShimDepth::default()), 0);
    }

    #[test]
    fn shim_cost_estimate_and_share() {
        let before = ShimCounters {
            callback_ns: 1_000,
            kernel_records: 10,
            ..Default::default()
        };
        let after = ShimCounters {
            callback_ns: 3_000,
            kernel_records: 20,
            record_cost_ns: 1_000,
            ..Default::default()
        };
        assert_eq!(
            before.estimated_cost_ns(),
            1_000 + 10 * SHIM_COST_PER_KERNEL_RECORD_NS
        );
        assert_eq!(after.estimated_cost_ns(), 23_000);
        let share = after.share_of(
            &ShimCounters {
                record_cost_ns: 1_000,
                ..before
            },
            1_000_000,
        );
        assert!((share - 0.012).abs() < 1e-12, "{share}");
        assert_eq!(after.share_of(&before, 0), 0.0);
    }

    #[test]
    fn header_counters_are_read_back() {
        let mut mem = region(RING_HEADER_LEN + 256);
        let base = mem.as_mut_ptr().cast::<u8>();
        // SAFETY: the Vec outlives the view.
        let r = unsafe { Ring::init(base, mem.len() * 8, 7) }.expect("init");
        let h = r.header();
        h.callback_ns.store(5, Ordering::Relaxed);
        h.kernel_records.store(2, Ordering::Relaxed);
        h.record_cost_ns.store(100, Ordering::Relaxed);
        let c = h.shim_counters();
        assert_eq!((c.callback_ns, c.kernel_records), (5, 2));
        assert_eq!(c.estimated_cost_ns(), 205);
    }

    #[test]
    fn foreign_regions_are_refused() {
        let mut mem = region(RING_HEADER_LEN + 256);
        let base = mem.as_mut_ptr().cast::<u8>();
        // SAFETY: the Vec outlives the view.
        assert_eq!(
            unsafe { Ring::open(base, mem.len() * 8) }.err(),
            Some(RingError::BadHeader)
        );
        // SAFETY: as above.
        assert_eq!(
            unsafe { Ring::init(base, 100, 1) }.err(),
            Some(RingError::TooSmall)
        );
        // SAFETY: as above.
        unsafe { Ring::init(base, mem.len() * 8, 1) }.expect("init");
        // SAFETY: as above; a capacity that does not fit the region.
        unsafe { ptr::write_unaligned(base.add(16).cast::<u64>(), 1 << 40) };
        assert_eq!(
            unsafe { Ring::open(base, mem.len() * 8) }.err(),
            Some(RingError::BadCapacity)
        );
    }
}
