//! GPU activity and job markers, produced by the CUPTI shim (`cupti-shim/`) inside the training
//! process and sent through its shared-memory ring ([`crate::ring`]).
//!
//! Timestamps are CLOCK_MONOTONIC ns: the shim registers CUPTI's timestamp callback, so GPU and
//! eBPF times compare directly. Kernel and operator names travel once each as
//! [`StringRecord`]s and are referred to by id.

use core::mem::size_of;

use crate::{DecodeError, Record, RecordHeader, RecordKind};

/// [`GpuKernelRecord::flags`]: the kernel ran as a node of a CUDA graph.
pub const KERNEL_IN_GRAPH: u32 = 1;
/// [`GpuKernelRecord::flags`]: recorded while node-level (diagnostic) graph tracing was on.
pub const KERNEL_DIAGNOSTIC: u32 = 1 << 1;

/// One kernel execution (`CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuKernelRecord {
    /// `{ kind: GpuKernel, version: 1, len: 112 }`.
    pub header: RecordHeader,
    /// Start on the GPU, CLOCK_MONOTONIC ns.
    pub start_ns: u64,
    /// End on the GPU, CLOCK_MONOTONIC ns.
    pub end_ns: u64,
    /// When the launching API call was entered (0 if unknown): `start_ns - launch_ns` is the
    /// launch latency. For graph nodes, the `cudaGraphLaunch` entry.
    pub launch_ns: u64,
    /// CUDA graph node id (0 if not from a graph).
    pub graph_node_id: u64,
    /// Correlation id of the launching API call.
    pub correlation_id: u32,
    /// CUDA device ordinal.
    pub device_id: u32,
    /// CUDA context id.
    pub context_id: u32,
    /// CUDA stream id.
    pub stream_id: u32,
    /// CUDA graph id (0 if not from a graph).
    pub graph_id: u32,
    /// Grid dimensions.
    pub grid: [u32; 3],
    /// Block dimensions.
    pub block: [u32; 3],
    /// Registers per thread.
    pub registers: u32,
    /// Static shared memory per block, bytes.
    pub static_smem: u32,
    /// Dynamic shared memory per block, bytes.
    pub dynamic_smem: u32,
    /// Kernel name ([`StringRecord`] id, kind [`STRING_KERNEL`]).
    pub name_id: u32,
    /// Operator active when the kernel was launched, or when its graph node was captured
    /// ([`StringRecord`] id, kind [`STRING_OP`]); 0 if none.
    pub op_id: u32,
    /// Thread that launched it (0 if unknown).
    pub launch_tid: u32,
    /// [`KERNEL_IN_GRAPH`], [`KERNEL_DIAGNOSTIC`].
    pub flags: u32,
}
const _: () = assert!(size_of::<GpuKernelRecord>() == 112);

/// One CUDA graph launch traced at graph level (`CUPTI_ACTIVITY_KIND_GRAPH_TRACE`): the
/// always-on view of graph replays.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuGraphRecord {
    /// `{ kind: GpuGraph, version: 1, len: 64 }`.
    pub header: RecordHeader,
    /// Start of the first node, CLOCK_MONOTONIC ns.
    pub start_ns: u64,
    /// End of the last node, CLOCK_MONOTONIC ns.
    pub end_ns: u64,
    /// When `cudaGraphLaunch` was entered (0 if unknown).
    pub launch_ns: u64,
    /// Correlation id of the launch.
    pub correlation_id: u32,
    /// CUDA device ordinal.
    pub device_id: u32,
    /// CUDA context id.
    pub context_id: u32,
    /// CUDA stream id.
    pub stream_id: u32,
    /// CUDA graph id.
    pub graph_id: u32,
    /// Operator active at the launch (0 if none).
    pub op_id: u32,
    /// Launching thread (0 if unknown).
    pub launch_tid: u32,
    /// Reserved, 0.
    pub flags: u32,
}
const _: () = assert!(size_of::<GpuGraphRecord>() == 64);

/// [`GpuMemRecord::kind`] for a memset (memcpy kinds are CUPTI's `CUpti_ActivityMemcpyKind`:
/// 1 HtoD, 2 DtoH, 8 DtoD, 10 PtoP, ...).
pub const MEM_KIND_MEMSET: u32 = 0x100;

