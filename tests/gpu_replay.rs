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
    gpu::{GpuHistory, GpuSample, GpuSnapshot},
    gputrace::Iteration,
    occupancy::SmLimits,
    pipeline::{PipelineSettings, ProcessPipeline},
    snapshot::ProcessSnapshot,
};

/// A recording's pipeline (every iteration kept), with the H200's SM limits (compute
/// capability 9.0) and SLO windows of `window_ms` (default: fitted to the recording).
fn pipeline(window_ms: Option<u64>, markers: bool) -> ProcessPipeline {
    let mut settings = PipelineSettings::recording(window_ms);
    settings.limits = SmLimits::for_capability(9, 0);
    settings.ignore_markers = !markers;
    ProcessPipeline::new(0, settings).expect("spec")
}

fn replay(name: &str) -> (ProcessSnapshot, Vec<Iteration>, BTreeMap<&'static str, u64>) {
    replay_with(name, true)
}

/// Replays a fixture; without `markers` the step records are left out, so iterations must be
/// detected.
fn replay_with(
    name: &str,
    markers: bool,
) -> (ProcessSnapshot, Vec<Iteration>, BTreeMap<&'static str, u64>) {
    let path = format!("{}/fixtures/gpu/{name}", env!("CARGO_MANIFEST_DIR"));
    let data = std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut asm = pipeline(None, markers);
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
        asm.push(&r);
    }
    assert_eq!(iter.dropped_bytes(), 0, "{name}: undecodable tail");
    asm.finish(None);
    let p = asm.snapshot();
    let its = p.iterations.iter().cloned().collect();
    (p, its, kinds)
}

/// A gzipped fixture of tests/fixtures/gpu, decompressed (with the system's gzip).
fn gunzip(name: &str) -> Vec<u8> {
    let path = format!("{}/fixtures/gpu/{name}", env!("CARGO_MANIFEST_DIR"));
    let out = std::process::Command::new("gzip")
        .args(["-dc", &path])
        .output()
        .expect("gzip");
    assert!(out.status.success(), "gzip -dc {path} failed");
    out.stdout
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
    let ops: Vec<&str> = steady[0].ops.iter().map(|o| &*o.op).collect();
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
            .map(|o| (&*o.op, o.occupancy))
            .collect::<Vec<_>>()
    );
}

#[test]
fn graph_trace_replays_with_graph_and_node_level_steps() {
    let (asm, its, kinds) = replay("h200-graphs.bin");
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
    } // The graphs launched at graph level resolve to what they run, from the node-level steps.
    let graph_ops = &asm.graph_ops;
    assert!(!graph_ops.is_empty(), "node-level kernels seen");
    let mut time = (0u64, 0u64); // (GPU ns of graph launches, of those with known contents)
    for i in &graph_level {
        for o in i.ops.iter().filter(|o| o.op.starts_with("graph#")) {
            time.0 += o.gpu_ns;
            let id: u32 = o.op["graph#".len()..].parse().expect("graph id");
            if let Some(ops) = graph_ops.get(&id) {
                time.1 += o.gpu_ns;
                assert!(!ops.is_empty());
                assert!(
                    ops.iter().all(|(l, _)| !l.starts_with("kernel#")),
                    "{ops:?}"
                );
                let share: f64 = ops.iter().map(|(_, s)| s).sum();
                assert!(share > 0.5 && share <= 1.0 + 1e-9, "{share}");
            }
        }
    }
    eprintln!(
        "graph launches with known contents: {:.1}% of their GPU time; {} graphs",
        100.0 * time.1 as f64 / time.0.max(1) as f64,
        graph_ops.len()
    );
    assert!(time.1 * 100 >= time.0 * 95, "{time:?}");
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

