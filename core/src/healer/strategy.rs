//! The eight strategies of DESIGN.md (seed chapter 3) and the parameters of each at its two
//! intensity levels. An arm of the tuner is a (strategy, level) pair; the agent's actuators turn
//! an arm's [`Params`] into knob writes.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A scheduling strategy the healer can put in force for a job.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Default,
)]
#[serde(rename_all = "kebab-case")]
pub enum Strategy {
    /// No intervention: the state every other strategy restores, and the rollback target.
    #[default]
    FcfsGpu,
    /// Raise the priority (nice, EEVDF slice hint) of the main and communication threads.
    DeadlineAware,
    /// Pin main/communication threads and loader workers to disjoint GPU-local cores.
    NumaPinning,
    /// More CPU and I/O priority for loader workers; more prefetch through the client.
    IoBoost,
    /// Neighbour cgroups down to a guaranteed share, the job an elastic burst (seed §3.3).
    NeighborIsolation,
    /// Prioritise communication threads and sockets; sync less often through the client.
    CommRelief,
    /// Neighbours' memory limits; allocator compaction and accumulation through the client.
    MemoryFirst,
    /// Switch compiled regions between CUDA-graph replay and plain code through the client.
    GraphReplay,
}

impl Strategy {
    /// Every strategy, in export order.
    pub const ALL: [Strategy; 8] = [
        Strategy::FcfsGpu,
        Strategy::DeadlineAware,
        Strategy::NumaPinning,
        Strategy::IoBoost,
        Strategy::NeighborIsolation,
        Strategy::CommRelief,
        Strategy::MemoryFirst,
        Strategy::GraphReplay,
    ];

    /// The kebab-case name used in the config, the journal and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::FcfsGpu => "fcfs-gpu",
            Self::DeadlineAware => "deadline-aware",
            Self::NumaPinning => "numa-pinning",
            Self::IoBoost => "io-boost",
            Self::NeighborIsolation => "neighbor-isolation",
            Self::CommRelief => "comm-relief",
            Self::MemoryFirst => "memory-first",
            Self::GraphReplay => "graph-replay",
        }
    }

    /// The strategy named `s` (kebab-case).
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|x| x.as_str() == s)
    }

    /// Whether it acts on cgroups other than the job's own (needs allowed neighbours).
    pub fn touches_neighbours(self) -> bool {
        matches!(self, Self::NeighborIsolation | Self::MemoryFirst)
    }

    /// Whether it needs the python client's strategy channel to do anything at all.
    pub fn needs_client(self) -> bool {
        matches!(self, Self::GraphReplay)
    }

    /// Whether it is the no-intervention baseline.
    pub fn is_baseline(self) -> bool {
        self == Self::FcfsGpu
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Intensity of a strategy's parameters: the tuner tries the mild one and the strong one as
/// separate arms.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Default,
)]
#[serde(rename_all = "kebab-case")]
pub enum Level {
    /// Smaller changes, fewer side effects.
    #[default]
    Mild,
    /// Larger changes.
    Strong,
}

impl Level {
    /// Both levels.
    pub const ALL: [Level; 2] = [Level::Mild, Level::Strong];

    /// `mild` or `strong`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Mild => "mild",
            Self::Strong => "strong",
        }
    }
}

/// One arm of the tuner.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Arm {
    /// The strategy.
    pub strategy: Strategy,
    /// Its intensity.
    pub level: Level,
}

impl Arm {
    /// The baseline arm (no intervention).
    pub const BASELINE: Arm = Arm {
        strategy: Strategy::FcfsGpu,
        level: Level::Mild,
    };

    /// `strategy/level`.
    pub fn label(&self) -> String {
        if self.strategy.is_baseline() {
            self.strategy.as_str().to_owned()
        } else {
            format!("{}/{}", self.strategy.as_str(), self.level.as_str())
        }
    }

    /// The parameters this arm applies.
    pub fn params(&self) -> Params {
        Params::of(self.strategy, self.level)
    }
}

