//! A rich, fixed snapshot for the exporters' tests: host threads of three roles, a process
//! tree, TCP connections, cgroups of both versions with pressure, system pressure, three GPUs
//! (two H200 with GPM and NVLink topology, an older one that reports little), a training
//! process replayed from the H200 fixture (`tests/fixtures/gpu/h200-graphs.bin`) with its SLO
//! tree, a generated one whose all-reduce slows down (an open violation with its attribution;
//! both are ranks of one job, so the straggler view has rows) and one that has sent nothing
//! yet. Everything in it is deterministic: the golden expositions
//! (`tests/fixtures/prometheus/golden-*.prom`) are rendered from it.

use std::{path::Path, sync::Arc};

use slo_probe_common::{Counter, RecordIter};
use slo_probe_core::{
    cgroup::{CgroupRow, CpuLimit, CpuStat, Pressure, PressureRow},
    gpu::{ComputeCapability, GpmMetrics, GpuPath, GpuPeer, GpuSample, GpuSnapshot, GpuTopology},
    net::{ConnRow, NetSnapshot},
    occupancy::SmLimits,
    pipeline::{PipelineSettings, ProcessPipeline},
    roles::{ProcessKind, Role},
    snapshot::{AgentStats, OutlierSnapshot, ProbeStatus, ProcessSnapshot, Snapshot},
    synth::{case, drive, generate, test_spec},
    threads::{GroupRow, ProcessRow, RunqCounts, ThreadCounts, ThreadRow, ThreadsSnapshot},
};

/// Run-queue counts with waits of `waits` ns each.
fn runq(waits: &[u64], preempted: u64) -> RunqCounts {
    let mut c = RunqCounts::default();
    for &w in waits {
        c.slots[slo_probe_common::log2_slot(w)] += 1;
        c.count += 1;
        c.total_ns += w;
        c.max_ns = c.max_ns.max(w);
    }
    c.preempted = preempted;
    c
}

fn counts(waits: &[u64], k: u64) -> ThreadCounts {
    ThreadCounts {
        runq: runq(waits, k),
        offcpu_voluntary_ns: 1_250_000_000 * k,
        offcpu_involuntary_ns: 3_000_000 * k,
        switches_voluntary: 400 * k,
        switches_involuntary: 7 * k,
        tcp_sent_bytes: 65_536 * k,
        tcp_recv_bytes: 131_072 * k,
    }
}

/// Rank 0 (pid 4100, `python3`) with a main thread, a loader worker and an NCCL thread; a
/// `pt"odd` helper (pid 4200) whose name needs escaping.
fn threads() -> ThreadsSnapshot {
    let main = counts(&[900, 5_000, 20_000, 3_000_000], 1);
    let loader = counts(&[2_000, 40_000_000, 12_000_000_000], 2);
    let comm = counts(&[1_500, 250_000], 3);
    let odd = counts(&[], 0);
    let thread = |pid, tid, name: &str, role, counts: &ThreadCounts, exited| ThreadRow {
        pid,
        tid,
        name: name.into(),
        role,
        counts: *counts,
        exited,
    };
    let group = |pid, process: &str, role, counts: &ThreadCounts, threads| GroupRow {
        pid,
        process: process.into(),
        role,
        counts: *counts,
        threads,
    };
    let mut total = main;
    total.add(&loader);
    total.add(&comm);
    ThreadsSnapshot {
        taken_at_ns: 90_000_000_000,
        threads: vec![
            thread(4100, 4100, "python3", Role::Main, &main, false),
            thread(
                4100,
                4107,
                "pt_data_worker",
                Role::DataLoader,
                &loader,
                false,
            ),
            thread(4100, 4111, "pt_nccl", Role::Communication, &comm, true),
            thread(4200, 4200, "pt\"odd\\", Role::Other, &odd, false),
        ],
        groups: vec![
            group(4100, "python3", Role::Main, &main, 1),
            group(4100, "python3", Role::DataLoader, &loader, 1),
            group(4100, "python3", Role::Communication, &comm, 0),
            group(4200, "pt\"odd\\", Role::Other, &odd, 1),
        ],
        processes: vec![
            ProcessRow {
                pid: 4100,
                ppid: 1,
                name: "python3".into(),
                kind: ProcessKind::Training,
                counts: total,
                threads: 2,
            },
            ProcessRow {
                pid: 4200,
                ppid: 4100,
                name: "pt\"odd\\".into(),
                kind: ProcessKind::Other,
                counts: odd,
                threads: 1,
            },
        ],
    }
}