/// NVML samples every 200 ms over the recorded job (synthetic values: the H200 run's NVML
/// history was not recorded), aligned to the replayed iterations the way the agent does: every
/// iteration is on device 0 and gets the sample that covers it, and one that straddles two
/// samples gets their overlap-weighted mean.
#[test]
fn replayed_iterations_align_to_nvml_samples() {
    let (_, its, _) = replay("h200-eager.bin");
    const PERIOD: u64 = 200_000_000;
    let first = its.first().expect("iterations").gpu_start_ns;
    let last = its.last().expect("iterations").gpu_end_ns;
    let util = |t: u64| ((t / PERIOD) % 100) as f64;
    let mut history = GpuHistory::new(10_000);
    let mut t = first - first % PERIOD;
    while t < last + PERIOD {
        history.push(GpuSnapshot {
            taken_at_ns: t,
            devices: vec![GpuSample {
                index: 0,
                gpu_util_percent: Some(util(t)),
                ..Default::default()
            }],
            ..GpuSnapshot::default()
        });
        t += PERIOD;
    }
    let mut straddling = 0;
    for i in &its {
        assert_eq!(i.device, Some(0), "{i:?}");
        let g = history
            .align(0, i.gpu_start_ns, i.gpu_end_ns)
            .unwrap_or_else(|| panic!("step {} not aligned", i.step));
        let (a, b) = (i.gpu_start_ns, i.gpu_end_ns);
        // Samples at k·PERIOD cover (k·PERIOD − PERIOD, k·PERIOD].
        let (mut k, mut n, mut sum, mut weight) = (a.div_ceil(PERIOD) * PERIOD, 0, 0.0, 0.0);
        loop {
            let overlap = (k.min(b) - (k - PERIOD).max(a)).max(1) as f64;
            sum += overlap * util(k);
            weight += overlap;
            n += 1;
            if k >= b {
                break;
            }
            k += PERIOD;
        }
        let got = g.gpu_util_percent.expect("util");
        assert_eq!(g.samples, n, "step {}", i.step);
        assert!(
            (got - sum / weight).abs() < 1e-6,
            "step {}: {got} vs {}",
            i.step,
            sum / weight
        );
        if n > 1 {
            straddling += 1;
        }
    }
    // 17 ms steps against 200 ms samples: about one step in twelve straddles a sample.
    eprintln!(
        "{} iterations, {straddling} straddle two samples",
        its.len()
    );
    assert!(straddling > 5, "{straddling}");
}

/// The SLO engine over the recorded H200 jobs (healthy runs): the tree comes out with the
/// job's own figures and no violation opens.
#[test]
fn the_slo_engine_judges_the_recorded_jobs_healthy() {
    for name in ["h200-eager.bin", "h200-graphs.bin"] {
        // 300 steps of ~17 ms: 500 ms windows, learned over the first three after warm-up.
        let path = format!("{}/fixtures/gpu/{name}", env!("CARGO_MANIFEST_DIR"));
        let data = std::fs::read(&path).expect("fixture");
        let mut p = pipeline(Some(500), true);
        for r in RecordIter::new(&data) {
            p.push(&r.expect("decodes"));
        }
        p.finish(None);
        let e = p.engine().expect("engine");
        let s = e.snapshot();
        let iteration = s.node("iteration").expect("iteration node");
        let compute = s.node("compute").expect("compute node");
        eprintln!(
            "{name}: {} windows, {} iterations; iteration p99 {:?} ms (baseline {:?}, threshold \
             {:?}), GPU utilisation {:?}% (baseline {:?}); violations {:?}",
            s.windows,
            s.iterations,
            iteration.value,
            iteration.baseline,
            iteration.threshold,
            compute.value,
            compute.baseline,
            s.violations.iter().map(|v| &v.chain).collect::<Vec<_>>()
        );
        assert!(s.windows >= 8, "{}", s.windows);
        assert_eq!(s.iterations, 280);
        let p99 = iteration.value.expect("p99");
        assert!((15.0..30.0).contains(&p99), "{p99}");
        let util = compute.value.expect("utilisation");
        assert!(util > 80.0, "{util}");
        assert!(!s.learning);
        assert!(s.violations.is_empty(), "{:?}", s.violations);
    }
}

