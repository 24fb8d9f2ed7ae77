//! The per-process GPU pipeline, the one path from a training process's records to what a
//! snapshot shows of it: decoded records → iteration assembly ([`TraceAssembler`]) → what NVML
//! saw on the GPU while each iteration ran ([`GpuHistory`]) → SLO windows, violations and
//! attribution ([`SloEngine`]) → a [`ProcessSnapshot`]. The live agent, `replay`, the
//! known-answer runs, the benches and the tests all drive it; nothing else wires these stages.
//!
//! Time only moves when the caller says so ([`ProcessPipeline::advance`] with the current
//! CLOCK_MONOTONIC time): an iteration completes once it ended [`PipelineSettings::settle_ns`]
//! ago (CUPTI delivers records in buffers), and windows close [`PipelineSettings::lag_ns`]
//! behind now (they need the iterations and a host sample after their end).
//! [`ProcessPipeline::finish`] completes everything (the process is gone, or a recording ended).
//!
//! [`Pipelines`] holds one pipeline per training process: sources push records and host samples
//! into it, the tick driver advances it and reads the snapshots, and processes that ended are
//! retired after a retention time.

use std::{collections::BTreeMap, sync::Arc};

use slo_probe_common::{decode, AnyRecord};

use crate::{
    gpu::GpuHistory,
    gputrace::{Iteration, TraceAssembler},
    host::HostSample,
    occupancy::SmLimits,
    slo::{SloEngine, SloSpec, SloSpecError},
    snapshot::{IterationHistory, ProcessSnapshot},
};

/// How long after its end an iteration waits for its GPU records, ns: CUPTI hands records over
/// in buffers, flushed by the shim every 200 ms.
pub const SETTLE_NS: u64 = 1_500_000_000;

/// Iterations a live pipeline keeps for snapshots.
pub const KEEP_ITERATIONS: usize = 512;

/// How long a completed iteration waits for an NVML sample after its end, ns, before it is
/// published without one.
pub const NVML_WAIT_NS: u64 = 2_000_000_000;

/// Host samples a live pipeline keeps before its first iteration (when its SLO engine is made:
/// an engine's histograms cost about a megabyte, which a process that never completes an
/// iteration does not pay).
const HOST_EARLY_LIVE: usize = 128;

/// How often a live view's graph profiles are rebuilt, ns.
const GRAPH_OPS_PERIOD_NS: u64 = 1_000_000_000;

/// A healthy job that replays CUDA graphs is traced node by node this often, for a short
/// sample: graph-level records say only that a graph got slower, and the node-level samples
/// of healthy windows are the baseline that tells what in it did
/// ([`crate::attribution::refine_graph_cause`]). Node-level tracing costs 0.3–0.5 µs per graph
/// node (H200, `../shared/research/cupti.md`), so a sample of 10 iterations every 10 s costs a
/// job well under 0.1% of its time.
const NODE_SAMPLE_PERIOD_NS: u64 = 10_000_000_000;

/// Node-level iterations a sample lasts, or at most [`NODE_SAMPLE_MAX_NS`] (a shim that does
/// not trace nodes does not hold the request forever).
const NODE_SAMPLE_ITERATIONS: u32 = 10;

/// The longest a node-level sample is asked for.
const NODE_SAMPLE_MAX_NS: u64 = 3_000_000_000;

/// Host samples a recording's pipeline keeps before its windows are fitted.
const HOST_EARLY_RECORDING: usize = 4096;

/// How SLO windows are laid out.
#[derive(Clone, Debug, PartialEq)]
pub enum Windows {
    /// The spec as given (the live agent).
    Fixed,
    /// Fitted to a recording when its iterations are first completed: windows of the given
    /// length in ms, or by default a fifteenth of the iterations' span (100 ms to 10 s), with
    /// 3 learning windows when there are fewer than 30 windows (6 otherwise), so that
    /// baselines are learned within the recording.
    FitToRecording(Option<u64>),
}

/// What a pipeline is set up with.
#[derive(Clone, Debug)]
pub struct PipelineSettings {
    /// The SLO tree and its windows.
    pub slo: SloSpec,
    /// Whether the windows are fixed or fitted to a recording.
    pub windows: Windows,
    /// See [`SETTLE_NS`].
    pub settle_ns: u64,
    /// How far behind now windows close, ns.
    pub lag_ns: u64,
    /// Iterations kept for snapshots (`None`: all, for a recording).
    pub keep_iterations: Option<usize>,
    /// The GPU's per-SM limits, for theoretical occupancy.
    pub limits: Option<SmLimits>,
    /// Leave step markers out and detect iterations (as for a job that sends none).
    pub ignore_markers: bool,
}

impl PipelineSettings {
    /// The live agent's: `spec`, windows closing a settle time plus one `tick` behind now.
    pub fn live(spec: SloSpec, tick_ns: u64) -> Self {
        Self {
            slo: spec,
            windows: Windows::Fixed,
            settle_ns: SETTLE_NS,
            lag_ns: SETTLE_NS + tick_ns,
            keep_iterations: Some(KEEP_ITERATIONS),
            limits: None,
            ignore_markers: false,
        }
    }

    /// A recording's: every iteration kept, windows fitted to it (see
    /// [`Windows::FitToRecording`]), nothing waits (the recording is complete).
    pub fn recording(window_ms: Option<u64>) -> Self {
        Self {
            slo: SloSpec::default(),
            windows: Windows::FitToRecording(window_ms),
            settle_ns: 0,
            lag_ns: 0,
            keep_iterations: None,
            limits: None,
            ignore_markers: false,
        }
    }
}