/// One memcpy or memset (`CUPTI_ACTIVITY_KIND_MEMCPY` / `MEMSET`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuMemRecord {
    /// `{ kind: GpuMem, version: 1, len: 80 }`.
    pub header: RecordHeader,
    /// Start, CLOCK_MONOTONIC ns.
    pub start_ns: u64,
    /// End, CLOCK_MONOTONIC ns.
    pub end_ns: u64,
    /// When the launching API call was entered (0 if unknown).
    pub launch_ns: u64,
    /// Bytes copied or set.
    pub bytes: u64,
    /// CUDA graph node id (0 if not from a graph).
    pub graph_node_id: u64,
    /// Correlation id of the launching API call.
    pub correlation_id: u32,
    /// CUDA device ordinal.
    pub device_id: u32,
    /// CUDA stream id.
    pub stream_id: u32,
    /// CUDA graph id (0 if not from a graph).
    pub graph_id: u32,
    /// Copy kind, or [`MEM_KIND_MEMSET`].
    pub kind: u32,
    /// Operator (0 if none).
    pub op_id: u32,
    /// Launching thread (0 if unknown).
    pub launch_tid: u32,
    /// Reserved, 0.
    pub flags: u32,
}
const _: () = assert!(size_of::<GpuMemRecord>() == 80);

/// A CUDA event recorded on a stream (`CUPTI_ACTIVITY_KIND_CUDA_EVENT`), with its GPU timestamp:
/// the points a training script brackets its steps with, on the same clock as kernels.
///
/// The shim does not enable this kind today: CUPTI 13.0 on driver 580 leaves `deviceTimestamp`
/// at 0 (seen on an H200); the recorded fixtures still carry such records, which the core
/// ignores.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuEventRecord {
    /// `{ kind: GpuEvent, version: 1, len: 32 }`.
    pub header: RecordHeader,
    /// When the GPU reached the event, CLOCK_MONOTONIC ns.
    pub ts_ns: u64,
    /// Correlation id of the `cudaEventRecord` call.
    pub correlation_id: u32,
    /// CUPTI's event id.
    pub event_id: u32,
    /// CUDA stream id.
    pub stream_id: u32,
    /// CUDA device ordinal.
    pub device_id: u32,
}
const _: () = assert!(size_of::<GpuEventRecord>() == 32);

/// [`GraphNodeRecord::flags`]: a node created during stream capture (or explicitly).
pub const NODE_CREATED: u32 = 1;
/// [`GraphNodeRecord::flags`]: a node cloned from another when a graph was instantiated or
/// cloned: `original_node_id` is the node it came from.
pub const NODE_CLONED: u32 = 2;

/// A CUDA graph node and the operator that created it (resource callbacks): joins node-level
/// kernel records of graph replays to operators.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GraphNodeRecord {
    /// `{ kind: GraphNode, version: 1, len: 40 }`.
    pub header: RecordHeader,
    /// The node's id (`cuptiGetGraphNodeId`).
    pub node_id: u64,
    /// For a clone, the original node's id; else 0.
    pub original_node_id: u64,
    /// The graph's id.
    pub graph_id: u32,
    /// Operator active on the capturing thread when the node was created (0 if none).
    pub op_id: u32,
    /// [`NODE_CREATED`] or [`NODE_CLONED`].
    pub flags: u32,
    /// For a kernel node created by capturing a kernel launch, its launch configuration as
    /// [`encode_launch`] packs it; 0 where not known (a clone, another kind of node, a launch
    /// the shim's callbacks did not see, or a shim that does not record it). Was padding, always
    /// 0, before 2026-12-06: older recordings read as "not known".
    pub launch: u32,
}
const _: () = assert!(size_of::<GraphNodeRecord>() == 40);

/// Packs a kernel launch configuration into [`GraphNodeRecord::launch`]: threads per block in
/// the low 11 bits (at most 1024), blocks in the grid above them (saturating at 2^21 - 1). 0 only
/// for an empty launch.
pub const fn encode_launch(grid: [u32; 3], block: [u32; 3]) -> u32 {
    // Saturating: a launch's parameters are whatever the caller passed (CUPTI calls back
    // before the driver checks them).
    let threads = (block[0] as u64)
        .saturating_mul(block[1] as u64)
        .saturating_mul(block[2] as u64);
    let blocks = (grid[0] as u64)
        .saturating_mul(grid[1] as u64)
        .saturating_mul(grid[2] as u64);
    let threads = if threads > 0x7ff { 0x7ff } else { threads };
    let blocks = if blocks > 0x1f_ffff {
        0x1f_ffff
    } else {
        blocks
    };
    if threads == 0 || blocks == 0 {
        return 0;
    }
    (threads | (blocks << 11)) as u32
}