/// Rewrites a recorded trace so that, from step `from` on, operator `op`'s kernels run
/// `factor` times longer: everything on the GPU after each of them in the step, the step's end
/// and every later step move by the extra time (the host launched ahead of the GPU, so launch
/// times within the step stay).
fn slow_down(data: &[u8], op: &str, from: u64, factor: f64) -> Vec<u8> {
    use slo_probe_common::{
        decode, decode_as,
        gpu::{STEP_BEGIN, STEP_END, STRING_OP},
        GpuKernelRecord, GpuMemRecord, Record, StepRecord,
    };
    // First pass: the operator's id, the steps' windows, the slowed kernels' starts and extras.
    let mut op_id = None;
    let mut steps: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    let mut kernels: Vec<(u64, u64)> = Vec::new();
    for r in RecordIter::new(data).flatten() {
        match r {
            AnyRecord::String(s) if s.kind == STRING_OP && s.bytes == op.as_bytes() => {
                op_id = Some(s.id)
            }
            AnyRecord::Step(s) => {
                let e = steps.entry(s.step).or_default();
                match s.phase {
                    STEP_BEGIN => e.0 = s.ts_ns,
                    STEP_END => e.1 = s.ts_ns,
                    _ => {}
                }
            }
            _ => {}
        }
    }
    let op_id = op_id.expect("operator in the trace");
    let first = steps[&from].0;
    for r in RecordIter::new(data).flatten() {
        if let AnyRecord::GpuKernel(k) = r {
            if k.op_id == op_id && k.launch_ns >= first {
                let extra = ((k.end_ns - k.start_ns) as f64 * (factor - 1.0)) as u64;
                kernels.push((k.start_ns, extra));
            }
        }
    }
    kernels.sort_unstable();
    // Extra time accumulated before GPU time `t`, and before the end of the step holding `t`.
    let before = |t: u64| -> u64 {
        kernels
            .iter()
            .take_while(|(s, _)| *s < t)
            .map(|(_, e)| *e)
            .sum()
    };
    let ends: Vec<u64> = steps.values().map(|w| w.1).collect();
    let host_shift = |t: u64| -> u64 {
        // Everything before the end of the last step that ended before `t`.
        let end = ends.iter().copied().filter(|e| *e < t).max().unwrap_or(0);
        before(end)
    };
    let mut out = Vec::with_capacity(data.len());
    let mut off = 0;
    while off < data.len() {
        let (r, used) = decode(&data[off..]).expect("decodes");
        let bytes = &data[off..off + used];
        off += used;
        match r {
            AnyRecord::GpuKernel(_) => {
                let mut k: GpuKernelRecord = decode_as(bytes).expect("kernel");
                let slowed = kernels.binary_search_by_key(&k.start_ns, |(s, _)| *s).ok();
                let shift = before(k.start_ns);
                k.launch_ns += host_shift(k.launch_ns);
                k.start_ns += shift;
                k.end_ns += shift + slowed.map_or(0, |i| kernels[i].1);
                out.extend_from_slice(k.as_bytes());
            }
            AnyRecord::GpuMem(_) => {
                let mut m: GpuMemRecord = decode_as(bytes).expect("memory");
                let shift = before(m.start_ns);
                m.launch_ns += host_shift(m.launch_ns);
                m.start_ns += shift;
                m.end_ns += shift;
                out.extend_from_slice(m.as_bytes());
            }
            AnyRecord::Step(_) => {
                let mut s: StepRecord = decode_as(bytes).expect("step");
                s.ts_ns += if s.phase == STEP_END {
                    before(s.ts_ns)
                } else {
                    host_shift(s.ts_ns)
                };
                out.extend_from_slice(s.as_bytes());
            }
            _ => out.extend_from_slice(bytes),
        }
    }
    out
}

/// A cause injected into a recorded H200 job: from step 200 on, `blocks.2.down` runs 8× longer.
/// The engine opens a violation and attribution names that operator, as an execution slowdown.
#[test]
fn an_operator_slowed_down_in_a_recorded_job_is_found() {
    use slo_probe_core::attribution::Dimension;
    let path = format!("{}/fixtures/gpu/h200-eager.bin", env!("CARGO_MANIFEST_DIR"));
    let data = std::fs::read(&path).expect("fixture");
    let slowed = slow_down(&data, "blocks.2.down", 200, 8.0);
    let mut p = pipeline(Some(500), true);
    for r in RecordIter::new(&slowed) {
        p.push(&r.expect("rewritten records decode"));
    }
    p.finish(None);
    let its: Vec<Iteration> = p.snapshot().iterations.iter().cloned().collect();
    assert_eq!(its.len(), 300);
    let e = p.engine().expect("engine");
    let v = e
        .violations()
        .iter()
        .find(|v| v.attribution.is_some())
        .expect("a violation with an attribution");
    eprintln!("{}", v.chain);
    let onset = its[200].start_ns;
    assert!(v.opened_ns > onset, "opened before the slowdown");
    let top = v
        .attribution
        .as_ref()
        .and_then(|a| a.top())
        .expect("top cause");
    assert_eq!(
        (top.op.as_str(), top.dimension),
        ("blocks.2.down", Dimension::Execution)
    );
}