fn tuple(local: [u8; 4], sport: u16, remote: [u8; 4], dport: u16) -> slo_probe_common::TcpTuple {
    let mut t = slo_probe_common::TcpTuple {
        sport,
        dport,
        family: slo_probe_common::net::AF_INET,
        ..Default::default()
    };
    t.saddr[..4].copy_from_slice(&local);
    t.daddr[..4].copy_from_slice(&remote);
    t
}

fn net() -> NetSnapshot {
    NetSnapshot {
        conns: vec![
            ConnRow {
                tuple: tuple([10, 0, 0, 1], 45_000, [10, 0, 0, 2], 29_500),
                pid: 4100,
                tid: 4111,
                process: "python3".into(),
                role: Role::Communication,
                retransmits: 12,
                srtt_us: 850,
                snd_cwnd: 10,
                closed: false,
            },
            ConnRow {
                tuple: tuple([127, 0, 0, 1], 51_000, [127, 0, 0, 1], 8080),
                pid: 0,
                tid: 0,
                process: String::new(),
                role: Role::Other,
                retransmits: 0,
                srtt_us: 0,
                snd_cwnd: 0,
                closed: true,
            },
        ],
        unlisted: 3,
        retransmits: [((0, Role::Other), 1), ((4100, Role::Communication), 12)].into(),
        recent: Vec::new(),
    }
}

fn cgroups() -> (Vec<CgroupRow>, Vec<PressureRow>) {
    let rows = vec![
        CgroupRow {
            path: "/kubepods.slice/pod\"x\"".into(),
            version: 2,
            cpu: Some(CpuStat {
                nr_periods: 1000,
                nr_throttled: 25,
                throttled_ns: 1_500_000_000,
            }),
            limit: Some(CpuLimit {
                quota_us: Some(400_000),
                period_us: 100_000,
            }),
            pressure: Some(Pressure {
                some_us: 2_500_000,
                full_us: 125_000,
            }),
            pids: vec![4100],
            roles: vec![Role::Main, Role::DataLoader, Role::Communication],
        },
        CgroupRow {
            path: "/job".into(),
            version: 1,
            cpu: None,
            limit: Some(CpuLimit {
                quota_us: None,
                period_us: 100_000,
            }),
            pressure: None,
            pids: vec![4200],
            roles: vec![Role::Other],
        },
    ];
    let pressure = ["cpu", "memory", "io"]
        .into_iter()
        .zip(1u64..)
        .map(|(resource, k)| PressureRow {
            resource,
            pressure: Pressure {
                some_us: 1_000_000 * k,
                full_us: 250_000 * (k - 1),
            },
        })
        .collect();
    (rows, pressure)
}

fn gpus() -> GpuSnapshot {
    let h200 = |index: u32, uuid: &str| GpuSample {
        index,
        uuid: uuid.into(),
        name: "NVIDIA H200".into(),
        pci_bus_id: format!("00000000:{:02X}:00.0", 0x18 + index),
        compute_capability: Some(ComputeCapability { major: 9, minor: 0 }),
        sm_count: Some(132),
        gpu_util_percent: Some(87.0),
        memory_util_percent: Some(40.5),
        memory_used_bytes: Some(80_000_000_000),
        memory_total_bytes: Some(150_754_820_096),
        sm_clock_mhz: Some(1980),
        memory_clock_mhz: Some(3201),
        power_watts: Some(612.25),
        pcie_tx_bytes_per_sec: Some(1_048_576.0),
        pcie_rx_bytes_per_sec: Some(2_097_152.5),
        nvlink_tx_bytes_per_sec: Some(0.0),
        nvlink_rx_bytes_per_sec: None,
        gpm: GpmMetrics {
            interval_ns: Some(1_000_000_000),
            graphics_util_percent: Some(90.0),
            sm_util_percent: Some(75.0),
            sm_occupancy_percent: Some(31.25),
            dram_bw_util_percent: Some(55.0),
            any_tensor_util_percent: Some(20.0),
            hmma_tensor_util_percent: Some(19.5),
            imma_tensor_util_percent: Some(0.0),
            dfma_tensor_util_percent: Some(0.0),
            fp16_util_percent: Some(1.0),
            fp32_util_percent: Some(12.0),
            fp64_util_percent: None,
            integer_util_percent: Some(8.0),
        },
    };
    let topo = |index: u32, peer: u32, p2p| GpuTopology {
        index,
        numa_node: Some(index),
        cpu_affinity: (index * 16..index * 16 + 16).collect(),
        pcie_generation: Some((1, 5)),
        pcie_width: Some((16, 16)),
        nvlinks_active: Some(18),
        peers: vec![GpuPeer {
            index: peer,
            path: GpuPath::NvLink,
            nvlinks: 18,
            p2p_read: p2p,
        }],
    };
    GpuSnapshot {
        devices: vec![
            h200(0, "GPU-8d6c1f2e"),
            h200(1, "GPU-\"b\""),
            // An older GPU whose driver says little.
            GpuSample {
                index: 3,
                uuid: "GPU-3".into(),
                name: "Tesla V100".into(),
                compute_capability: Some(ComputeCapability { major: 7, minor: 0 }),
                gpu_util_percent: Some(5.0),
                power_watts: Some(41.25),
                ..GpuSample::default()
            },
        ],
        taken_at_ns: 90_000_000_000,
        // Index 2: in the topology, not sampled.
        topology: Arc::new(vec![
            topo(0, 1, Some(true)),
            topo(1, 0, None),
            topo(2, 0, Some(false)),
        ]),
    }
}

