//! CUPTI activity records → slo-probe records. Fields are read at offsets taken from cudarc's
//! CUDA 13.0 layouts (`offset_of!`), never by materialising the CUPTI structs, whose enum fields
//! could hold values unknown to the bindings. The record layout follows the libcupti loaded; 13.x
//! keeps the prefix read here (shared/research/cupti.md §4).

use std::mem::offset_of;

use cudarc::cupti::sys::{
    CUpti_ActivityGraphTrace2 as Graph2, CUpti_ActivityKernel10 as Kernel10,
    CUpti_ActivityMemcpy6 as Memcpy6, CUpti_ActivityMemset4 as Memset4,
};
use slo_probe_common::{
    gpu::{KERNEL_IN_GRAPH, MEM_KIND_MEMSET},
    GpuGraphRecord, GpuKernelRecord, GpuMemRecord, RecordHeader,
};

/// `CUPTI_ACTIVITY_KIND_MEMCPY`.
pub const KIND_MEMCPY: u32 = 1;
/// `CUPTI_ACTIVITY_KIND_MEMSET`.
pub const KIND_MEMSET: u32 = 2;
/// `CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL`.
pub const KIND_CONCURRENT_KERNEL: u32 = 10;
/// `CUPTI_ACTIVITY_KIND_GRAPH_TRACE`.
pub const KIND_GRAPH_TRACE: u32 = 51;

/// Reads a `T` at `offset` of a CUPTI record.
///
/// # Safety
/// `rec` must point to a CUPTI record at least `offset + size_of::<T>()` bytes long.
unsafe fn field<T: Copy>(rec: *const u8, offset: usize) -> T {
    // SAFETY: per the caller; records are not necessarily aligned for T.
    unsafe { std::ptr::read_unaligned(rec.add(offset).cast::<T>()) }
}

/// The record's kind.
///
/// # Safety
/// `rec` must point to a CUPTI activity record.
pub unsafe fn kind(rec: *const u8) -> u32 {
    // SAFETY: every record starts with its kind (a 4-byte C enum).
    unsafe { field::<u32>(rec, 0) }
}

/// What a converter needs from the shim: the launch of a correlation id, and ids for names
/// and graph nodes.
pub trait Context {
    /// `(launch_ns, op_id, launch_tid)` of the API call with this correlation id.
    fn launch(&mut self, correlation_id: u32) -> (u64, u32, u32);
    /// The id of a kernel name (a CUPTI-owned string that lives as long as the process).
    fn kernel_name(&mut self, name: *const std::ffi::c_char) -> u32;
    /// The operator that created a graph node (capture time), if known.
    fn node_op(&self, graph_node_id: u64) -> Option<u32>;
}

/// Converts a `CONCURRENT_KERNEL` record.
///
/// # Safety
/// `rec` must point to a CUPTI `CUpti_ActivityKernel10` (or a later version with the same
/// prefix).
pub unsafe fn kernel(rec: *const u8, ctx: &mut impl Context, flags: u32) -> GpuKernelRecord {
    // SAFETY: per the caller, every offset below lies inside the record.
    unsafe {
        let correlation_id: u32 = field(rec, offset_of!(Kernel10, correlationId));
        let graph_node_id: u64 = field(rec, offset_of!(Kernel10, graphNodeId));
        let graph_id: u32 = field(rec, offset_of!(Kernel10, graphId));
        let (launch_ns, launch_op, launch_tid) = ctx.launch(correlation_id);
        let op_id = if graph_node_id != 0 {
            ctx.node_op(graph_node_id).unwrap_or(launch_op)
        } else {
            launch_op
        };
        let dim = |o: usize| field::<i32>(rec, o).max(0) as u32;
        GpuKernelRecord {
            header: RecordHeader::of::<GpuKernelRecord>(),
            start_ns: field(rec, offset_of!(Kernel10, start)),
            end_ns: field(rec, offset_of!(Kernel10, end)),
            launch_ns,
            graph_node_id,
            correlation_id,
            device_id: field(rec, offset_of!(Kernel10, deviceId)),
            context_id: field(rec, offset_of!(Kernel10, contextId)),
            stream_id: field(rec, offset_of!(Kernel10, streamId)),
            graph_id,
            grid: [
                dim(offset_of!(Kernel10, gridX)),
                dim(offset_of!(Kernel10, gridY)),
                dim(offset_of!(Kernel10, gridZ)),
            ],
            block: [
                dim(offset_of!(Kernel10, blockX)),
                dim(offset_of!(Kernel10, blockY)),
                dim(offset_of!(Kernel10, blockZ)),
            ],
            registers: u32::from(field::<u16>(rec, offset_of!(Kernel10, registersPerThread))),
            static_smem: dim(offset_of!(Kernel10, staticSharedMemory)),
            dynamic_smem: dim(offset_of!(Kernel10, dynamicSharedMemory)),
            name_id: ctx.kernel_name(field(rec, offset_of!(Kernel10, name))),
            op_id,
            launch_tid,
            flags: flags | if graph_id != 0 { KERNEL_IN_GRAPH } else { 0 },
        }
    }
}