/// A launch-bound eager job (`examples/train_ddp.py --dim 512 --depth 24 --batch 64`) under the
/// default shim, which traces kernels in sample windows only, during the busy-neighbour fault of
/// `RECORD=1 scripts/gpu-heal` on the H200 (2026-12-03, 20 s trimmed), beside the job's own step
/// times (`h200-heal-sampled.steps`: step, wall ms between its perf_counter() calls around the
/// step, which ends in a CUDA event's synchronize). The answer comes from the job, not from the
/// engine. The iterations' times must be the job's: before, an iteration outside the sample
/// windows was timed by the period between its copies on the GPU (5 and 113 ms for 57 ms steps),
/// and the first traced one after them from an end of the GPU's work the timeline had not seen.
#[test]
fn a_sampled_eager_job_has_its_own_step_times() {
    let dir = format!("{}/fixtures/gpu", env!("CARGO_MANIFEST_DIR"));
    let data = gunzip("h200-heal-sampled.bin.gz");
    let mut asm = pipeline(None, true);
    for r in RecordIter::new(&data) {
        asm.push(&r.expect("record decodes"));
    }
    asm.finish(None);
    let job: BTreeMap<u64, f64> = std::fs::read_to_string(format!("{dir}/h200-heal-sampled.steps"))
        .expect("steps")
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            Some((f.next()?.parse().ok()?, f.next()?.parse().ok()?))
        })
        .collect();
    let p = asm.snapshot();
    let pairs: Vec<(f64, f64, bool)> = p
        .iterations
        .iter()
        .filter_map(|i| Some((i.step_ns() as f64 / 1e6, *job.get(&i.step)?, i.traced)))
        .collect();
    assert!(
        pairs.len() >= 360,
        "{} iterations matched the job's steps",
        pairs.len()
    );
    assert!(
        pairs.iter().any(|p| p.2) && pairs.iter().any(|p| !p.2),
        "sampled and not"
    );
    let close = pairs
        .iter()
        .filter(|(a, j, _)| (a - j).abs() <= 0.1 * j + 1.0)
        .count();
    assert!(
        close as f64 >= 0.97 * pairs.len() as f64,
        "{close} of {} iterations within 10% + 1 ms of the job's own time",
        pairs.len()
    );
    let q = |mut v: Vec<f64>, f: f64| {
        v.sort_by(f64::total_cmp);
        v[((v.len() as f64 * f) as usize).min(v.len() - 1)]
    };
    let (ours, theirs): (Vec<f64>, Vec<f64>) = pairs.iter().map(|p| (p.0, p.1)).unzip();
    let (p99, job_p99) = (q(ours.clone(), 0.99), q(theirs.clone(), 0.99));
    assert!(
        (p99 - job_p99).abs() <= 0.1 * job_p99,
        "P99 {p99:.1} ms, the job's {job_p99:.1} ms"
    );
    let (p50, job_p50) = (q(ours, 0.5), q(theirs, 0.5));
    assert!(
        (p50 - job_p50).abs() <= 0.05 * job_p50,
        "P50 {p50:.1} ms, the job's {job_p50:.1} ms"
    );
}

/// A job without step markers of its own under `torch.compile`, run with `slo-probe run`'s
/// automatic markers (one step per `optimizer.step()`; `scripts/gpu-autostep-check`, H100,
/// 2026-12-07): 30 warm-up and 60 measured steps, so 89 complete ones, whose markers begin
/// only after the compilation and the first step. Replayed with time moving as in the agent,
/// they are the process's iterations. Live, the agent had detected 7 iterations before them
/// (the model's parameter copies, below) and kept the label "detected", with 96 iterations;
/// since, markers that begin late restart the count (`ProcessPipeline`, its unit test
/// `markers_that_begin_late_restart_the_iterations`), and those copies are no iterations.
#[test]
fn automatic_markers_that_begin_late_are_the_iterations() {
    let s = replay_live("h100-compile-automarkers.bin.gz", false);
    assert_eq!(s.iterations_total, 89);
    assert!(s.iterations.iter().all(|i| i.marked));
    assert!(s.stats.as_ref().is_some_and(|st| st.marked));
}

