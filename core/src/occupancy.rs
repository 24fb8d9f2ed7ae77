//! Theoretical occupancy of a kernel launch: active warps per SM over the SM's maximum, limited
//! by warps, blocks, registers and shared memory (the arithmetic of CUDA's `cuda_occupancy.h`,
//! as Kineto's `computeOccupancyMetrics` ports it). Per-SM limits come from the compute
//! capability (CUDA C Programming Guide, "Technical Specifications per Compute Capability").

/// Per-SM resources of a GPU architecture.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SmLimits {
    /// Resident warps per SM.
    pub max_warps: u32,
    /// Resident blocks per SM.
    pub max_blocks: u32,
    /// 32-bit registers per SM.
    pub registers: u32,
    /// Shared memory per SM, bytes.
    pub shared_memory: u32,
    /// Shared memory the system reserves per block, bytes.
    pub reserved_shared_per_block: u32,
}

/// Registers are allocated per warp in units of this many.
const REG_ALLOC_UNIT: u32 = 256;
/// Shared memory is allocated per block in units of this many bytes.
const SMEM_ALLOC_UNIT: u32 = 128;

impl SmLimits {
    /// The limits of compute capability `major.minor`, if known.
    pub fn for_capability(major: u32, minor: u32) -> Option<Self> {
        let (max_warps, max_blocks, shared_kib, reserved) = match (major, minor) {
            (7, 0) | (7, 2) => (64, 32, 96, 0),
            (7, 5) => (32, 16, 64, 0),
            (8, 0) => (64, 32, 164, 1024),
            (8, 6) | (8, 7) => (48, 16, 100, 1024),
            (8, 9) => (48, 24, 100, 1024),
            (9, 0) | (10, 0) | (10, 3) => (64, 32, 228, 1024),
            (12, 0) | (12, 1) => (48, 32, 100, 1024),
            _ => return None,
        };
        Some(Self {
            max_warps,
            max_blocks,
            registers: 65_536,
            shared_memory: shared_kib * 1024,
            reserved_shared_per_block: reserved,
        })
    }

    /// Theoretical occupancy (0..=1) of blocks of `threads` threads using `registers` registers
    /// per thread and `shared` bytes of shared memory per block; `None` for an empty block or
    /// one that cannot fit at all.
    pub fn occupancy(&self, threads: u32, registers: u32, shared: u32) -> Option<f64> {
        if threads == 0 {
            return None;
        }
        let warps_per_block = threads.div_ceil(32);
        let by_warps = self.max_warps / warps_per_block;
        let by_regs = if registers == 0 {
            u32::MAX
        } else {
            let per_warp = (registers * 32).div_ceil(REG_ALLOC_UNIT) * REG_ALLOC_UNIT;
            (self.registers / per_warp) / warps_per_block
        };
        let needed = shared + self.reserved_shared_per_block;
        let by_smem = if needed == 0 {
            u32::MAX
        } else {
            self.shared_memory / (needed.div_ceil(SMEM_ALLOC_UNIT) * SMEM_ALLOC_UNIT)
        };
        let blocks = self.max_blocks.min(by_warps).min(by_regs).min(by_smem);
        (blocks > 0).then(|| f64::from(blocks * warps_per_block) / f64::from(self.max_warps))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values the CUDA occupancy calculator gives for sm_90.
    #[test]
    fn hopper_cases() {
        let h = SmLimits::for_capability(9, 0).expect("sm_90");
        // 256 threads, 32 registers, no shared memory: 8 blocks of 8 warps = 64 warps.
        assert_eq!(h.occupancy(256, 32, 0), Some(1.0));
        // 128 registers per thread: 65536 / (128*32) = 16 warps.
        assert_eq!(h.occupancy(256, 128, 0), Some(0.25));
        // 100 KiB of shared memory per block: 2 blocks of 4 warps = 8 of 64.
        assert_eq!(h.occupancy(128, 32, 100 * 1024), Some(0.125));
        // One warp per block: the 32-block limit caps it at 32 of 64 warps.
        assert_eq!(h.occupancy(32, 16, 0), Some(0.5));
        assert_eq!(h.occupancy(0, 32, 0), None);
        // More shared memory than an SM has.
        assert_eq!(h.occupancy(128, 32, 300 * 1024), None);
        assert_eq!(SmLimits::for_capability(1, 0), None);
    }
}