/// Converts a `GRAPH_TRACE` record.
///
/// # Safety
/// `rec` must point to a CUPTI `CUpti_ActivityGraphTrace2`.
pub unsafe fn graph(rec: *const u8, ctx: &mut impl Context) -> GpuGraphRecord {
    // SAFETY: per the caller.
    unsafe {
        let correlation_id: u32 = field(rec, offset_of!(Graph2, correlationId));
        let (launch_ns, op_id, launch_tid) = ctx.launch(correlation_id);
        GpuGraphRecord {
            header: RecordHeader::of::<GpuGraphRecord>(),
            start_ns: field(rec, offset_of!(Graph2, start)),
            end_ns: field(rec, offset_of!(Graph2, end)),
            launch_ns,
            correlation_id,
            device_id: field(rec, offset_of!(Graph2, deviceId)),
            context_id: field(rec, offset_of!(Graph2, contextId)),
            stream_id: field(rec, offset_of!(Graph2, streamId)),
            graph_id: field(rec, offset_of!(Graph2, graphId)),
            op_id,
            launch_tid,
            flags: 0,
        }
    }
}

/// Converts a `MEMCPY` record.
///
/// # Safety
/// `rec` must point to a CUPTI `CUpti_ActivityMemcpy6`.
pub unsafe fn memcpy(rec: *const u8, ctx: &mut impl Context) -> GpuMemRecord {
    // SAFETY: per the caller.
    unsafe {
        let correlation_id: u32 = field(rec, offset_of!(Memcpy6, correlationId));
        let (launch_ns, op_id, launch_tid) = ctx.launch(correlation_id);
        GpuMemRecord {
            header: RecordHeader::of::<GpuMemRecord>(),
            start_ns: field(rec, offset_of!(Memcpy6, start)),
            end_ns: field(rec, offset_of!(Memcpy6, end)),
            launch_ns,
            bytes: field(rec, offset_of!(Memcpy6, bytes)),
            graph_node_id: field(rec, offset_of!(Memcpy6, graphNodeId)),
            correlation_id,
            device_id: field(rec, offset_of!(Memcpy6, deviceId)),
            stream_id: field(rec, offset_of!(Memcpy6, streamId)),
            graph_id: field(rec, offset_of!(Memcpy6, graphId)),
            kind: u32::from(field::<u8>(rec, offset_of!(Memcpy6, copyKind))),
            op_id,
            launch_tid,
            flags: 0,
        }
    }
}

/// Converts a `MEMSET` record.
///
/// # Safety
/// `rec` must point to a CUPTI `CUpti_ActivityMemset4`.
pub unsafe fn memset(rec: *const u8, ctx: &mut impl Context) -> GpuMemRecord {
    // SAFETY: per the caller.
    unsafe {
        let correlation_id: u32 = field(rec, offset_of!(Memset4, correlationId));
        let (launch_ns, op_id, launch_tid) = ctx.launch(correlation_id);
        GpuMemRecord {
            header: RecordHeader::of::<GpuMemRecord>(),
            start_ns: field(rec, offset_of!(Memset4, start)),
            end_ns: field(rec, offset_of!(Memset4, end)),
            launch_ns,
            bytes: field(rec, offset_of!(Memset4, bytes)),
            graph_node_id: field(rec, offset_of!(Memset4, graphNodeId)),
            correlation_id,
            device_id: field(rec, offset_of!(Memset4, deviceId)),
            stream_id: field(rec, offset_of!(Memset4, streamId)),
            graph_id: field(rec, offset_of!(Memset4, graphId)),
            kind: MEM_KIND_MEMSET,
            op_id,
            launch_tid,
            flags: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fake;
    impl Context for Fake {
        fn launch(&mut self, c: u32) -> (u64, u32, u32) {
            (1000 + u64::from(c), 7, 42)
        }
        fn kernel_name(&mut self, _: *const std::ffi::c_char) -> u32 {
            3
        }
        fn node_op(&self, n: u64) -> Option<u32> {
            (n == 99).then_some(11)
        }
    }

    /// A CUPTI-shaped kernel record built with the bindings' layout reads back field by field.
    #[test]
    fn kernel_fields_at_binding_offsets() {
        let mut raw = vec![0u8; std::mem::size_of::<Kernel10>()];
        let mut put = |off: usize, bytes: &[u8]| raw[off..off + bytes.len()].copy_from_slice(bytes);
        put(0, &KIND_CONCURRENT_KERNEL.to_ne_bytes());
        put(offset_of!(Kernel10, start), &5000u64.to_ne_bytes());
        put(offset_of!(Kernel10, end), &6000u64.to_ne_bytes());
        put(offset_of!(Kernel10, correlationId), &8u32.to_ne_bytes());
        put(offset_of!(Kernel10, gridX), &64i32.to_ne_bytes());
        put(offset_of!(Kernel10, blockX), &256i32.to_ne_bytes());
        put(
            offset_of!(Kernel10, registersPerThread),
            &40u16.to_ne_bytes(),
        );
        put(offset_of!(Kernel10, graphNodeId), &99u64.to_ne_bytes());
        put(offset_of!(Kernel10, graphId), &4u32.to_ne_bytes());
        // SAFETY: a buffer of the record's size.
        let k = unsafe { kernel(raw.as_ptr(), &mut Fake, 0) };
        assert_eq!(unsafe { kind(raw.as_ptr()) }, KIND_CONCURRENT_KERNEL);
        assert_eq!((k.start_ns, k.end_ns, k.launch_ns), (5000, 6000, 1008));
        assert_eq!((k.grid[0], k.block[0], k.registers), (64, 256, 40));
        assert_eq!((k.graph_id, k.graph_node_id, k.op_id), (4, 99, 11));
        assert_eq!(k.flags, KERNEL_IN_GRAPH);
        assert_eq!((k.name_id, k.launch_tid), (3, 42));
    }
}