/// The spec fitted to iterations ending from `first` to `last` ns (see
/// [`Windows::FitToRecording`]).
pub fn fitted_spec(base: &SloSpec, first: u64, last: u64, window_ms: Option<u64>) -> SloSpec {
    let window_ms =
        window_ms.unwrap_or_else(|| ((last - first) / 1_000_000 / 15).clamp(100, 10_000));
    let windows = (last - first) / 1_000_000 / window_ms.max(1);
    SloSpec {
        window_ms,
        learn_windows: if windows < 30 { 3 } else { 6 },
        ..base.clone()
    }
}

/// One training process's pipeline.
pub struct ProcessPipeline {
    settings: PipelineSettings,
    asm: TraceAssembler,
    /// `None` until the first iteration completes (live), or until the windows are fitted
    /// ([`Windows::FitToRecording`]); dropped again when a live process is gone
    /// ([`ProcessPipeline::release`]).
    engine: Option<SloEngine>,
    /// Host samples that came before the engine.
    host_early: Vec<HostSample>,
    /// Completed iterations waiting for an NVML sample after their end, oldest first.
    staged: Vec<(u64, Iteration)>,
    view: ProcessSnapshot,
    history: IterationHistory,
    /// The history grew since the view's statistics were computed.
    stats_stale: bool,
    /// Windows closed when the view's SLO tree was last refreshed.
    slo_windows: u64,
    /// The process is gone and its last window closed: the engine stops (no stall is reported
    /// for a job that ended).
    finished: bool,
    /// Step markers left out ([`PipelineSettings::ignore_markers`]).
    markers_ignored: u64,
    /// Records that did not decode.
    decode_failed: u64,
    /// CLOCK_MONOTONIC ns of the last advance.
    now_ns: u64,
    /// When the view's graph profiles were last rebuilt, ns.
    graph_ops_at: u64,
    /// The process replays CUDA graphs.
    graphs_seen: bool,
    /// How the job's CUDA graphs were captured (for the engine).
    composition: Arc<crate::gputrace::GraphComposition>,
    /// A node-level sample asked for: since when, and the node-level iterations it still needs.
    node_sample: Option<(u64, u32)>,
    /// When the next node-level sample is due, ns.
    node_sample_due: u64,
    /// Iterations from step markers were completed (the clock they set is kept from then on).
    marked: bool,
}

impl ProcessPipeline {
    /// A pipeline for process `pid`. Refuses an invalid SLO spec.
    pub fn new(pid: u32, settings: PipelineSettings) -> Result<Self, SloSpecError> {
        settings.slo.validate()?;
        let engine = None;
        let mut asm = TraceAssembler::new();
        asm.set_limits(settings.limits);
        // A live process's iterations are taken as time goes: what stays pending is capped.
        asm.set_bounded(settings.keep_iterations.is_some());
        Ok(Self {
            settings,
            asm,
            engine,
            host_early: Vec::new(),
            staged: Vec::new(),
            view: ProcessSnapshot {
                pid,
                ..Default::default()
            },
            history: IterationHistory::default(),
            stats_stale: false,
            slo_windows: 0,
            finished: false,
            markers_ignored: 0,
            decode_failed: 0,
            now_ns: 0,
            graph_ops_at: 0,
            graphs_seen: false,
            composition: Arc::default(),
            node_sample: None,
            node_sample_due: 0,
            marked: false,
        })
    }

    /// The process's identity and its shim's transport counters, to fill in by the source.
    pub fn info_mut(&mut self) -> &mut ProcessSnapshot {
        &mut self.view
    }

    /// Sets the GPU's per-SM limits, for theoretical occupancy of the kernels that follow.
    pub fn set_limits(&mut self, limits: Option<SmLimits>) {
        self.settings.limits = limits;
        self.asm.set_limits(limits);
    }

    /// Takes one decoded record.
    pub fn push(&mut self, r: &AnyRecord<'_>) {
        if self.settings.ignore_markers && matches!(r, AnyRecord::Step(_)) {
            self.markers_ignored += 1;
            return;
        }
        self.asm.push(r);
    }

    /// Decodes one framed record and takes it; a record that does not decode is counted.
    pub fn push_bytes(&mut self, bytes: &[u8]) {
        match decode(bytes) {
            Ok((r, _)) => self.push(&r),
            Err(_) => self.decode_failed += 1,
        }
    }

    /// Takes a host sample of the process's part of the job (cumulative counters, in time
    /// order).
    pub fn push_host(&mut self, s: HostSample) {
        match &mut self.engine {
            Some(e) => e.push_host(s),
            None if self.settings.windows == Windows::Fixed => {
                if self.host_early.len() >= HOST_EARLY_LIVE {
                    self.host_early.remove(0);
                }
                self.host_early.push(s);
            }
            None if self.host_early.len() < HOST_EARLY_RECORDING => self.host_early.push(s),
            None => {}
        }
    }

    /// Moves time to `now_ns`: completes the iterations that settled, gives them what NVML saw
    /// (`gpu`), feeds them to the SLO engine and closes the windows that ended. `connected`:
    /// whether the process is still there; once it is not, everything it sent is completed
    /// and its last window closed (see [`ProcessPipeline::finish`]).
    pub fn advance(&mut self, now_ns: u64, gpu: Option<&GpuHistory>, connected: bool) {
        if !connected {
            self.finish(gpu);
            return;
        }
        self.now_ns = self.now_ns.max(now_ns);
        let done = self
            .asm
            .take_iterations(now_ns, self.settings.settle_ns, false);
        let horizon = now_ns.saturating_sub(self.settings.lag_ns);
        self.complete(done, horizon);
        if !self.finished {
            if let Some(e) = &mut self.engine {
                e.advance(horizon);
            }
        }
        self.schedule_node_sample();
        self.publish(gpu, false);
        self.refresh();
    }