/// Unpacks [`encode_launch`]: `(threads per block, blocks)`.
pub const fn decode_launch(launch: u32) -> (u32, u32) {
    (launch & 0x7ff, launch >> 11)
}

/// [`DepthRecord::depth`]: timing only. Step markers, CUDA-graph launches at graph level,
/// memcpy and memset; no per-kernel records (eager kernels are not seen at all).
pub const DEPTH_TIMING: u32 = 0;
/// [`DepthRecord::depth`]: every kernel (`CONCURRENT_KERNEL` and launch callbacks); graph
/// replays still at graph level.
pub const DEPTH_KERNELS: u32 = 1;
/// [`DepthRecord::depth`]: kernels and CUDA-graph replays node by node (graph-level records
/// stop: the two exclude each other).
pub const DEPTH_NODES: u32 = 2;
/// [`DepthRecord::depth`]: nothing is traced (CUPTI handed to another tool, or lost).
pub const DEPTH_OFF: u32 = 0xff;

/// [`DepthRecord::reason`]: the shim's configured tier (`SLO_PROBE_DEPTH`, 0 unless set), no
/// window or request active.
pub const DEPTH_REASON_DEFAULT: u32 = 0;
/// [`DepthRecord::reason`]: a duty-cycled sample window of the shim.
pub const DEPTH_REASON_SAMPLE: u32 = 1;
/// [`DepthRecord::reason`]: the agent asked (ring header control word).
pub const DEPTH_REASON_AGENT: u32 = 2;
/// [`DepthRecord::reason`]: the training script asked (`slo_probe.request_depth`).
pub const DEPTH_REASON_SCRIPT: u32 = 3;
/// [`DepthRecord::reason`]: CUPTI was handed to another tool (`slo_probe.cupti_released()`).
pub const DEPTH_REASON_RELEASED: u32 = 4;

/// The shim's tracing depth from `from_ns` until the next depth record: what the records of
/// that interval can and cannot show. Written when tracing starts and at every change, so
/// "no kernel records" between a [`DEPTH_TIMING`] record and the next one means "not sampled",
/// not "no kernels".
///
/// A raise is stamped after CUPTI was switched (every launch after `from_ns` is traced), a
/// lowering before (every launch before `from_ns` was): a step that began at or after a
/// `DEPTH_KERNELS` record and ended before the next lower one was traced completely. Streams
/// recorded before depth records existed have none: read them as [`DEPTH_KERNELS`] throughout.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DepthRecord {
    /// `{ kind: Depth, version: 1, len: 24 }`.
    pub header: RecordHeader,
    /// When the depth took effect, CLOCK_MONOTONIC ns.
    pub from_ns: u64,
    /// [`DEPTH_TIMING`], [`DEPTH_KERNELS`], [`DEPTH_NODES`] or [`DEPTH_OFF`].
    pub depth: u32,
    /// `DEPTH_REASON_*`: why the shim is at this depth.
    pub reason: u32,
}
const _: () = assert!(size_of::<DepthRecord>() == 24);

/// [`StepRecord::phase`]: an iteration begins.
pub const STEP_BEGIN: u32 = 1;
/// [`StepRecord::phase`]: an iteration ends.
pub const STEP_END: u32 = 2;

/// An iteration marker from the training script (`slo_probe.step()`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepRecord {
    /// `{ kind: Step, version: 1, len: 32 }`.
    pub header: RecordHeader,
    /// Iteration number given by the script.
    pub step: u64,
    /// CLOCK_MONOTONIC ns.
    pub ts_ns: u64,
    /// Thread that marked it.
    pub tid: u32,
    /// [`STEP_BEGIN`] or [`STEP_END`].
    pub phase: u32,
}
const _: () = assert!(size_of::<StepRecord>() == 32);

macro_rules! record {
    ($t:ty, $kind:ident) => {
        // SAFETY: repr(C), header first, integers only, no implicit padding (sizes pinned).
        unsafe impl Record for $t {
            const KIND: RecordKind = RecordKind::$kind;
            const VERSION: u16 = 1;

            fn header(&self) -> &RecordHeader {
                &self.header
            }
        }
    };
}
record!(GpuKernelRecord, GpuKernel);
record!(GpuGraphRecord, GpuGraph);
record!(GpuMemRecord, GpuMem);
record!(GraphNodeRecord, GraphNode);
record!(GpuEventRecord, GpuEvent);
record!(StepRecord, Step);
record!(DepthRecord, Depth);

