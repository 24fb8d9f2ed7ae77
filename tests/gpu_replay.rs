//! Plain tier: GPU traces recorded by the CUPTI shim on an H200 (`scripts/gpu-check`, PyTorch
//! 2.11, the DDP job of `examples/train_ddp.py` with step markers) replayed through the agent's
//! decoding path: every byte decodes, and the iterations come out as the job ran them.
//!
//! Fixtures: `tests/fixtures/gpu/h200-eager.bin` (eager mode, modules instrumented, 300 steps)
//! and `h200-graphs.bin` (torch.compile mode="reduce-overhead", CUDA graphs traced at graph
//! level, with node-level tracing requested at step 150 for 20 steps).

use std::collections::BTreeMap;

use slo_probe_common::{AnyRecord, RecordIter};
use slo_probe_core::{
    gputrace::{Iteration, TraceAssembler},
    occupancy::SmLimits,
};

fn replay(name: &str) -> (TraceAssembler, Vec<Iteration>, BTreeMap<&'static str, u64>) {
    replay_with(name, true)
}

/// Replays a fixture; without `markers` the step records are left out, so iterations must be
/// detected.
fn replay_with(
    name: &str,
    markers: bool,
) -> (TraceAssembler, Vec<Iteration>, BTreeMap<&'static str, u64>) {
    let path = format!("{}/fixtures/gpu/{name}", env!("CARGO_MANIFEST_DIR"));
    let data = std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut asm = TraceAssembler::new();
    // The fixtures were recorded on an H200 (compute capability 9.0).
    asm.set_limits(SmLimits::for_capability(9, 0));
    let mut kinds: BTreeMap<&'static str, u64> = BTreeMap::new();
    let mut iter = RecordIter::new(&data);
    for r in iter.by_ref() {
        let r = r.unwrap_or_else(|e| panic!("{name}: record does not decode: {e}"));
        let kind = match r {
            AnyRecord::GpuKernel(_) => "kernel",
            AnyRecord::GpuGraph(_) => "graph",
            AnyRecord::GpuMem(_) => "memory",
            AnyRecord::GraphNode(_) => "graph_node",
            AnyRecord::String(_) => "string",
            AnyRecord::Step(_) => "step",
            AnyRecord::GpuEvent(_) => "event",
            _ => "other",
        };
        *kinds.entry(kind).or_default() += 1;
        if markers || kind != "step" {
            asm.push(&r);
        }
    }
    assert_eq!(iter.dropped_bytes(), 0, "{name}: undecodable tail");
    let its = asm.take_iterations(0, 0, true);
    (asm, its, kinds)
}

fn median(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    v[v.len() / 2]
}

#[test]
fn eager_trace_replays_into_300_iterations() {
    let (asm, its, kinds) = replay("h200-eager.bin");
    eprintln!("eager: {kinds:?}");
    assert_eq!(kinds.get("other"), None);
    assert_eq!(kinds["step"], 600);
    assert_eq!(its.len(), 300);
    assert!(its.iter().all(|i| i.marked));
    // Steady state: the same kernels every step, and all of them inside their step.
    let steady = &its[20..];
    assert_eq!(
        median(steady.iter().map(|i| u64::from(i.kernels)).collect()),
        172
    );
    assert!(
        steady.iter().all(|i| i.kernels == 172),
        "a step lost kernels"
    );
    assert_eq!(asm.late, 0);
    // GPU time inside the host window of the step, busy most of it.
    for i in steady {
        assert!(
            i.gpu_start_ns >= i.start_ns && i.gpu_end_ns <= i.end_ns,
            "{i:?}"
        );
        assert!(i.gpu_busy_ns * 10 > i.wall_ns() * 7, "{i:?}");
    }
    // Forward kernels carry the module that launched them; the rest have readable names.
    let ops: Vec<&str> = steady[0].ops.iter().map(|o| o.op.as_str()).collect();
    assert!(
        ops.iter()
            .any(|o| o.starts_with("blocks.") && o.ends_with(".up")),
        "{ops:?}"
    );
    assert!(ops.iter().any(|o| o.contains("sgemm")), "{ops:?}");
    assert!(!ops.iter().any(|o| o.starts_with("_Z")), "mangled: {ops:?}");
    // Launch latency is known for eager kernels.
    assert!(steady.iter().all(|i| !i.launch_latencies_ns.is_empty()));
    // Theoretical occupancy of every kernel, from its launch configuration.
    let occ = steady[0].occupancy.expect("occupancy");
    assert!(occ > 0.0 && occ <= 1.0, "{occ}");
    eprintln!(
        "eager step 20: occupancy {occ:.2}; by op: {:?}",
        steady[0]
            .ops
            .iter()
            .take(4)
            .map(|o| (o.op.as_str(), o.occupancy))
            .collect::<Vec<_>>()
    );
}

#[test]
fn graph_trace_replays_with_graph_and_node_level_steps() {
    let (_asm, its, kinds) = replay("h200-graphs.bin");
    eprintln!("graphs: {kinds:?}");
    assert!(kinds["graph"] > 1000, "{kinds:?}");
    assert!(kinds["graph_node"] > 100, "{kinds:?}");
    assert_eq!(its.len(), 300);
    let graph_level: Vec<&Iteration> = its[20..].iter().filter(|i| i.graph_launches > 0).collect();
    let node_level: Vec<&Iteration> = its[20..]
        .iter()
        .filter(|i| i.graph_launches == 0 && i.kernels > 100)
        .collect();
    assert!(graph_level.len() > 200, "{}", graph_level.len());
    assert_eq!(
        median(
            graph_level
                .iter()
                .map(|i| u64::from(i.graph_launches))
                .collect()
        ),
        28
    );
    // Node-level tracing was on for about 20 steps and was switched off again.
    assert!(
        (15..=25).contains(&node_level.len()),
        "{}",
        node_level.len()
    );
    // In node-level steps every graph kernel resolves to an operator (its kernel's fused ops or
    // the captured op).
    for i in &node_level {
        let named: u64 = i
            .ops
            .iter()
            .filter(|o| !o.op.starts_with("kernel#") && !o.op.starts_with("graph#"))
            .map(|o| o.gpu_ns)
            .sum();
        let all: u64 = i.ops.iter().map(|o| o.gpu_ns).sum();
        assert!(named * 100 >= all * 95, "{:?}", i.ops);
    }
}

/// Without step markers the iterations of the eager job are found from the period of its kernel
/// sequence, and those of the CUDA-graph job from its graph launches.
#[test]
fn iterations_are_detected_without_markers() {
    let (_, its, _) = replay_with("h200-eager.bin", false);
    eprintln!("eager, detected: {} iterations", its.len());
    assert!((295..=300).contains(&its.len()), "{}", its.len());
    assert!(its.iter().all(|i| !i.marked));
    let steady = &its[30..its.len() - 5];
    assert!(
        steady.iter().all(|i| i.kernels == 172),
        "{:?}",
        steady.iter().map(|i| i.kernels).collect::<Vec<_>>()
    );
    let walls: Vec<u64> = steady.iter().map(Iteration::wall_ns).collect();
    let m = median(walls.clone());
    // The marked run's steps take about 17.7 ms.
    assert!((15_000_000..20_000_000).contains(&m), "{m}");

    let (_, its, _) = replay_with("h200-graphs.bin", false);
    eprintln!("graphs, detected: {} iterations", its.len());
    assert!((270..=300).contains(&its.len()), "{}", its.len());
}