    /// Completes everything: pending iterations (the process is gone, or a recording ended),
    /// and the window of the last iteration. Later advances do not move the engine.
    pub fn finish(&mut self, gpu: Option<&GpuHistory>) {
        let done = self.asm.take_iterations(0, 0, true);
        self.complete(done, u64::MAX);
        if !self.finished {
            if let Some(e) = &mut self.engine {
                let last = self.view.iterations.last().map_or(0, |i| i.end_ns);
                let staged_last = self.staged.iter().map(|(_, i)| i.end_ns).max();
                let last = staged_last.map_or(last, |s| s.max(last));
                e.advance(last + e.spec().window_ns());
            }
            self.finished = true;
        }
        self.publish(gpu, true);
        self.refresh();
    }

    /// Whether [`ProcessPipeline::finish`] ran.
    pub fn finished(&self) -> bool {
        self.finished
    }

    /// The process is back (its shim registered again): the engine moves with time again.
    pub fn resume(&mut self) {
        self.finished = false;
    }

    /// Frees what only a running process needs (the assembler's tables and pending records,
    /// the SLO engine's histograms) once it is gone; the snapshot keeps its last state for the
    /// retention time. A process that comes back starts a new engine.
    pub fn release(&mut self) {
        self.asm.release();
        self.engine = None;
        self.host_early = Vec::new();
        self.staged = Vec::new();
    }

    /// Feeds completed iterations to the engine in the order they ended, closing windows up to
    /// each one's end (at most `horizon`), and stages them for NVML.
    fn complete(&mut self, done: Vec<Iteration>, horizon: u64) {
        if done.is_empty() {
            return;
        }
        if !self.marked && done.iter().any(|i| i.marked) {
            self.marked = true;
            self.restart_on_markers();
        }
        for i in &done {
            self.graphs_seen |= i.graph_launches > 0;
            if let Some((_, left)) = self.node_sample.as_mut() {
                if i.traced && i.graph_nodes > 0 {
                    *left = left.saturating_sub(1);
                }
            }
        }
        if self.engine.is_none() {
            let spec = match self.settings.windows {
                Windows::Fixed => self.settings.slo.clone(),
                Windows::FitToRecording(window_ms) => {
                    let first = done.iter().map(|i| i.end_ns).min().unwrap_or(0);
                    let last = done.iter().map(|i| i.end_ns).max().unwrap_or(0);
                    fitted_spec(&self.settings.slo, first, last, window_ms)
                }
            };
            // The base spec was validated; a fitted window is within the valid range.
            if let Ok(mut e) = SloEngine::new(spec) {
                e.set_graph_composition(self.composition.clone());
                for s in self.host_early.drain(..) {
                    e.push_host(s);
                }
                self.engine = Some(e);
            }
        }
        if let Some(c) = self.asm.graph_composition() {
            self.composition = Arc::new(c);
            if let Some(e) = &mut self.engine {
                e.set_graph_composition(self.composition.clone());
            }
        }
        if !self.finished {
            if let Some(e) = &mut self.engine {
                let mut order: Vec<&Iteration> = done.iter().collect();
                order.sort_by_key(|i| i.end_ns);
                for i in order {
                    e.push_iteration(i);
                    e.advance(i.end_ns.min(horizon));
                }
            }
        }
        self.view.iterations_total += done.len() as u64;
        let steps_ns = done
            .iter()
            .map(Iteration::step_ns)
            .fold(0, u64::saturating_add);
        self.view.steps_ns = self.view.steps_ns.saturating_add(steps_ns);
        let at = self.now_ns;
        self.staged.extend(done.into_iter().map(|i| (at, i)));
    }

    /// Step markers began after iterations were detected without them: the automatic markers
    /// of `slo-probe run` begin at the job's first `optimizer.step()`, after its compilation
    /// and first steps (on an H100, a `torch.compile` job's detected iterations before it
    /// spanned up to 6.8 s and kept the process labelled "detected"), and a script may mark its
    /// steps only after a warm-up. What came before was warm-up under another clock: the
    /// iterations start over with the markers' clock (count, history, the SLO engine and its
    /// baselines), so that no detected iteration enters a baseline of marked ones.
    fn restart_on_markers(&mut self) {
        if self.view.iterations_total == 0 {
            return; // (staged iterations are counted in it)
        }
        self.view.iterations_before_markers = self.view.iterations_total;
        self.view.iterations_total = 0;
        self.view.steps_ns = 0;
        self.view.slo = None;
        self.staged.clear();
        self.history = IterationHistory::default();
        self.stats_stale = true;
        self.engine = None;
        self.slo_windows = 0;
    }

    /// Moves staged iterations into the history once NVML has a sample after their end (or
    /// never will: no NVML, an unknown device, waited too long, `flush`).
    fn publish(&mut self, gpu: Option<&GpuHistory>, flush: bool) {
        if self.staged.is_empty() {
            return;
        }
        let latest = gpu.and_then(|h| h.latest()).map(|s| s.taken_at_ns);
        let now = self.now_ns;
        let mut ready = 0;
        for (at, it) in self.staged.iter_mut() {
            if let (Some(h), Some(dev), None) = (gpu, it.device, &it.gpu) {
                it.gpu = h.align(dev, it.gpu_start_ns, it.gpu_end_ns);
            }
            let settled = gpu.is_none()
                || it.gpu.is_some()
                || it.device.is_none()
                || latest.is_some_and(|l| l >= it.gpu_end_ns)
                || now.saturating_sub(*at) >= NVML_WAIT_NS
                || flush;
            if !settled {
                break;
            }
            ready += 1;
        }
        if ready == 0 {
            return;
        }
        let its: Vec<Iteration> = self.staged.drain(..ready).map(|(_, i)| i).collect();
        self.history.push(its, self.settings.keep_iterations);
        self.stats_stale = true;
    }