/// The same recording with its markers ignored, as a job without them is seen: 89 iterations
/// detected for its 90 steps. Moving the model to the GPU copied each layer's parameters, a
/// period of copies before the first step; those were 7 "iterations" of ~3 ms without a kernel
/// (96 in all) until detected iterations without compute under kernel tracing were left out.
#[test]
fn a_compiled_job_without_markers_counts_no_iterations_before_its_first_step() {
    let s = replay_live("h100-compile-automarkers.bin.gz", true);
    assert_eq!(s.iterations_total, 89);
    assert!(s.iterations.iter().all(|i| !i.marked && i.kernels > 0));
}

/// Jobs that mark no steps, as `slo-probe run --no-auto-steps` saw them (H100, 2026-12-07,
/// `CASES='off$' STEPS=150 scripts/gpu-autostep-check`): the overhead benchmark's GPT, whose
/// batches are already on the GPU (no host-to-device copy a step), 30 warm-up and 150 measured
/// steps, 179 complete, counted from what the shim traces. Under `torch.compile` the steps'
/// fills and copies were searched together with the model's parameter copies before them
/// (899 iterations); under `reduce-overhead` likewise, six steps an iteration (34). The
/// launch-bound eager job (kernels traced in sample windows only) has one fill a step, a lone
/// token once refused (44 iterations from the windows' kernels), now one a step at its steady
/// pace.
#[test]
fn jobs_without_markers_whose_batches_are_on_the_gpu_count_their_steps() {
    for (name, expected) in [
        ("h100-eager-gpu-nomarkers.bin.gz", 179),
        ("h100-compile-nomarkers.bin.gz", 179),
        ("h100-ro-nomarkers.bin.gz", 179),
        ("h100-eager-launch-nomarkers.bin.gz", 179),
    ] {
        let s = replay_live(name, false);
        let n = s.iterations_total;
        assert!(
            n.abs_diff(expected) * 100 <= expected,
            "{name}: {n} iterations for {expected}"
        );
        assert!(s.iterations.iter().all(|i| !i.marked));
    }
}