/// [`StringRecord`] kind: a kernel name.
pub const STRING_KERNEL: u32 = 1;
/// [`StringRecord`] kind: an operator name.
pub const STRING_OP: u32 = 2;
/// Longest string a [`StringRecord`] carries, bytes (longer names are cut).
pub const STRING_MAX: usize = 4096;

/// The fixed part of a string record; the UTF-8 bytes follow, NUL-padded to a multiple of 8.
/// `header.len` = 16 + padded length.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StringRecordHead {
    /// `{ kind: String, version: 1, len: 16 + n }`.
    pub header: RecordHeader,
    /// The id other records use.
    pub id: u32,
    /// [`STRING_KERNEL`] or [`STRING_OP`].
    pub kind: u32,
}
const _: () = assert!(size_of::<StringRecordHead>() == 16);

/// A decoded string record, borrowing its bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StringRecord<'a> {
    /// The id.
    pub id: u32,
    /// [`STRING_KERNEL`] or [`STRING_OP`].
    pub kind: u32,
    /// The bytes up to the first NUL (UTF-8 by convention; decode lossily).
    pub bytes: &'a [u8],
}

impl StringRecord<'_> {
    /// Version of the string record layout.
    pub const VERSION: u16 = 1;

    /// Encodes into `out` (at least `16 + STRING_MAX + 8` bytes); returns the bytes used.
    /// Names longer than [`STRING_MAX`] are cut.
    pub fn encode(id: u32, kind: u32, name: &[u8], out: &mut [u8]) -> usize {
        let n = name.len().min(STRING_MAX);
        let padded = (n + 1).div_ceil(8) * 8; // at least one NUL
        let len = 16 + padded;
        if out.len() < len {
            return 0;
        }
        let head = StringRecordHead {
            header: RecordHeader {
                kind: RecordKind::String as u16,
                version: Self::VERSION,
                len: len as u32,
            },
            id,
            kind,
        };
        // SAFETY: StringRecordHead is repr(C) integers without padding.
        let head_bytes = unsafe {
            core::slice::from_raw_parts((&head as *const StringRecordHead).cast::<u8>(), 16)
        };
        out[..16].copy_from_slice(head_bytes);
        out[16..16 + n].copy_from_slice(&name[..n]);
        out[16 + n..len].fill(0);
        len
    }

    /// Decodes a string record at the start of `bytes` (kind already known to be String).
    pub fn decode(bytes: &[u8]) -> Result<(StringRecord<'_>, usize), DecodeError> {
        let header = crate::decode_header(bytes)?;
        if header.version != Self::VERSION {
            return Err(DecodeError::WrongVersion {
                kind: header.kind,
                version: header.version,
                expected: Self::VERSION,
            });
        }
        let len = header.len as usize;
        if !(24..=16 + STRING_MAX + 8).contains(&len) || len % 8 != 0 {
            return Err(DecodeError::WrongLength {
                kind: header.kind,
                len: header.len,
                expected: 24,
            });
        }
        let body = bytes.get(..len).ok_or(DecodeError::Truncated {
            need: len,
            have: bytes.len(),
        })?;
        let id = u32::from_ne_bytes([body[8], body[9], body[10], body[11]]);
        let kind = u32::from_ne_bytes([body[12], body[13], body[14], body[15]]);
        let text = &body[16..];
        let end = text.iter().position(|&b| b == 0).unwrap_or(text.len());
        Ok((
            StringRecord {
                id,
                kind,
                bytes: &text[..end],
            },
            len,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launch_configurations_pack_and_unpack() {
        // The suite's Triton GELU: 131072 blocks of 128 threads, then 264 blocks of 32.
        let normal = encode_launch([131_072, 1, 1], [128, 1, 1]);
        let low = encode_launch([264, 1, 1], [32, 1, 1]);
        assert_eq!(decode_launch(normal), (128, 131_072));
        assert_eq!(decode_launch(low), (32, 264));
        assert_ne!(normal, low);
        assert_eq!(
            decode_launch(encode_launch([8, 4, 2], [16, 16, 4])),
            (1024, 64)
        );
        // Saturating, and 0 only for an empty launch.
        assert_eq!(
            decode_launch(encode_launch([u32::MAX, u32::MAX, 2], [1, 1, 1])),
            (1, 0x1f_ffff)
        );
        assert_eq!(encode_launch([0, 1, 1], [32, 1, 1]), 0);
    }
}