    /// Refreshes the view's assembler counters and SLO tree.
    fn refresh(&mut self) {
        let v = &mut self.view;
        v.seen = self.asm.seen;
        v.late = self.asm.late;
        v.ops_overflowed = self.asm.ops_overflowed();
        v.strings_dropped = self.asm.strings_dropped;
        v.capped = self.asm.capped;
        v.decode_failed = self.decode_failed;
        // Rebuilt at most once a second (it walks every graph's profile), and at the end.
        if self.finished || self.now_ns >= self.graph_ops_at + GRAPH_OPS_PERIOD_NS {
            if let Some(g) = self.asm.graph_ops() {
                v.graph_ops = Arc::new(g);
                self.graph_ops_at = self.now_ns;
            }
        }
        if let Some(e) = &self.engine {
            let windows = e.snapshot_windows();
            if windows != self.slo_windows || v.slo.is_none() && (windows > 0 || self.finished) {
                self.slo_windows = windows;
                v.slo = Some(Arc::new(e.snapshot()));
            }
        }
    }

    /// What a snapshot shows of the process now: shares the history, and computes its
    /// statistics when it changed (once per tick in the agent, not per record batch).
    pub fn snapshot(&mut self) -> ProcessSnapshot {
        if std::mem::take(&mut self.stats_stale) {
            self.view.set_iterations(self.history.clone());
        }
        self.view.clone()
    }

    /// The depth the shim should trace at for the SLO engine (`gpu::DEPTH_*`): kernels as soon
    /// as an iteration node breaches (before a violation opens), for as long as an attribution
    /// needs traced iterations; node by node when the job replays CUDA graphs and the
    /// attribution points into a graph (until enough node-level iterations of the slowdown
    /// say what in it), and in short samples while it is healthy (their baseline); 0 (the
    /// shim's own duty-cycled tier) otherwise.
    pub fn wanted_depth(&self) -> u32 {
        use crate::slo::NodeState;
        use slo_probe_common::gpu::{DEPTH_KERNELS, DEPTH_NODES, DEPTH_TIMING};
        let Some(slo) = &self.view.slo else {
            return DEPTH_TIMING;
        };
        if self.finished {
            return DEPTH_TIMING;
        }
        let mut want = DEPTH_TIMING;
        // What in a graph got slower needs node-level iterations since the slowdown began.
        if self.engine.as_ref().is_some_and(SloEngine::wants_nodes) {
            want = if self.no_graph_nodes() {
                DEPTH_KERNELS
            } else {
                DEPTH_NODES
            };
        }
        // No violation of an iteration node open (a node that merely breaches, such as GPU
        // utilisation below its default objective on a job that never reaches it, or a host
        // node's violation, does not hold the samples up).
        let healthy = slo
            .violations
            .iter()
            .all(|v| v.closed_ns.is_some() || !v.metric.per_iteration());
        for n in slo
            .nodes
            .iter()
            .filter(|n| n.metric.is_some_and(|m| m.per_iteration()))
        {
            let open = slo
                .violations
                .iter()
                .find(|v| v.node == n.name && v.closed_ns.is_none());
            let kernels = match (n.state, open) {
                (NodeState::Breaching, _) => true,
                (NodeState::Violated(_), Some(v)) => v
                    .attribution
                    .as_ref()
                    .is_none_or(|a| a.traced.1 < crate::slo::engine::MIN_TRACED),
                _ => false,
            };
            // The attribution points into a CUDA graph whose contents no node-level trace has
            // shown yet: a few steps node by node tell what it runs.
            let nodes = open
                .and_then(|v| v.attribution.as_ref())
                .and_then(|a| a.top())
                .and_then(|c| crate::gputrace::graph_id_of(&c.op))
                .is_some_and(|id| !self.view.graph_ops.contains_key(&id));
            if nodes && !self.no_graph_nodes() {
                want = want.max(DEPTH_NODES);
            } else if kernels {
                want = want.max(DEPTH_KERNELS);
            }
        }
        // The healthy baseline of what graphs run: a short node-level sample now and then.
        if healthy && self.node_sample.is_some() {
            want = want.max(DEPTH_NODES);
        }
        want
    }

    /// Starts and ends the node-level samples of a job that replays CUDA graphs (see
    /// [`NODE_SAMPLE_PERIOD_NS`]): the first as soon as graphs are seen.
    fn schedule_node_sample(&mut self) {
        if !self.graphs_seen || self.finished || self.no_graph_nodes() {
            self.node_sample = None;
            return;
        }
        let now = self.now_ns;
        match self.node_sample {
            Some((since, left)) if left == 0 || now >= since + NODE_SAMPLE_MAX_NS => {
                self.node_sample = None;
                self.node_sample_due = now + NODE_SAMPLE_PERIOD_NS;
            }
            None if now >= self.node_sample_due => {
                self.node_sample = Some((now, NODE_SAMPLE_ITERATIONS));
            }
            _ => {}
        }
    }