/// The live agent drains its shims and advances its pipelines every 50 ms. Taken at that pace,
/// the iterations of two jobs without markers whose batches stay on the GPU were wrong: recorded
/// live on an H100 (2026-12-07, `bench/results/device-2026-12-07c`), the reduce-overhead job
/// counted 894 live for 229 steps, and 894 here at 50 ms (228 at 200 ms and 1 s); the
/// GPU-bound eager one 268 live, 248, 248 and 247 here (229 replayed at its host samples'
/// pace alone). Three causes, each fixed where the detection is (`gputrace.rs`, `cycle.rs`):
/// under reduce-overhead, a take while the job captured its graphs found a period of 2 in a
/// run of one fill kernel and cut 667 iterations from it (a run of one name has no period);
/// the eager job's lock, on 10 of its 17 4-byte fills a step, matched every 10 of them while
/// the rest of its copies had not come (occurrences closer than half a period cut nothing),
/// and searched again on those fills alone it took them for one token a step (more than one
/// long gap among them: refused, and a search after a lost lock waits for the rest); a copy
/// whose launch was placed before a cut went missing from the next take's sequence (carried
/// into it). Live recordings of the same jobs made later (`device-2026-12-07d`, call 1) replay
/// within 1% at 50 ms with the agent's clock up to 700 ms ahead of its records.
#[test]
fn iterations_without_markers_do_not_depend_on_how_often_they_are_taken() {
    let dir = slo_probe_tests::tempdir("gpu-replay", "pace");
    let mut wrong = Vec::new();
    for (name, expected) in [
        ("h100-ro-nomarkers-live.bin.gz", 228),
        ("h100-eager-gpu-nomarkers-live.bin.gz", 229),
    ] {
        let bin = dir.join(name.trim_end_matches(".gz"));
        std::fs::write(&bin, gunzip(name)).expect("write the recording");
        // Every 50 ms with the clock as far ahead of the records as 0.5 s (live it is, while
        // CUPTI holds records in its buffers), and every 200 ms and 1 s.
        for (every_ms, ahead_ms) in [(50u64, 0u64), (50, 200), (50, 500), (200, 0), (1000, 0)] {
            // As `slo-probe replay --arrival --advance-ms --clock-ahead-ms` replays it.
            let opts = slo_probe::cli::replay::ReplayOptions {
                limits: SmLimits::for_capability(9, 0),
                spec: Some(slo_probe_core::slo::SloSpec::default()),
                arrival: true,
                advance_ms: Some(every_ms),
                clock_ahead_ms: ahead_ms,
                ..Default::default()
            };
            let r = slo_probe::cli::replay::replay_with(&bin, &opts).expect("replays");
            let n = r.process.iterations_total;
            if n.abs_diff(expected) * 100 > expected {
                wrong.push(format!(
                    "{name} every {every_ms} ms, {ahead_ms} ms ahead: {n} for {expected}"
                ));
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(wrong.is_empty(), "{wrong:?}");
}

/// A longer run of the GPU-bound eager job (H100, 2026-12-07, `bench/results/device-2026-12-07d`
/// call 5: 800 measured steps, 829 complete): live the agent counted 603. The shim's planner
/// switched kernel tracing off and on under a ~40 ms queue (its log: "duty-cycled again: the GPU
/// runs 38.9 ms behind", then "held on", then duty-cycled again), and CUPTI then held the
/// job's copy and fill records other than its 4-byte fills for seconds; the lock on the copies
/// was lost, the search waited its 5 s for them, then fell back to the kernels' period, whose
/// iterations span the stretches without kernels (two of 2 s and 0.8 s). Replayed so (by
/// arrival, every 50 ms, with its host samples) it counts 603, as live; by end time 829. The
/// agent cannot count what it has not received: the fix is in the shim, whose planner no longer
/// ends such a hold on its cost while the queue is deep (714261e, 9296d4b); detection still
/// miscounts a recording made so (run with `--ignored`).
#[test]
#[ignore = "records held back by CUPTI for longer than detection waits (README, 2026-12-07)"]
fn a_long_run_whose_copies_come_late_counts_its_steps() {
    let dir = slo_probe_tests::tempdir("gpu-replay", "long");
    let name = "h100-eager-gpu-nomarkers-long-live.bin.gz";
    let bin = dir.join(name.trim_end_matches(".gz"));
    std::fs::write(&bin, gunzip(name)).expect("write the recording");
    // Its host samples beside it, as the agent wrote them: the replay advances at them too.
    let host = "h100-eager-gpu-nomarkers-long-live.host.jsonl";
    let from = format!("{}/fixtures/gpu/{host}", env!("CARGO_MANIFEST_DIR"));
    std::fs::copy(from, dir.join(host)).expect("copy the host samples");
    let opts = slo_probe::cli::replay::ReplayOptions {
        limits: SmLimits::for_capability(9, 0),
        spec: Some(slo_probe_core::slo::SloSpec::default()),
        arrival: true,
        advance_ms: Some(50),
        sidecars: true,
        ..Default::default()
    };
    let n = slo_probe::cli::replay::replay_with(&bin, &opts)
        .expect("replays")
        .process
        .iterations_total;
    let _ = std::fs::remove_dir_all(&dir);
    assert!(n.abs_diff(829) * 100 <= 829, "{n} iterations for 829");
}

/// Replays a gzipped recording with time moving as in the agent.
fn replay_live(name: &str, ignore_markers: bool) -> ProcessSnapshot {
    let data = gunzip(name);
    let mut settings = PipelineSettings::live(slo_probe_core::slo::SloSpec::default(), 0);
    settings.limits = SmLimits::for_capability(9, 0);
    settings.ignore_markers = ignore_markers;
    let mut p = ProcessPipeline::new(0, settings).expect("spec");
    let mut now = 0u64;
    for (k, r) in RecordIter::new(&data).enumerate() {
        let r = r.expect("record decodes");
        now = now.max(match &r {
            AnyRecord::GpuKernel(g) => g.end_ns,
            AnyRecord::GpuMem(m) => m.end_ns,
            AnyRecord::Step(s) => s.ts_ns,
            _ => 0,
        });
        p.push(&r);
        if k % 500 == 0 {
            p.advance(now, None, true);
        }
    }
    p.finish(None);
    p.snapshot()
}