/// The H200 fixture with graphs through the pipeline, as `slo-probe replay` runs it (step
/// markers, SLO windows fitted to the recording): rank 0 of job `golden`.
fn replayed() -> ProcessSnapshot {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/gpu/h200-graphs.bin");
    let data = std::fs::read(path).expect("the H200 fixture");
    let mut settings = PipelineSettings::recording(None);
    settings.limits = SmLimits::for_capability(9, 0);
    let mut pipeline = ProcessPipeline::new(4100, settings).expect("pipeline");
    let mut records = 0;
    for r in RecordIter::new(&data) {
        pipeline.push(&r.expect("the fixture decodes"));
        records += 1;
    }
    pipeline.finish(None);
    let info = pipeline.info_mut();
    info.records = records;
    info.rank = Some(0);
    info.job_id = Some("golden".into());
    info.connected = true;
    pipeline.snapshot()
}

/// A generated job whose all-reduce slows down: rank 1 of job `golden`, an open violation.
fn violated() -> ProcessSnapshot {
    let mut pipeline = drive(&generate(&case("comm_jitter", 5)), &test_spec());
    let info = pipeline.info_mut();
    info.pid = 4300;
    info.rank = Some(1);
    info.job_id = Some("golden".into());
    info.status = slo_probe_common::ring::STATUS_TRACING | slo_probe_common::ring::STATUS_LOST_RACE;
    info.dropped = 17;
    info.cupti_dropped = 2;
    info.strings_dropped = 1;
    info.ops_overflowed = 5;
    pipeline.snapshot()
}

/// The whole snapshot, stragglers derived.
pub(crate) fn rich_snapshot() -> Snapshot {
    let (cgroups, pressure) = cgroups();
    let mut counters = [0u64; Counter::COUNT as usize];
    for (k, c) in counters.iter_mut().enumerate() {
        *c = 3 * k as u64 + 1;
    }
    Snapshot {
        taken_at_ns: 90_000_000_000,
        shim_refused: vec![("uid", 2), ("unsealed", 1)],
        healers: Vec::new(),
        threads: Some(threads()),
        outliers: OutlierSnapshot {
            per_process: [(4100, 3), (4200, 1)].into(),
            recent: Vec::new(),
        },
        net: Some(net()),
        cgroups,
        pressure,
        processes: vec![
            replayed(),
            violated(),
            // Registered, nothing received yet.
            ProcessSnapshot {
                pid: 4400,
                connected: true,
                ..ProcessSnapshot::default()
            },
        ],
        stragglers: Vec::new(),
        counters,
        probes: vec![
            ProbeStatus {
                name: "runqueue",
                up: true,
                reason: String::new(),
            },
            ProbeStatus {
                name: "tcp",
                up: false,
                reason: "BTF missing: \"tcp_sock\"\nsee slo-probe check".into(),
            },
        ],
        agent: AgentStats {
            cpu_seconds: 12.625,
            resident_bytes: 41_943_040,
            ticks: 90,
        },
        gpus: Some(gpus()),
    }
    .derive()
}

/// The snapshot of an agent that has seen nothing yet.
pub(crate) fn empty_snapshot() -> Snapshot {
    Snapshot::default()
}