    /// The process's shim answers node level with kernel level under CUDA graphs (its status
    /// bit `STATUS_NO_GRAPH_NODES`, as the source put it in the view): no node-level samples
    /// are asked of it, and a graph to look into asks for kernel level only.
    fn no_graph_nodes(&self) -> bool {
        self.view.status & slo_probe_common::ring::STATUS_NO_GRAPH_NODES != 0
    }

    /// Whether the job's iterations have launched CUDA graphs.
    pub fn graphs_seen(&self) -> bool {
        self.graphs_seen
    }

    /// Whether a node-level sample is being asked for now.
    pub fn node_sampling(&self) -> bool {
        self.node_sample.is_some()
    }

    /// Step markers left out so far.
    pub fn markers_ignored(&self) -> u64 {
        self.markers_ignored
    }

    /// The SLO engine, once it exists.
    pub fn engine(&self) -> Option<&SloEngine> {
        self.engine.as_ref()
    }
}

/// Drives `p` through a recorded process the way the live agent ran it: each record in arrival
/// order with the time it arrived (`records`), the host samples at theirs, time advancing with
/// the host samples (as the agent's ticks did), NVML's samples from `gpu`; then finishes it.
pub fn drive<'a>(
    p: &mut ProcessPipeline,
    records: impl IntoIterator<Item = (u64, AnyRecord<'a>)>,
    host: &[HostSample],
    gpu: Option<&GpuHistory>,
) {
    drive_ticks(p, records, host, gpu, |_, _| {});
}

/// [`drive`], calling `tick` with the pipeline and the time after each of its advances (the
/// agent's ticks, where its healer looked at the snapshot).
pub fn drive_ticks<'a>(
    p: &mut ProcessPipeline,
    records: impl IntoIterator<Item = (u64, AnyRecord<'a>)>,
    host: &[HostSample],
    gpu: Option<&GpuHistory>,
    tick: impl FnMut(&mut ProcessPipeline, u64),
) {
    drive_every(p, records, host, gpu, Every::default(), tick);
}

/// How often [`drive_every`] advances a pipeline besides the host samples.
#[derive(Clone, Copy, Debug, Default)]
pub struct Every {
    /// Every this much record time, ns (0: only at the host samples).
    pub every_ns: u64,
    /// Each such advance at this much past the record time, ns: live, the agent's clock runs
    /// ahead of the records it has (CUPTI hands them over in buffers), so what it takes at
    /// `now` has less of what ended before `now - settle` than a replay at the record time.
    pub ahead_ns: u64,
}

/// [`drive_ticks`], advancing the pipeline also every `every.every_ns` of record time: the
/// live agent drains its shims' rings and advances every 50 ms (`agent/src/sources/shim`), and
/// how often iterations are taken changed what detection found (2026-12-07, H100: the overhead
/// benchmark's GPT under `reduce-overhead` without markers, 228 iterations taken at the host
/// samples, 894 taken every 50 ms as live, before `gputrace` was made to hold its cuts).
pub fn drive_every<'a>(
    p: &mut ProcessPipeline,
    records: impl IntoIterator<Item = (u64, AnyRecord<'a>)>,
    host: &[HostSample],
    gpu: Option<&GpuHistory>,
    every: Every,
    mut tick: impl FnMut(&mut ProcessPipeline, u64),
) {
    let mut next = 0;
    // The record time of the last periodic advance, and the latest time advanced to.
    let mut advanced: Option<u64> = None;
    let mut floor = 0u64;
    for (at, r) in records {
        while next < host.len() && host[next].at_ns < at {
            p.push_host(host[next].clone());
            // Time never goes back: a periodic advance may have passed this sample.
            let now = floor.max(host[next].at_ns);
            p.advance(now, gpu, true);
            floor = now;
            tick(p, now);
            next += 1;
        }
        if every.every_ns > 0 && at > 0 {
            match advanced {
                Some(t) if at >= t + every.every_ns => {
                    let now = floor.max(at + every.ahead_ns);
                    p.advance(now, gpu, true);
                    floor = now;
                    advanced = Some(at);
                }
                None => advanced = Some(at),
                _ => {}
            }
        }
        p.push(&r);
    }
    for s in &host[next..] {
        p.push_host(s.clone());
        let now = floor.max(s.at_ns);
        p.advance(now, gpu, true);
        floor = now;
        tick(p, now);
    }
    p.finish(gpu);
}

/// When a recorded record had arrived at the latest: GPU activities once they ended, markers
/// and depth changes when they happened; names and graph nodes at once (0).
pub fn record_time(r: &AnyRecord<'_>) -> u64 {
    match r {
        AnyRecord::GpuKernel(k) => k.end_ns,
        AnyRecord::GpuMem(m) => m.end_ns,
        AnyRecord::GpuGraph(g) => g.end_ns,
        AnyRecord::GpuEvent(e) => e.ts_ns,
        AnyRecord::Step(s) => s.ts_ns,
        AnyRecord::Depth(d) => d.from_ns,
        _ => 0,
    }
}

/// One pipeline per training process, and the settings new ones get.
pub struct Pipelines {
    settings: PipelineSettings,
    procs: BTreeMap<u32, ProcessPipeline>,
    /// When each finished process finished, ns.
    finished_at: BTreeMap<u32, u64>,
    now_ns: u64,
}

impl Pipelines {
    /// No process yet; new ones get `settings` (validated here).
    pub fn new(settings: PipelineSettings) -> Result<Self, SloSpecError> {
        settings.slo.validate()?;
        Ok(Self {
            settings,
            procs: BTreeMap::new(),
            finished_at: BTreeMap::new(),
            now_ns: 0,
        })
    }

