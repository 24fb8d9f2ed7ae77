//! Sources: adapt what the kernel (and later the GPU shim, NVML, cgroups) reports into the
//! core's input types.
pub mod ebpf;
