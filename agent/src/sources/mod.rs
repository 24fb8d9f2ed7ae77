//! Sources: adapt what the kernel, NVML (and later the GPU shim) report into the core's input
//! types.
pub mod cgroup;
pub mod ebpf;
pub mod nvml;
pub mod procfs;
pub mod shim;