/// What a strategy changes, at one level. The agent's actuator for the strategy reads only its
/// own variant.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Params {
    /// `fcfs-gpu`: nothing.
    None,
    /// `deadline-aware`: nice of the main and communication threads, and the EEVDF slice hint
    /// (`sched_attr.sched_runtime`, 0 leaves the default slice). Never SCHED_DEADLINE.
    Priority {
        /// Nice value (-20..=19; lower is more CPU).
        nice: i32,
        /// Slice hint in µs (100..=100000 where the kernel has it), 0: unchanged.
        slice_us: u64,
    },
    /// `numa-pinning`: the main thread alone on the least-loaded GPU-local core, communication
    /// threads on the next, loader workers and the rest of the job's threads on the others.
    Pinning {
        /// Give the main thread a core of its own (else main and communication share the
        /// least-loaded ones).
        exclusive_main: bool,
    },
    /// `io-boost`: loader workers' I/O priority (best-effort class, level 0..=7) and nice;
    /// prefetch factor through the client.
    Io {
        /// Best-effort I/O priority level (0 is the highest).
        ioprio_level: u8,
        /// Nice of the loader workers.
        loader_nice: i32,
        /// Batches each loader worker prefetches (client; 0: unchanged).
        prefetch_factor: u32,
    },
    /// `neighbor-isolation`, the seed's §3.3 dual quota: allowed neighbour cgroups down to a
    /// guaranteed share of their CPU weight with a quota capping their burst, and the job's own
    /// cgroup an elastic burst over its quota (when it has one).
    Quota {
        /// Neighbours keep this percentage of their CPU weight (`cpu.weight`, `cpu.shares`).
        neighbor_share_percent: u32,
        /// Neighbours' CPU quota as a percentage of one CPU (`cpu.max`, `cpu.cfs_quota_us`);
        /// 0: no quota is set.
        neighbor_quota_percent: u32,
        /// v2 only: mark neighbours `cpu.idle` (SCHED_IDLE for the group).
        neighbor_idle: bool,
        /// The job's own quota grows by this percentage (0: unchanged).
        job_burst_percent: u32,
    },
    /// `comm-relief`: nice and socket priority of the communication threads and the job's TCP
    /// connections; synchronise gradients every `sync_every` steps through the client.
    Comm {
        /// Nice of the communication threads.
        nice: i32,
        /// `SO_PRIORITY` of the job's TCP sockets (0..=6).
        socket_priority: i32,
        /// Gradient synchronisation interval in steps (client; 1: every step).
        sync_every: u32,
    },
    /// `memory-first`: allowed neighbours' `memory.high` (v2) or soft limit (v1) to this share
    /// of their current usage; allocator compaction when the client's fragmentation rate (seed
    /// §3.1) passes the threshold, and more gradient accumulation with a smaller micro-batch.
    Memory {
        /// Neighbours' memory limit as a percentage of their current usage.
        neighbor_high_percent: u32,
        /// Compact when the fragmentation rate is above this (0..1).
        fragmentation_threshold: f64,
        /// Gradient accumulation factor (client; 1: unchanged).
        accumulation: u32,
    },
    /// `graph-replay`: CUDA-graph replay on or off for the compiled regions (client).
    Graph {
        /// Replay CUDA graphs (else run the compiled code without graphs).
        replay: bool,
    },
}

impl Params {
    /// The documented parameters of `strategy` at `level`.
    pub fn of(strategy: Strategy, level: Level) -> Self {
        let strong = level == Level::Strong;
        match strategy {
            Strategy::FcfsGpu => Self::None,
            Strategy::DeadlineAware => Self::Priority {
                nice: if strong { -19 } else { -10 },
                slice_us: if strong { 1_000 } else { 3_000 },
            },
            Strategy::NumaPinning => Self::Pinning {
                exclusive_main: strong,
            },
            Strategy::IoBoost => Self::Io {
                ioprio_level: 0,
                loader_nice: if strong { -10 } else { -5 },
                prefetch_factor: if strong { 8 } else { 4 },
            },
            Strategy::NeighborIsolation => Self::Quota {
                neighbor_share_percent: if strong { 1 } else { 5 },
                neighbor_quota_percent: if strong { 10 } else { 25 },
                neighbor_idle: strong,
                job_burst_percent: if strong { 300 } else { 100 },
            },
            Strategy::CommRelief => Self::Comm {
                nice: if strong { -15 } else { -10 },
                socket_priority: 6,
                sync_every: if strong { 4 } else { 2 },
            },
            Strategy::MemoryFirst => Self::Memory {
                neighbor_high_percent: if strong { 80 } else { 95 },
                // The seed's §3.1 tolerance of the memory-first class.
                fragmentation_threshold: 0.65,
                accumulation: if strong { 4 } else { 2 },
            },
            Strategy::GraphReplay => Self::Graph { replay: !strong },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A name through serde (the config's and the journal's way in).
    pub(crate) fn via_serde<T: for<'de> Deserialize<'de>>(name: &str) -> Result<T, String> {
        use serde::de::IntoDeserializer as _;
        let d: serde::de::value::StrDeserializer<'_, serde::de::value::Error> =
            name.into_deserializer();
        T::deserialize(d).map_err(|e| e.to_string())
    }

    #[test]
    fn names_round_trip_and_match_serde() {
        for s in Strategy::ALL {
            assert_eq!(Strategy::parse(s.as_str()), Some(s));
            assert_eq!(via_serde::<Strategy>(s.as_str()), Ok(s));
        }
        assert_eq!(Strategy::parse("deadline"), None);
        assert!(via_serde::<Strategy>("deadline").is_err());
        assert_eq!(via_serde::<Level>("strong"), Ok(Level::Strong));
    }

    #[test]
    fn every_strategy_but_the_baseline_changes_something() {
        for s in Strategy::ALL {
            for l in Level::ALL {
                let p = Params::of(s, l);
                assert_eq!(p == Params::None, s.is_baseline(), "{s} {l:?}");
            }
        }
        assert_eq!(Arm::BASELINE.label(), "fcfs-gpu");
        let a = Arm {
            strategy: Strategy::NumaPinning,
            level: Level::Strong,
        };
        assert_eq!(a.label(), "numa-pinning/strong");
    }
}