    /// Sets the GPU's per-SM limits for every process, now and later.
    pub fn set_limits(&mut self, limits: Option<SmLimits>) {
        self.settings.limits = limits;
        for p in self.procs.values_mut() {
            p.set_limits(limits);
        }
    }

    /// The pipeline of `pid`, made on first sight. A process that comes back (a shim that
    /// registers again) continues where it was.
    pub fn open(&mut self, pid: u32) -> &mut ProcessPipeline {
        self.finished_at.remove(&pid);
        let settings = &self.settings;
        let p = self.procs.entry(pid).or_insert_with(|| {
            // The settings were validated in `new`.
            ProcessPipeline::new(pid, settings.clone())
                .unwrap_or_else(|_| unreachable_spec(pid, settings))
        });
        p.resume();
        p
    }

    /// Makes room for `pid` among at most `max` pipelines, dropping the processes that
    /// finished first; false when `max` processes are running and `pid` is not one of them.
    pub fn make_room(&mut self, pid: u32, max: usize) -> bool {
        if self.procs.contains_key(&pid) {
            return true;
        }
        while self.procs.len() >= max {
            let Some(oldest) = self
                .finished_at
                .iter()
                .min_by_key(|(_, &at)| at)
                .map(|(&p, _)| p)
            else {
                return false;
            };
            self.finished_at.remove(&oldest);
            self.procs.remove(&oldest);
        }
        true
    }

    /// Pipelines held (running and retained).
    pub fn len(&self) -> usize {
        self.procs.len()
    }

    /// Whether no pipeline is held.
    pub fn is_empty(&self) -> bool {
        self.procs.is_empty()
    }

    /// The pipeline of `pid`, if it exists.
    pub fn get_mut(&mut self, pid: u32) -> Option<&mut ProcessPipeline> {
        self.procs.get_mut(&pid)
    }

    /// Process ids with a pipeline.
    pub fn pids(&self) -> Vec<u32> {
        self.procs.keys().copied().collect()
    }

    /// Hands a host sample to the pipeline of `pid`, if it exists.
    pub fn push_host(&mut self, pid: u32, s: HostSample) {
        if let Some(p) = self.procs.get_mut(&pid) {
            p.push_host(s);
        }
    }

    /// Advances every pipeline to `now_ns`; `connected(pid)` says which processes are still
    /// there.
    pub fn advance(
        &mut self,
        now_ns: u64,
        gpu: Option<&GpuHistory>,
        connected: impl Fn(u32) -> bool,
    ) {
        self.now_ns = self.now_ns.max(now_ns);
        for (&pid, p) in self.procs.iter_mut() {
            let was = p.finished();
            p.advance(now_ns, gpu, connected(pid));
            if p.finished() && !was {
                self.finished_at.insert(pid, now_ns);
                p.release();
            }
        }
    }

    /// Finishes every pipeline (the end of `observe`).
    pub fn finish(&mut self, gpu: Option<&GpuHistory>) {
        for (&pid, p) in self.procs.iter_mut() {
            p.finish(gpu);
            self.finished_at.entry(pid).or_insert(self.now_ns);
        }
    }

    /// Drops the pipelines of processes that finished at least `retention_ns` ago; returns
    /// their pids.
    pub fn retire(&mut self, retention_ns: u64) -> Vec<u32> {
        let now = self.now_ns;
        let gone: Vec<u32> = self
            .finished_at
            .iter()
            .filter(|(_, &at)| now.saturating_sub(at) >= retention_ns)
            .map(|(&pid, _)| pid)
            .collect();
        for pid in &gone {
            self.finished_at.remove(pid);
            self.procs.remove(pid);
        }
        gone
    }

    /// Every process as a snapshot shows it, by pid.
    pub fn snapshot(&mut self) -> Vec<ProcessSnapshot> {
        self.procs
            .values_mut()
            .map(ProcessPipeline::snapshot)
            .collect()
    }
}

