//! Sources: adapt what the kernel (and later the GPU shim, NVML) reports into the core's input
//! types.
pub mod cgroup;
pub mod ebpf;
pub mod procfs;
pub mod shim;
pub mod tracefs;
