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

use core::{
    mem::size_of,
    ptr,
    sync::atomic::{AtomicU64, Ordering},
};

use crate::RecordHeader;

/// `RingHeader::magic`.
pub const RING_MAGIC: u64 = u64::from_le_bytes(*b"SLORING1");
/// Layout version of the ring.
pub const RING_VERSION: u32 = 1;
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
    /// Reserved, 0.
    pub _r0: u32,
    _pad0: [u64; 4],
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
    /// Requests from the agent: diagnostic generation (high 32 bits) and the number of steps of
    /// node-level tracing wanted (low 32 bits).
    pub control: AtomicU64,
    /// The shim's state: `STATUS_*` bits.
    pub status: AtomicU64,
    _pad3: [u64; 6],
}
const _: () = assert!(size_of::<RingHeader>() == 256);
const _: () = assert!(size_of::<RingHeader>() <= RING_HEADER_LEN);

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
                head += to_end;
            }
            let at = self.data.add((head & (self.capacity - 1)) as usize);
            ptr::copy_nonoverlapping(record.as_ptr(), at, record.len());
            ptr::write_bytes(at.add(record.len()), 0, len as usize - record.len());
        }
        h.head.store(head + len, Ordering::Release);
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
        // A producer cannot be more than a capacity ahead; anything else is corruption.
        if head.wrapping_sub(tail) > self.capacity {
            h.corrupt_bytes
                .fetch_add(head.wrapping_sub(tail), Ordering::Relaxed);
            h.tail.store(head, Ordering::Release);
            return 0;
        }
        while tail < head {
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
                && (len as u64) <= head - tail
                && (kind == 0 || len <= buf.len());
            if !valid {
                h.corrupt_bytes.fetch_add(head - tail, Ordering::Relaxed);
                tail = head;
                break;
            }
            if kind != 0 {
                // SAFETY: pos + len <= capacity and len <= buf.len(), checked above.
                unsafe { ptr::copy_nonoverlapping(self.data.add(pos), buf.as_mut_ptr(), len) };
                f(&buf[..len]);
                n += 1;
            }
            tail += len as u64;
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
        let base = mem.as_mut_ptr().cast::<u8>();
        // SAFETY: the Vec outlives both views.
        let p = unsafe { Ring::init(base, mem.len() * 8, 7) }.expect("init");
        // SAFETY: as above.
        let c = unsafe { Ring::open(base, mem.len() * 8) }.expect("open");
        assert!(p.push(step(1).as_bytes()));
        // Scribble a huge length over the committed record, as a buggy process could.
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