#[cold]
fn unreachable_spec(pid: u32, settings: &PipelineSettings) -> ProcessPipeline {
    // `Pipelines::new` validated the spec, so this cannot fail; fall back to the default tree
    // rather than panic in the agent.
    let mut s = settings.clone();
    s.slo = SloSpec::default();
    ProcessPipeline::new(pid, s).unwrap_or_else(|e| panic!("the default SLO spec is valid: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use slo_probe_common::{
        gpu::{STEP_BEGIN, STEP_END},
        GpuKernelRecord, RecordHeader, StepRecord,
    };

    const MS: u64 = 1_000_000;

    fn step(n: u64, ts: u64, phase: u32) -> AnyRecord<'static> {
        AnyRecord::Step(StepRecord {
            header: RecordHeader::of::<StepRecord>(),
            step: n,
            ts_ns: ts,
            tid: 1,
            phase,
        })
    }

    fn kernel(start: u64, dur: u64) -> AnyRecord<'static> {
        AnyRecord::GpuKernel(GpuKernelRecord {
            header: RecordHeader::of::<GpuKernelRecord>(),
            start_ns: start,
            end_ns: start + dur,
            launch_ns: start.saturating_sub(10_000),
            graph_node_id: 0,
            correlation_id: 0,
            device_id: 0,
            context_id: 1,
            stream_id: 7,
            graph_id: 0,
            grid: [1, 1, 1],
            block: [128, 1, 1],
            registers: 32,
            static_smem: 0,
            dynamic_smem: 0,
            name_id: 1,
            op_id: 0,
            launch_tid: 1,
            flags: 0,
        })
    }

    /// `n` steps of `wall` ms from `from` ms, one kernel each.
    fn feed(p: &mut ProcessPipeline, from: u64, n: u64, wall: u64) -> u64 {
        let mut t = from * MS;
        for k in 0..n {
            p.push(&step(k + from, t, STEP_BEGIN));
            p.push(&kernel(t + MS / 10, wall * MS / 2));
            t += wall * MS;
            p.push(&step(k + from, t, STEP_END));
        }
        t
    }

    fn live() -> PipelineSettings {
        PipelineSettings::live(
            SloSpec {
                window_ms: 1000,
                learn_windows: 3,
                warmup_iterations: 0,
                ..SloSpec::default()
            },
            100 * MS,
        )
    }

    #[test]
    fn iterations_wait_for_the_settle_time_and_windows_for_the_lag() {
        let mut p = ProcessPipeline::new(7, live()).expect("spec");
        let end = feed(&mut p, 0, 100, 10); // 1 s of 10 ms steps
        p.advance(end, None, true);
        assert_eq!(p.snapshot().iterations.len(), 0, "not settled yet");
        p.advance(end + SETTLE_NS, None, true);
        let s = p.snapshot();
        assert_eq!(s.iterations.len(), 100);
        assert_eq!(s.iterations_total, 100);
        let stats = s.stats.expect("stats");
        assert_eq!(stats.wall_ns, [10 * MS, 10 * MS]);
        // Windows close a settle time plus a tick behind now: none yet at end + settle.
        assert!(s.slo.as_ref().is_none_or(|t| t.windows == 0));
        p.advance(end + SETTLE_NS + 100 * MS, None, true);
        assert_eq!(p.snapshot().slo.expect("slo").windows, 1);
    }

    #[test]
    fn a_gone_process_is_finished_once_and_retired_later() {
        let mut ps = Pipelines::new(live()).expect("spec");
        let end = feed(ps.open(3), 0, 50, 10);
        ps.advance(end, None, |_| false);
        let s = ps.snapshot();
        assert_eq!(s.len(), 1);
        assert_eq!(
            s[0].iterations.len(),
            50,
            "a finished process completes everything"
        );
        assert!(s[0].slo.is_some());
        assert!(ps.retire(10 * MS).is_empty(), "retained for a while");
        ps.advance(end + 20 * MS, None, |_| false);
        assert_eq!(ps.retire(10 * MS), vec![3]);
        assert!(ps.snapshot().is_empty());
    }

    /// Issue 16, item 4: a process that never completes an iteration costs no SLO engine; a
    /// gone one is freed down to its snapshot and retired; at most `max` are tracked, the ones
    /// that finished first making room.
    #[test]
    fn gone_processes_are_freed_and_the_table_is_capped() {
        let mut ps = Pipelines::new(live()).expect("spec");
        assert!(
            ps.open(1).engine().is_none(),
            "no engine before an iteration"
        );
        let end = feed(ps.open(2), 0, 50, 10);
        ps.advance(end + SETTLE_NS, None, |_| true);
        assert!(ps.get_mut(2).and_then(|p| p.engine()).is_some());
        ps.advance(end + SETTLE_NS + MS, None, |pid| pid != 2);
        let p = ps.get_mut(2).expect("retained");
        assert!(p.engine().is_none(), "released when gone");
        let s = p.snapshot();
        assert_eq!(s.iterations.len(), 50, "the snapshot keeps what it showed");
        assert!(s.slo.is_some());
        // Two tracked, room for two: a third replaces the finished one, a fourth is refused.
        assert!(ps.make_room(3, 2));
        ps.open(3);
        assert_eq!(ps.pids(), vec![1, 3]);
        assert!(!ps.make_room(4, 2));
        assert!(ps.make_room(1, 2), "a tracked process always has room");
    }

    #[test]
    fn a_recording_fits_its_windows_and_keeps_every_iteration() {
        let mut p = ProcessPipeline::new(0, PipelineSettings::recording(None)).expect("spec");
        feed(&mut p, 0, 1500, 10); // 15 s
        p.finish(None);
        let s = p.snapshot();
        assert_eq!(s.iterations.len(), 1500);
        let slo = s.slo.expect("slo");
        assert_eq!(slo.window_ns, 999 * MS, "a fifteenth of the span (14.99 s)");
        assert!(slo.windows >= 14, "{}", slo.windows);
        assert!(slo.violations.is_empty());
    }

    /// Markers that begin after iterations were detected without them (`slo-probe run`'s
    /// automatic markers begin at the first optimizer step): the iterations start over on the
    /// markers' clock, and none detected before stays in the count, the history or the engine.
    #[test]
    fn markers_that_begin_late_restart_the_iterations() {
        let mut p = ProcessPipeline::new(7, live()).expect("spec");
        // 2 s of a repeating kernel sequence and no marker: iterations are detected.
        let mut t = 0;
        for _ in 0..200 {
            for (k, name) in [(0, 1), (2, 2), (4, 3)] {
                let mut r = kernel(t + k * MS, MS);
                if let AnyRecord::GpuKernel(g) = &mut r {
                    g.name_id = name;
                }
                p.push(&r);
            }
            t += 10 * MS;
        }
        p.advance(t + SETTLE_NS, None, true);
        let before = p.snapshot();
        assert!(before.iterations_total > 100, "{}", before.iterations_total);
        assert!(before.stats.as_ref().is_some_and(|s| !s.marked));
        // Then the markers begin.
        let end = feed(&mut p, 3000, 100, 10);
        p.advance(end + SETTLE_NS, None, true);
        let s = p.snapshot();
        assert_eq!(s.iterations_total, 100);
        assert_eq!(s.iterations_before_markers, before.iterations_total);
        assert_eq!(s.iterations.len(), 100);
        assert!(s.iterations.iter().all(|i| i.marked));
        assert!(s.stats.as_ref().is_some_and(|s| s.marked));
        p.advance(end + SETTLE_NS + 2000 * MS, None, true);
        let slo = p
            .snapshot()
            .slo
            .expect("an engine on the markers' iterations");
        assert!(
            slo.windows <= 2,
            "windows of the marked second only: {}",
            slo.windows
        );
    }

    #[test]
    fn markers_can_be_ignored() {
        let mut settings = PipelineSettings::recording(None);
        settings.ignore_markers = true;
        let mut p = ProcessPipeline::new(0, settings).expect("spec");
        feed(&mut p, 0, 30, 10);
        p.finish(None);
        assert_eq!(p.markers_ignored(), 60);
        assert!(p.snapshot().iterations.iter().all(|i| !i.marked));
    }

    /// `n` steps of 10 ms from `from` ms under a CUDA graph: one graph-level record each, or
    /// (`nodes`) its two kernels node by node.
    fn feed_graph(p: &mut ProcessPipeline, from: u64, n: u64, nodes: bool) -> u64 {
        use slo_probe_common::GpuGraphRecord;
        let mut t = from * MS;
        for k in 0..n {
            let s = from + k;
            p.push(&step(s, t, STEP_BEGIN));
            if nodes {
                for node in 0..2u64 {
                    let AnyRecord::GpuKernel(mut r) =
                        kernel(t + MS / 10 + node * 5 * MS, 4 * MS + 8 * MS / 10)
                    else {
                        unreachable!()
                    };
                    r.graph_id = 7;
                    r.graph_node_id = node + 1;
                    r.correlation_id = s as u32 + 1;
                    p.push(&AnyRecord::GpuKernel(r));
                }
            } else {
                p.push(&AnyRecord::GpuGraph(GpuGraphRecord {
                    header: RecordHeader::of::<GpuGraphRecord>(),
                    start_ns: t + MS / 10,
                    end_ns: t + 9 * MS + 9 * MS / 10,
                    launch_ns: t,
                    correlation_id: s as u32 + 1,
                    device_id: 0,
                    context_id: 1,
                    stream_id: 7,
                    graph_id: 7,
                    op_id: 0,
                    launch_tid: 1,
                    flags: 0,
                }));
            }
            t += 10 * MS;
            p.push(&step(s, t, STEP_END));
        }
        t
    }

    #[test]
    fn a_healthy_graph_job_is_sampled_node_by_node_now_and_then() {
        use slo_probe_common::gpu::{DEPTH_NODES, DEPTH_TIMING};
        let mut p = ProcessPipeline::new(7, live()).expect("spec");
        let end = feed_graph(&mut p, 0, 200, false);
        p.advance(end + SETTLE_NS, None, true);
        assert!(p.node_sampling(), "graphs seen: the first sample starts");
        assert_eq!(p.wanted_depth(), DEPTH_NODES);
        // Ten node-level iterations end it; the next is due 10 s later.
        let end = feed_graph(&mut p, 2000 + SETTLE_NS / MS, 10, true);
        p.advance(end + SETTLE_NS, None, true);
        assert!(!p.node_sampling());
        assert_eq!(p.wanted_depth(), DEPTH_TIMING);
        assert_eq!(
            p.snapshot()
                .iterations
                .iter()
                .filter(|i| i.graph_nodes > 0)
                .count(),
            10
        );
        let again = end + SETTLE_NS + NODE_SAMPLE_PERIOD_NS;
        let end = feed_graph(&mut p, again / MS - 200, 10, false);
        p.advance(end + SETTLE_NS, None, true);
        assert!(p.node_sampling(), "due again");
        // A shim that sends no node-level iterations does not hold the request for long.
        let end = feed_graph(&mut p, (end + SETTLE_NS) / MS, 400, false);
        p.advance(end + SETTLE_NS, None, true);
        assert!(!p.node_sampling(), "given up after {NODE_SAMPLE_MAX_NS} ns");
        // An eager job is never sampled.
        let mut e = ProcessPipeline::new(8, live()).expect("spec");
        let end = feed(&mut e, 0, 200, 10);
        e.advance(end + SETTLE_NS, None, true);
        assert!(!e.node_sampling());
    }

    /// A shim that gives no node level under CUDA graphs (`STATUS_NO_GRAPH_NODES`) is not asked
    /// for node-level samples.
    #[test]
    fn no_node_samples_of_a_shim_that_gives_none_under_graphs() {
        use slo_probe_common::{gpu::DEPTH_TIMING, ring::STATUS_NO_GRAPH_NODES};
        let mut p = ProcessPipeline::new(7, live()).expect("spec");
        p.info_mut().status |= STATUS_NO_GRAPH_NODES;
        let end = feed_graph(&mut p, 0, 200, false);
        p.advance(end + SETTLE_NS, None, true);
        assert!(p.graphs_seen() && !p.node_sampling());
        assert_eq!(p.wanted_depth(), DEPTH_TIMING);
        // Once allowed again, the first sample starts.
        p.info_mut().status &= !STATUS_NO_GRAPH_NODES;
        let end = feed_graph(&mut p, (end + SETTLE_NS) / MS, 10, false);
        p.advance(end + SETTLE_NS, None, true);
        assert!(p.node_sampling());
    }
}
