//! Switching CUPTI between depths at run time, and the flusher's control tick: read the agent's
//! and the script's requests, ask the [`Planner`] which depth is wanted, switch CUPTI with
//! `cuptiActivityEnable/Disable` and `cuptiEnableCallback`, stamp a `DepthRecord`, publish the
//! depth word and the self-accounting counters in the ring header.
//!
//! Every switch happens on the flusher thread (or in `slo_probe_cupti_release/reacquire`,
//! which block by contract), never inside a CUDA callback, under the [`Control`] mutex that no
//! CUDA thread takes. CUPTI buffers are flushed before kernel activity is turned off.
//!
//! Needs CUPTI 13 (CUDA 13.0, driver 580+).

use std::{ffi::c_void, sync::atomic::Ordering};

use slo_probe_common::{
    gpu::{
        DEPTH_KERNELS, DEPTH_NODES, DEPTH_OFF, DEPTH_REASON_DEFAULT, DEPTH_REASON_RELEASED,
        DEPTH_TIMING,
    },
    ring::{
        decode_depth_request, encode_shim_depth, ShimDepth, STATUS_DIAGNOSTIC,
        STATUS_DRAINED_SWITCHING, STATUS_KERNELS, STATUS_NO_GRAPH_NODES,
    },
    DepthRecord, Record, RecordHeader,
};

use crate::{
    activity,
    api::Cupti,
    depth::{DomainChooser, Observed, Planner, Reason, DRIVER, RUNTIME},
    error::ShimError,
    now_ns, say, Queued, Shim, CBID_GRAPHNODE_CLONED, CBID_GRAPHNODE_CREATED, DOMAIN_DRIVER,
    DOMAIN_RESOURCE, DOMAIN_RUNTIME,
};

/// Driver kernel launches with grid and block among their parameters: cuLaunchKernel(_ptsz).
pub const DRIVER_LAUNCH_CBIDS: [u32; 2] = [307, 442];
/// Driver kernel launches through a configuration (`CUlaunchConfig *`, their first parameter):
/// cuLaunchKernelEx(_ptsz).
pub const DRIVER_LAUNCH_EX_CBIDS: [u32; 2] = [652, 653];
/// Runtime kernel launches with grid and block among their parameters: cudaLaunchKernel(_ptsz).
pub const RUNTIME_LAUNCH_CBIDS: [u32; 2] = [211, 214];
/// Runtime kernel launches through a configuration (`cudaLaunchConfig_t *`, their first
/// parameter): cudaLaunchKernelExC(_ptsz).
pub const RUNTIME_LAUNCH_EX_CBIDS: [u32; 2] = [430, 431];
/// Driver kernel launches: cuLaunchKernel(_ptsz), cuLaunchKernelEx(_ptsz).
pub const DRIVER_KERNEL_CBIDS: [u32; 4] = both(DRIVER_LAUNCH_CBIDS, DRIVER_LAUNCH_EX_CBIDS);
/// Runtime kernel launches: cudaLaunchKernel(_ptsz), cudaLaunchKernelExC(_ptsz).
pub const RUNTIME_KERNEL_CBIDS: [u32; 4] = both(RUNTIME_LAUNCH_CBIDS, RUNTIME_LAUNCH_EX_CBIDS);

const fn both(a: [u32; 2], b: [u32; 2]) -> [u32; 4] {
    [a[0], a[1], b[0], b[1]]
}
/// Graph launches, always traced (one callback per replay): cuGraphLaunch(_ptsz).
pub const DRIVER_GRAPH_CBIDS: [u32; 2] = [514, 515];
/// Graph launches: cudaGraphLaunch(_ptsz).
pub const RUNTIME_GRAPH_CBIDS: [u32; 2] = [311, 312];

/// Runtime copies and fills, traced whenever memcpy/memset activity is on (a few calls a step)
/// so that their activity records carry the thread's operator (`data_to_device: memcpy HtoD`):
/// cudaMemcpy, cudaMemcpy2D, cudaMemcpyAsync, cudaMemcpy2DAsync, cudaMemset, cudaMemsetAsync,
/// cudaMemcpyPeerAsync, and their per-thread-stream variants. Driver-level copies (no runtime
/// call above them) keep the bare `memcpy HtoD` name.
pub const RUNTIME_COPY_CBIDS: [u32; 13] =
    [31, 32, 41, 44, 49, 51, 161, 215, 216, 225, 228, 233, 235];

/// Synchronising driver calls, whose exit finds the stream (or the context) drained:
/// cuCtxSynchronize, cuStreamSynchronize(_ptsz). The runtime's cudaDeviceSynchronize and
/// cudaStreamSynchronize, and PyTorch's `.item()`, go through them.
pub const DRIVER_SYNC_CBIDS: [u32; 3] = [17, 126, 440];

/// How long the flusher waits for a drained moment before it switches kernel activity anyway.
const DRAIN_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// How long a thread at a drained moment waits for the switch (it launches nothing meanwhile:
/// the GPU stays drained), at most.
const PARKED_WAIT: std::time::Duration = std::time::Duration::from_millis(20);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum DrainState {
    Idle,
    /// A thread sits at the exit of a synchronising call, waiting for the switch.
    Parked,
    /// The switch is done: the parked thread may go.
    Done,
}

/// Switching kernel activity only while the GPU has no work queued. CUDA 13.0's CUPTI strands
/// the kernel records of work in flight when `CONCURRENT_KERNEL` is switched under a deep queue
/// (bench/results/faults-h200.md, seventh session), which is why the planner used to hold
/// kernel tracing on for GPU-bound jobs.
///
/// By default (unset or `SLO_PROBE_TOGGLE_AT_SYNC=auto`) inline, and only once the planner has
/// seen a deep queue ([`crate::depth::Planner::drains`]), memory activity switched with it from
/// then on: on an H100 (2026-12-06, second session, `bench/results/faults-2026-12-06-h100-b`)
/// the suite's two GPU-bound eager jobs with their faults delivered every record live with no
/// repeated correlation id and their faults named 7 of 7, where the hold it replaces costs the
/// GPU-bound GPT about 1%. `0` keeps the hold; `inline` switches so always and `1` parks
/// (experiments).
///
/// Inline, nothing parks: the thread leaving the synchronising call switches kernel activity
/// (and the kinds switched with it) itself, in the call's exit callback, and goes on; the
/// flusher flushes afterwards. Without a drained moment nothing is switched. On the eager GPT
/// (H100, 2026-12-06, call 11) CUPTI took the calls in the callback and no correlation id
/// repeated (`bench/results/faults-2026-12-06-h100`).
///
/// The park: the flusher asks for a drained moment, and the next thread to leave a
/// synchronising call parks there (at most [`PARKED_WAIT`]) while the flusher switches, then
/// goes on. It kept the same GPT's correlation ids right (call 9) but cost blocks with a window
/// +11.7%: the inline switch keeps the job's thread for the CUPTI calls alone.
pub(crate) struct Drain {
    pub(crate) enabled: bool,
    /// Switch in the synchronising call's exit callback instead of parking there.
    pub(crate) inline: bool,
    /// Only once the planner saw a deep queue ([`crate::depth::Planner::drains`]; the
    /// default); before, and without one, kernel activity is switched where the plan says.
    pub(crate) deep_only: bool,
    wanted: std::sync::atomic::AtomicBool,
    state: std::sync::Mutex<DrainState>,
    cv: std::sync::Condvar,
    /// The inline switch asked for and its outcome (`INLINE_*`).
    inline_state: std::sync::atomic::AtomicU8,
    /// The error of an inline switch that failed.
    inline_error: std::sync::Mutex<Option<ShimError>>,
    /// Whether the last inline switch found a drained moment.
    pub(crate) inline_drained: std::sync::atomic::AtomicBool,
    /// Threads of the job waiting for the control lock ([`Shim::lock_control`]).
    pub(crate) lockers: std::sync::atomic::AtomicU32,
    /// Time the flusher spent waiting for drained moments, found or not, ns (left out of
    /// `toggle_ns`).
    pub(crate) inline_wait_ns: std::sync::atomic::AtomicU64,
}

/// No inline switch wanted.
const INLINE_IDLE: u8 = 0;
/// Kernel activity wanted on (off) at the next drained moment.
const INLINE_WANT_ON: u8 = 1;
const INLINE_WANT_OFF: u8 = 2;
/// A thread at a drained moment is switching.
const INLINE_TAKEN: u8 = 3;
/// Switched at a drained moment (with or without an error from CUPTI).
const INLINE_DONE: u8 = 4;
const INLINE_FAILED: u8 = 5;

impl Drain {
    /// From `SLO_PROBE_TOGGLE_AT_SYNC`: unset or `auto` (the default) inline once the queue is
    /// deep; `inline` inline always; `1` or `true` park always; anything else (`0`) off, which
    /// keeps the hold under a deep queue.
    pub(crate) fn from_env(v: Option<&str>) -> Self {
        match v {
            None | Some("auto") => Self {
                inline: true,
                deep_only: true,
                ..Self::new(true)
            },
            Some("inline") => Self {
                inline: true,
                ..Self::new(true)
            },
            Some(v) if crate::flag_on(v) => Self::new(true),
            _ => Self::new(false),
        }
    }

    /// Whether kernel activity is switched at drained moments now.
    pub(crate) fn active(&self, deep: bool) -> bool {
        self.enabled && (deep || !self.deep_only)
    }

    pub(crate) fn new(enabled: bool) -> Self {
        Self {
            enabled,
            inline: false,
            deep_only: false,
            wanted: std::sync::atomic::AtomicBool::new(false),
            state: std::sync::Mutex::new(DrainState::Idle),
            cv: std::sync::Condvar::new(),
            inline_state: std::sync::atomic::AtomicU8::new(INLINE_IDLE),
            inline_error: std::sync::Mutex::new(None),
            inline_drained: std::sync::atomic::AtomicBool::new(false),
            inline_wait_ns: std::sync::atomic::AtomicU64::new(0),
            lockers: std::sync::atomic::AtomicU32::new(0),
        }
    }

    /// Has the next thread to leave a synchronising call switch kernel activity on or off
    /// ([`Drain::take_inline`]). Returns its result; without a drained moment in
    /// [`DRAIN_WAIT`], nothing is switched ([`ShimError::NotDrained`]: the flusher tries
    /// again at its next tick), because switching under the queue is what corrupts the
    /// correlation ids (H100, 2026-12-06, call 10: 28% of the kernel records). The caller waits
    /// (the flusher), never the job.
    fn inline_switch(&self, on: bool) -> Result<(), ShimError> {
        let t0 = now_ns();
        let waited = self.inline_wait(on);
        // The wait is not the switch's cost, drained moment or not (the job's thread paid for
        // the CUPTI calls, in its callback time). Counted in, a window whose switches waited
        // 3 s for a drained moment set the period to minutes (H100, 2026-12-06, call 11: 3
        // windows in 139 s of the suite's eager GPT).
        self.inline_wait_ns
            .fetch_add(now_ns().saturating_sub(t0), Ordering::Relaxed);
        self.inline_drained
            .store(waited.is_some(), Ordering::Relaxed);
        waited.unwrap_or(Err(ShimError::NotDrained))
    }

    /// Waits for a thread at a drained moment to switch: its result, or `None` after
    /// [`DRAIN_WAIT`], at the process's exit, or when a thread of the job waits for the depth
    /// lock (the switch is then no longer wanted, and nothing is switched).
    fn inline_wait(&self, on: bool) -> Option<Result<(), ShimError>> {
        let want = if on { INLINE_WANT_ON } else { INLINE_WANT_OFF };
        self.inline_state.store(want, Ordering::Release);
        let deadline = std::time::Instant::now() + DRAIN_WAIT;
        loop {
            match self.inline_state.load(Ordering::Acquire) {
                INLINE_DONE => {
                    self.inline_state.store(INLINE_IDLE, Ordering::Release);
                    return Some(Ok(()));
                }
                INLINE_FAILED => {
                    let e = self.inline_error.lock().ok().and_then(|mut g| g.take());
                    self.inline_state.store(INLINE_IDLE, Ordering::Release);
                    return Some(Err(e.unwrap_or(ShimError::Unavailable)));
                }
                // No drained moment in time, or a thread of the job waits for the lock the
                // flusher holds meanwhile (the process exiting, a release).
                w if w == want
                    && (std::time::Instant::now() >= deadline
                        || crate::EXITING.load(Ordering::Acquire)
                        || self.lockers.load(Ordering::Acquire) > 0)
                    && self
                        .inline_state
                        .compare_exchange(want, INLINE_IDLE, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok() =>
                {
                    return None;
                }
                _ => std::thread::park_timeout(std::time::Duration::from_millis(1)),
            }
        }
    }

    /// At a drained moment: runs the inline switch wanted, if any and no other thread took it.
    /// Returns whether it ran.
    fn take_inline(&self, toggle: impl FnOnce(bool) -> Result<(), ShimError>) -> bool {
        let want = self.inline_state.load(Ordering::Acquire);
        if (want != INLINE_WANT_ON && want != INLINE_WANT_OFF)
            || self
                .inline_state
                .compare_exchange(want, INLINE_TAKEN, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
        {
            return false;
        }
        let state = match toggle(want == INLINE_WANT_ON) {
            Ok(()) => INLINE_DONE,
            Err(e) => {
                // Never waits: the flusher takes the error only after the state says failed.
                if let Ok(mut g) = self.inline_error.try_lock() {
                    *g = Some(e);
                }
                INLINE_FAILED
            }
        };
        self.inline_state.store(state, Ordering::Release);
        crate::wake_flusher();
        true
    }

    /// Runs `switch` at a drained moment, or after [`DRAIN_WAIT`] without one. Returns whether
    /// the moment came.
    fn at_drained<T>(&self, switch: impl FnOnce() -> T) -> (T, bool) {
        let Ok(mut st) = self.state.lock() else {
            return (switch(), false);
        };
        *st = DrainState::Idle;
        self.wanted.store(true, Ordering::Release);
        let (g, _) = match self.cv.wait_timeout_while(st, DRAIN_WAIT, |s| {
            *s != DrainState::Parked && self.lockers.load(Ordering::Acquire) == 0
        }) {
            Ok(x) => x,
            Err(_) => return (switch(), false),
        };
        st = g;
        self.wanted.store(false, Ordering::Release);
        let drained = *st == DrainState::Parked;
        let r = switch();
        if drained {
            *st = DrainState::Done;
            self.cv.notify_all();
        }
        (r, drained)
    }
}

/// The exit of a synchronising call: parks the thread while the flusher switches kernel
/// activity, when it waits for a drained moment.
pub(crate) fn sync_callback(s: &Shim, data: *const c_void) {
    use cudarc::cupti::sys::CUpti_CallbackData as Cb;
    let d = &s.drain;
    if !d.waiting() {
        return;
    }
    // SAFETY: for API domains CUPTI passes a CUpti_CallbackData.
    let site = unsafe {
        std::ptr::read_unaligned(
            data.cast::<u8>()
                .add(std::mem::offset_of!(Cb, callbackSite))
                .cast::<u32>(),
        )
    };
    if site == 0 {
        return; // the entry site
    }
    let Some(api) = s.api.as_ref() else { return };
    let with_kernels = s.kinds_with_kernels();
    let t0 = now_ns();
    // SAFETY: CUPTI activity calls from an API callback's exit (the experiment measures
    // whether CUPTI takes them there).
    if d.at_sync_exit(|on| unsafe { kernel_activity(api, on, with_kernels) }) {
        s.hot
            .callback_ns
            .fetch_add(now_ns().saturating_sub(t0), Ordering::Relaxed);
    }
}

impl Drain {
    /// Whether the flusher waits for a drained moment (to park a thread at, or to switch at).
    fn waiting(&self) -> bool {
        if self.inline {
            matches!(
                self.inline_state.load(Ordering::Acquire),
                INLINE_WANT_ON | INLINE_WANT_OFF
            )
        } else {
            self.wanted.load(Ordering::Acquire)
        }
    }

    /// At the exit of a synchronising call (a drained moment): the inline switch wanted, run
    /// here with `toggle` (returns true), or the park.
    fn at_sync_exit(&self, toggle: impl FnOnce(bool) -> Result<(), ShimError>) -> bool {
        if self.inline {
            self.take_inline(toggle)
        } else {
            self.park();
            false
        }
    }
}

impl Drain {
    /// At a drained moment: parks this thread while the waiting flusher switches, if it
    /// waits and no other thread parked first.
    fn park(&self) {
        if !self.wanted.swap(false, Ordering::AcqRel) {
            return;
        }
        let Ok(mut st) = self.state.lock() else {
            return;
        };
        *st = DrainState::Parked;
        self.cv.notify_all();
        if let Ok((mut g, _)) = self
            .cv
            .wait_timeout_while(st, PARKED_WAIT, |s| *s == DrainState::Parked)
        {
            *g = DrainState::Idle;
        }
    }
}

/// Whether CUPTI traces kernels at `depth` (kernels or nodes; not off, not timing).
pub(crate) fn traces_kernels(depth: u32) -> bool {
    depth != DEPTH_OFF && depth >= DEPTH_KERNELS
}

/// Whether a runtime callback id is a copy or fill (`RUNTIME_COPY_CBIDS`).
pub fn is_copy(domain: u32, cbid: u32) -> bool {
    domain == DOMAIN_RUNTIME && RUNTIME_COPY_CBIDS.contains(&cbid)
}

/// Whether a launch callback id is a graph launch.
pub fn is_graph_launch(domain: u32, cbid: u32) -> bool {
    match domain {
        DOMAIN_DRIVER => DRIVER_GRAPH_CBIDS.contains(&cbid),
        DOMAIN_RUNTIME => RUNTIME_GRAPH_CBIDS.contains(&cbid),
        _ => false,
    }
}

/// What CUPTI is set to now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Applied {
    /// `DEPTH_*` (`DEPTH_OFF` while not tracing).
    pub depth: u32,
    /// `DEPTH_REASON_*` of the last depth record.
    pub reason: u32,
    /// Kernel-launch callback domains enabled (`depth::DRIVER | RUNTIME` bits).
    pub domains: u32,
}

/// The depth state, behind a mutex taken by the flusher and by release/reacquire only.
pub struct Control {
    /// Which depth is wanted.
    pub planner: Planner,
    /// Which launch domains.
    pub domains: DomainChooser,
    /// What CUPTI is set to.
    pub applied: Applied,
    agent_generation: u32,
    script_generation: u32,
    /// CUPTI refused to make depth 0 quiet once: it stays loud (no retry at every tick).
    quiet_refused: bool,
}

impl Control {
    /// Nothing applied yet (not tracing).
    pub fn new(planner: Planner) -> Self {
        let domains = DomainChooser::new(planner.config().domains);
        Self {
            planner,
            domains,
            applied: Applied {
                depth: DEPTH_OFF,
                reason: DEPTH_REASON_DEFAULT,
                domains: 0,
            },
            agent_generation: 0,
            script_generation: 0,
            quiet_refused: false,
        }
    }
}

/// Kernel activity on (then the kinds `with_kernels`), or off (the kinds first).
///
/// # Safety
/// Not from a buffer callback; the flusher, a blocking entry point, or an API callback's exit
/// at a drained moment ([`Drain::inline`]).
unsafe fn kernel_activity(api: &Cupti, on: bool, with_kernels: &[u32]) -> Result<(), ShimError> {
    let kernel = activity::KIND_CONCURRENT_KERNEL;
    if crate::logging() {
        let mut kinds = vec![kernel];
        kinds.extend_from_slice(with_kernels);
        crate::log_activity(if on { "on" } else { "off" }, &kinds);
    }
    // SAFETY: per the caller.
    unsafe {
        if on {
            let r = (api.cuptiActivityEnable)(kernel);
            api.check(r, || "cuptiActivityEnable(CONCURRENT_KERNEL)".into())?;
            for &k in with_kernels {
                let r = (api.cuptiActivityEnable)(k);
                api.check(r, || format!("cuptiActivityEnable({k})"))?;
            }
        } else {
            for &k in with_kernels {
                let r = (api.cuptiActivityDisable)(k);
                api.check(r, || format!("cuptiActivityDisable({k})"))?;
            }
            let r = (api.cuptiActivityDisable)(kernel);
            api.check(r, || "cuptiActivityDisable(CONCURRENT_KERNEL)".into())?;
        }
    }
    Ok(())
}

/// `cuptiEnableCallback` for every kernel-launch id of the domains in `mask`.
///
/// # Safety
/// `sub` must be the shim's live subscriber.
unsafe fn kernel_callbacks(api: &Cupti, sub: *mut c_void, mask: u32, on: bool) {
    for (bit, domain, ids) in [
        (DRIVER, DOMAIN_DRIVER, &DRIVER_KERNEL_CBIDS),
        (RUNTIME, DOMAIN_RUNTIME, &RUNTIME_KERNEL_CBIDS),
    ] {
        if mask & bit != 0 {
            for &cbid in ids {
                // SAFETY: per the caller.
                unsafe { (api.cuptiEnableCallback)(u32::from(on), sub, domain, cbid) };
            }
        }
    }
}

/// The callbacks on at every depth: graph launches (one a replay) and the graph-node resource
/// callbacks; the synchronising calls where kernel activity may be switched at drained moments
/// (`sync`); the runtime's copies and fills where memory activity is traced (`copies`).
///
/// # Safety
/// `sub` must be the shim's live subscriber.
pub(crate) unsafe fn base_callbacks(api: &Cupti, sub: *mut c_void, sync: bool, copies: bool) {
    let sync_ids: &[u32] = if sync { &DRIVER_SYNC_CBIDS } else { &[] };
    let copy_ids: &[u32] = if copies { &RUNTIME_COPY_CBIDS } else { &[] };
    for (domain, ids) in [
        (DOMAIN_DRIVER, &DRIVER_GRAPH_CBIDS[..]),
        (DOMAIN_RUNTIME, &RUNTIME_GRAPH_CBIDS[..]),
        (
            DOMAIN_RESOURCE,
            &[CBID_GRAPHNODE_CREATED, CBID_GRAPHNODE_CLONED][..],
        ),
        (DOMAIN_DRIVER, sync_ids),
        (DOMAIN_RUNTIME, copy_ids),
    ] {
        for &cbid in ids {
            // SAFETY: per the caller.
            unsafe { (api.cuptiEnableCallback)(1, sub, domain, cbid) };
        }
    }
}

/// Depth 0 made quiet (`on`), or loud again: between sample windows of a job whose step
/// markers time its iterations, the shim needs nothing from CUPTI, yet a subscriber with
/// callbacks and an activity kind enabled is what the job pays for at depth 0 (launch-bound
/// eager on a noisy H100 host, 2026-12-06: +1.9% to +2.7% against CUPTI released, with 0.01%
/// in the shim's own callbacks, not explained). Quiet: a flush, `GRAPH_TRACE` off, every
/// callback off (the subscription stays, so that nothing has to subscribe again beside the
/// job's threads). Loud again: the callbacks of [`base_callbacks`], then `GRAPH_TRACE`. Called
/// only at depth 0 (no kernel activity, no launch callbacks). On a quiet H100 host
/// (`bench/results/overhead-2026-12-06c`) it took the shim's callback time in the launch-bound
/// job's depth-0 blocks from 17–60 µs a block to 0, with 0 correlation misses or repeats in
/// the windows, and read +0.05%, +0.21%, +0.15% against +0.42%, −0.04%, −0.42% without it
/// (the same within the noise there).
///
/// # Safety
/// `sub` must be the shim's live subscriber; not called from a CUPTI callback.
unsafe fn quiet_cupti(
    api: &Cupti,
    sub: *mut c_void,
    on: bool,
    sync: bool,
    copies: bool,
) -> Result<(), ShimError> {
    // SAFETY: per the caller.
    unsafe {
        if on {
            (api.cuptiActivityFlushAll)(0);
            let r = (api.cuptiActivityDisable)(activity::KIND_GRAPH_TRACE);
            api.check(r, || "cuptiActivityDisable(GRAPH_TRACE)".into())?;
            for d in [DOMAIN_DRIVER, DOMAIN_RUNTIME, DOMAIN_RESOURCE] {
                (api.cuptiEnableDomain)(0, sub, d);
            }
        } else {
            base_callbacks(api, sub, sync, copies);
            let r = (api.cuptiActivityEnable)(activity::KIND_GRAPH_TRACE);
            api.check(r, || "cuptiActivityEnable(GRAPH_TRACE)".into())?;
        }
    }
    Ok(())
}

/// [`Shim::quiet`]: depth 0 is loud; quiet, with records maybe still in CUPTI's buffers (the
/// next flush returns them); quiet and flushed since (the flusher skips its flushes).
pub(crate) const QUIET_NO: u8 = 0;
pub(crate) const QUIET_UNFLUSHED: u8 = 1;
pub(crate) const QUIET_FLUSHED: u8 = 2;

/// The CUPTI calls that move `a` to `depth` with kernel-launch callbacks in `domains`: launch
/// callbacks before kernel activity goes on (every traced kernel has its launch stamped), a
/// flush before anything goes off, `GRAPH_TRACE` off exactly at depth 2; the activity kinds
/// `with_kernels` go on right after kernel activity and off right before it.
///
/// # Safety
/// `sub` must be the shim's live subscriber, or null (activity-only: no callbacks); not called
/// from a CUPTI callback.
unsafe fn switch_cupti(
    api: &Cupti,
    sub: *mut c_void,
    a: &mut Applied,
    depth: u32,
    domains: u32,
    with_kernels: &[u32],
    inline: Option<&Drain>,
) -> Result<(), ShimError> {
    // Kernel activity and the kinds switched with it: here, or at a drained moment by the
    // thread that found it (`inline`; its disable is flushed after as well).
    let toggle = |on: bool| match inline {
        // SAFETY: per the caller.
        None => unsafe { kernel_activity(api, on, with_kernels) },
        Some(d) => d.inline_switch(on),
    };
    let want_kernels = depth >= DEPTH_KERNELS;
    let want_domains = if want_kernels && !sub.is_null() {
        domains
    } else {
        0
    };
    // SAFETY: CUPTI calls from the flusher (or a blocking entry point), never from a
    // callback; `sub` is the shim's subscriber when not null.
    unsafe {
        // Launch callbacks first, so that every kernel traced has its launch stamped.
        if want_domains & !a.domains != 0 {
            kernel_callbacks(api, sub, want_domains & !a.domains, true);
            a.domains |= want_domains;
        }
        if want_kernels && a.depth == DEPTH_TIMING {
            toggle(true)?;
            a.depth = DEPTH_KERNELS;
        }
        if depth == DEPTH_NODES && a.depth == DEPTH_KERNELS {
            // Graph-level and node-level records exclude each other.
            (api.cuptiActivityFlushAll)(0);
            let r = (api.cuptiActivityDisable)(activity::KIND_GRAPH_TRACE);
            api.check(r, || "cuptiActivityDisable(GRAPH_TRACE)".into())?;
            a.depth = DEPTH_NODES;
        }
        if depth < DEPTH_NODES && a.depth == DEPTH_NODES {
            (api.cuptiActivityFlushAll)(0);
            let r = (api.cuptiActivityEnable)(activity::KIND_GRAPH_TRACE);
            api.check(r, || "cuptiActivityEnable(GRAPH_TRACE)".into())?;
            a.depth = DEPTH_KERNELS;
        }
        if !want_kernels && a.depth == DEPTH_KERNELS {
            // Flush first: what was traced reaches the ring before the kind goes off (at a
            // drained moment, after too: the GPU has run all of it then; before as well, in
            // case no drained moment comes and the flusher switches under the queue).
            (api.cuptiActivityFlushAll)(0);
            toggle(false)?;
            if inline.is_some() {
                (api.cuptiActivityFlushAll)(0);
            }
            a.depth = DEPTH_TIMING;
        }
        if a.domains & !want_domains != 0 && !sub.is_null() {
            kernel_callbacks(api, sub, a.domains & !want_domains, false);
        }
        a.domains = want_domains;
    }
    Ok(())
}

impl Shim {
    /// The depth state, for a thread of the job (a blocking entry point: release, reacquire, the
    /// exit): with a drain mode on, a flusher waiting under the lock for a drained moment gives up at once
    /// ([`Drain::inline_wait`]), since the thread it waits for may be this one (the fake-CUPTI
    /// test's release waited the whole 3 s).
    pub(crate) fn lock_control(&self) -> std::sync::LockResult<std::sync::MutexGuard<'_, Control>> {
        if !self.drain.enabled {
            return self.control.lock();
        }
        self.drain.lockers.fetch_add(1, Ordering::AcqRel);
        // A flusher waiting for a thread to park wakes and gives up (the state's lock, taken
        // for a moment, orders this after its look at `lockers` or before its wait).
        drop(self.drain.state.lock());
        self.drain.cv.notify_all();
        let g = self.control.lock();
        self.drain.lockers.fetch_sub(1, Ordering::AcqRel);
        g
    }

    /// What the planner needs, read from the shim's counters.
    pub(crate) fn observe(&self) -> Observed {
        let h = &self.hot;
        let r = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        Observed {
            now_ns: now_ns(),
            steps: r(&self.steps_ended),
            last_step_ns: r(&self.last_step_ns),
            callback_ns: r(&h.callback_ns),
            kernel_launches: r(&h.kernels_driver) + r(&h.kernels_runtime),
            kernel_records: r(&self.counters.kernel_records),
            graph_records: r(&self.counters.graph_records),
            graph_launches: r(&h.graphs_driver) + r(&h.graphs_runtime),
            toggle_ns: r(&self.counters.toggle_ns),
            gpu_lag_ns: r(&self.counters.gpu_lag_ns),
        }
    }

    /// Switches CUPTI from `c.applied` to `depth` with kernel-launch callbacks in `domains`.
    /// On an error `c.applied` says how far it got. The time it takes is counted in
    /// `toggle_ns`.
    pub(crate) fn switch(
        &self,
        api: &Cupti,
        c: &mut Control,
        depth: u32,
        domains: u32,
        inline: Option<&Drain>,
    ) -> Result<(), ShimError> {
        let t0 = now_ns();
        let waited0 = self.drain.inline_wait_ns.load(Ordering::Relaxed);
        let sub = self.subscriber.load(Ordering::Acquire);
        let had_kernels = traces_kernels(c.applied.depth);
        let with_kernels = self.kinds_with_kernels();
        // SAFETY: `sub` is the shim's subscriber (or null in activity-only mode).
        let r = unsafe {
            switch_cupti(
                api,
                sub,
                &mut c.applied,
                depth,
                domains,
                with_kernels,
                inline,
            )
        };
        if r.is_ok()
            && had_kernels
            && c.applied.depth == DEPTH_TIMING
            && self.buffers_cfg.forced_flush
        {
            // Opt-in (`SLO_PROBE_FORCED_FLUSH=1`; it corrupts later records' correlation ids
            // on CUDA 13, see `BUFFER_BYTES`). The sampled window has ended and drained (the
            // planner waits out the GPU's lag before switching): its kernel records are
            // complete but sit in a buffer with records of work still queued, which a default
            // flush never returns. Forced: records still queued come back without timestamps
            // and are counted and dropped (`incomplete_records`).
            // SAFETY: from the flusher (or a blocking entry point), never from a callback.
            unsafe { (api.cuptiActivityFlushAll)(crate::FLUSH_FORCED) };
            self.counters.forced_flushes.fetch_add(1, Ordering::Relaxed);
        }
        let waited = self
            .drain
            .inline_wait_ns
            .load(Ordering::Relaxed)
            .saturating_sub(waited0);
        self.counters.toggle_ns.fetch_add(
            now_ns().saturating_sub(t0).saturating_sub(waited),
            Ordering::Relaxed,
        );
        r
    }

    /// Stamps a depth change: a `DepthRecord` into the ring, the status bits, the depth the
    /// step markers read, the counters.
    pub(crate) fn record_depth(&self, from_ns: u64, depth: u32, reason: u32) {
        self.depth_now.store(depth, Ordering::Relaxed);
        let kernels = traces_kernels(depth);
        self.set_status(STATUS_KERNELS, kernels);
        self.set_status(STATUS_DIAGNOSTIC, depth == DEPTH_NODES);
        self.counters.depth_changes.fetch_add(1, Ordering::Relaxed);
        let r = DepthRecord {
            header: RecordHeader::of::<DepthRecord>(),
            from_ns,
            depth,
            reason,
        };
        // Never waits for the writer: `InitializeInjection` stamps the first depth on the
        // driver's thread; when the writer is busy the record goes through the queue.
        match self.writer.try_lock() {
            Ok(w) => w.push(r.as_bytes()),
            Err(_) => self.push_queued(Queued::Depth(r)),
        }
        if self.log {
            say!("depth {depth} (reason {reason})");
        }
    }

    /// Publishes the depth word, the duty cycle and the counters in the ring header.
    pub(crate) fn publish(&self, c: &Control) {
        let d = ShimDepth {
            depth: c.applied.depth,
            reason: c.applied.reason,
            ..c.planner.published()
        };
        let word = encode_shim_depth(d);
        self.depth_word.store(word, Ordering::Relaxed);
        self.counters
            .launch_domains
            .store(u64::from(c.applied.domains), Ordering::Relaxed);
        self.counters
            .sample_windows
            .store(c.planner.windows(), Ordering::Relaxed);
        self.counters
            .record_cost_ns
            .store(c.planner.config().record_cost_ns, Ordering::Relaxed);
        if let Some(t) = &self.transport {
            t.header.depth.store(word, Ordering::Relaxed);
        }
        self.publish_counters();
    }

    /// Publishes the self-accounting counters in the ring header (no lock).
    pub(crate) fn publish_counters(&self) {
        let Some(t) = &self.transport else { return };
        let h = t.header;
        let r = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        let hot = &self.hot;
        h.callback_ns.store(r(&hot.callback_ns), Ordering::Relaxed);
        h.launches_seen.store(
            r(&hot.kernels_driver)
                + r(&hot.kernels_runtime)
                + r(&hot.graphs_driver)
                + r(&hot.graphs_runtime),
            Ordering::Relaxed,
        );
        h.kernel_records
            .store(r(&self.counters.kernel_records), Ordering::Relaxed);
        h.sampled_steps
            .store(r(&self.sampled_steps), Ordering::Relaxed);
        h.steps_seen.store(r(&self.steps_ended), Ordering::Relaxed);
        h.depth_changes
            .store(r(&self.counters.depth_changes), Ordering::Relaxed);
        h.toggle_ns
            .store(r(&self.counters.toggle_ns), Ordering::Relaxed);
        h.record_cost_ns
            .store(r(&self.counters.record_cost_ns), Ordering::Relaxed);
        h.launch_domains
            .store(r(&self.counters.launch_domains) as u32, Ordering::Relaxed);
    }

    /// Moves CUPTI to what `c.planner` wants now and stamps the change. Returns the plan's
    /// wake time.
    pub(crate) fn apply_plan(&self, api: &Cupti, c: &mut Control, o: &Observed) -> Option<u64> {
        let was_held = c.planner.held();
        let was_pinned = c.planner.pinned();
        let was_draining = c.planner.drains();
        let was_refused = c.planner.nodes_refused();
        let plan = c.planner.plan(o);
        // Said before the agent asks (see `Config::graph_nodes`).
        self.set_status(STATUS_NO_GRAPH_NODES, c.planner.no_graph_nodes(o));
        if c.planner.nodes_refused() && !was_refused {
            say!(
                "node-level tracing asked for, kernel level given: the process launches CUDA \
                 graphs, and leaving a node-level sample under them crashed a job in CUDA \
                 graph replay (SLO_PROBE_GRAPH_NODES=1 allows it; SLO_PROBE_DEPTH=2 traces \
                 nodes from the start without switching)"
            );
        }
        let lag_ms = o.gpu_lag_ns as f64 / 1e6;
        let began_draining = c.planner.drains() && !was_draining;
        // Before any switch: memory activity goes with kernel activity from here on
        // (`Shim::kinds_with_kernels`); said below where drained switching begins.
        let latched =
            c.planner.mem_with_kernels() && !self.mem_follows.swap(true, Ordering::AcqRel);
        if latched && !began_draining && self.log && self.mem_activity == crate::MemActivity::On {
            say!(
                "memory activity switched with kernel activity from now on: the GPU runs \
                 {lag_ms:.1} ms behind its launches"
            );
        }
        if began_draining {
            self.set_status(STATUS_DRAINED_SWITCHING, true);
            say!(
                "the GPU runs {lag_ms:.1} ms behind its launches: kernel{} activity is switched \
                 only at the exit of synchronising calls from now on, where the queue has \
                 drained (SLO_PROBE_TOGGLE_AT_SYNC=0 holds kernel tracing on instead)",
                if self.mem_activity == crate::MemActivity::On {
                    " and memory"
                } else {
                    ""
                }
            );
        }
        let change = if began_draining {
            None
        } else if c.planner.pinned() != was_pinned {
            Some(if was_pinned {
                format!(
                    "kernel tracing duty-cycled again under CUDA graphs: kept on, it costs more \
                     than {:.0}% of the time (SLO_PROBE_HOLD_MAX_PCT)",
                    c.planner.config().hold_max_share * 100.0
                )
            } else {
                "kernel tracing kept on: the process launches CUDA graphs, under which switching \
                 kernel activity loses records (SLO_PROBE_GRAPH_FLOOR=0 turns this off)"
                    .to_owned()
            })
        } else if c.planner.held() != was_held {
            Some(if was_held {
                format!("kernel tracing duty-cycled again: the GPU runs {lag_ms:.1} ms behind its launches")
            } else {
                format!(
                    "kernel tracing held on: the GPU runs {lag_ms:.1} ms behind its launches, and \
                     switching kernel activity off under a deep queue loses records"
                )
            })
        } else {
            None
        };
        if let Some(change) = change {
            let n = self.counters.holds.fetch_add(1, Ordering::Relaxed);
            if self.log || n < 4 {
                say!("{change}");
            }
        }
        let from = c.applied;
        let mut domains = from.domains;
        if plan.depth >= DEPTH_KERNELS && from.depth == DEPTH_TIMING {
            let hits = (
                self.counters.corr_hits_driver.load(Ordering::Relaxed),
                self.counters.corr_hits_runtime.load(Ordering::Relaxed),
            );
            domains = c.domains.at_raise(hits);
        }
        // Quiet at depth 0 where the planner allows it (`quiet_cupti`); loud again before a
        // raise, and as soon as it no longer does (a graph seen in a window, markers gone).
        let sub = self.subscriber.load(Ordering::Acquire);
        let quiet = self.quiet.load(Ordering::Relaxed) != QUIET_NO;
        let quiet_ok = !c.quiet_refused
            && !sub.is_null()
            && (self.mem_activity == crate::MemActivity::Off
                || !self.kinds_with_kernels().is_empty())
            && c.planner.may_quiet(o);
        if quiet && (plan.depth > DEPTH_TIMING || !quiet_ok) {
            self.set_quiet(api, c, sub, false);
        }
        let mut before = now_ns();
        if plan.depth != from.depth || domains != from.domains {
            // Only the flusher waits for a drained moment: a blocking entry point (tracing
            // starting at cuInit, or again after a release) runs on a thread of the job, which
            // would wait the whole time for a synchronising call it cannot make meanwhile (3 s
            // in the fake-CUPTI test of the inline switch).
            let on_flusher = crate::FLUSHER
                .get()
                .is_some_and(|t| t.id() == std::thread::current().id());
            let r = if self.drain.active(c.planner.drains())
                && on_flusher
                && traces_kernels(plan.depth) != traces_kernels(from.depth)
            {
                let (r, drained) = if self.drain.inline {
                    let r = self.switch(api, c, plan.depth, domains, Some(&self.drain));
                    (r, self.drain.inline_drained.load(Ordering::Relaxed))
                } else {
                    self.drain.at_drained(|| {
                        before = now_ns();
                        self.switch(api, c, plan.depth, domains, None)
                    })
                };
                let n = if drained {
                    &self.counters.drained_switches
                } else {
                    &self.counters.drain_timeouts
                };
                n.fetch_add(1, Ordering::Relaxed);
                r
            } else {
                self.switch(api, c, plan.depth, domains, None)
            };
            if let Err(e) = r {
                // Retried at every tick: said the first few times only.
                if self.counters.switch_errors.fetch_add(1, Ordering::Relaxed) < 3
                    && !crate::EXITING.load(Ordering::Relaxed)
                {
                    say!("cannot switch to depth {}: {e}", plan.depth);
                }
            }
        }
        if quiet_ok
            && self.quiet.load(Ordering::Relaxed) == QUIET_NO
            && plan.depth == DEPTH_TIMING
            && c.applied.depth == DEPTH_TIMING
        {
            self.set_quiet(api, c, sub, true);
        }
        let after = now_ns();
        let reason = plan.reason as u32;
        if c.applied.depth != from.depth || reason != from.reason {
            // A raise counts from when CUPTI was on, a lowering from before it went off.
            let at = if c.applied.depth > from.depth {
                after
            } else {
                before
            };
            c.applied.reason = reason;
            self.record_depth(at, c.applied.depth, reason);
        }
        // Step markers wake the flusher at the next step boundary of the plan.
        let wake_step = plan.wake_step.unwrap_or(u64::MAX);
        self.wake_at_step.store(wake_step, Ordering::Relaxed);
        if self.steps_ended.load(Ordering::Relaxed) >= wake_step {
            // Reached while planning: look again at once.
            return Some(after);
        }
        plan.wake_ns
    }

    /// Depth 0 quiet or loud again ([`quiet_cupti`]), counted in the switching time. A
    /// failure is said the first few times; one to go quiet leaves it loud for good, one to go
    /// loud is tried again at the next tick.
    fn set_quiet(&self, api: &Cupti, c: &mut Control, sub: *mut c_void, on: bool) {
        let t0 = now_ns();
        let sync = self.drain.enabled;
        let copies = self.mem_activity != crate::MemActivity::Off;
        // SAFETY: `sub` is the shim's live subscriber (checked not null where quiet is
        // allowed); from the flusher or a blocking entry point, never from a callback.
        let r = unsafe { quiet_cupti(api, sub, on, sync, copies) };
        match r {
            Ok(()) => {
                let state = if on { QUIET_UNFLUSHED } else { QUIET_NO };
                self.quiet.store(state, Ordering::Relaxed);
                let n = self.counters.quiet_switches.fetch_add(1, Ordering::Relaxed);
                if self.log && n < 8 {
                    say!(
                        "depth 0 {}",
                        if on {
                            "quiet: graph activity and every callback off until the next window"
                        } else {
                            "loud again: graph activity and the callbacks of depth 0 on"
                        }
                    );
                }
            }
            Err(e) => {
                if on {
                    // Half done: everything back on (the calls that went through).
                    // SAFETY: as above.
                    let _ = unsafe { quiet_cupti(api, sub, false, sync, copies) };
                    c.quiet_refused = true;
                }
                if self.counters.switch_errors.fetch_add(1, Ordering::Relaxed) < 3 {
                    say!(
                        "cannot make depth 0 {}: {e}",
                        if on { "quiet" } else { "loud" }
                    );
                }
            }
        }
        self.counters
            .toggle_ns
            .fetch_add(now_ns().saturating_sub(t0), Ordering::Relaxed);
    }

    /// The flusher's control tick: requests, plan, switch, publish. Returns when to look
    /// again (ns), if before the next flush.
    pub(crate) fn control_tick(&self) -> Option<u64> {
        if crate::EXITING.load(Ordering::Acquire) {
            return None; // the process is exiting: CUPTI is left as it is
        }
        // Not tracing: the lock is left alone (`InitializeInjection` takes it on the driver's
        // thread and must find it free).
        let Some(api) = self.api.as_ref().filter(|_| self.tracing()) else {
            self.publish_counters();
            return None;
        };
        let mut c = self.control.lock().ok()?;
        if !self.tracing() {
            // Released meanwhile.
            return None;
        }
        let o = self.observe();
        if let Some(t) = &self.transport {
            let word = t.header.control.load(Ordering::Acquire);
            if let Some(r) = decode_depth_request(word) {
                if r.generation != c.agent_generation {
                    c.agent_generation = r.generation;
                    c.planner.request(Reason::Agent, r.depth, r.duration, &o);
                    t.header
                        .control_ack
                        .store(u64::from(r.generation), Ordering::Release);
                }
            }
        }
        if let Some(r) = decode_depth_request(self.script_request.load(Ordering::Acquire)) {
            if r.generation != c.script_generation {
                c.script_generation = r.generation;
                c.planner.request(Reason::Script, r.depth, r.duration, &o);
            }
        }
        let wake = self.apply_plan(api, &mut c, &o);
        self.publish(&c);
        wake
    }

    /// After tracing stopped (CUPTI released): nothing is traced until it starts again.
    pub(crate) fn stopped(&self, c: &mut Control) {
        c.applied = Applied {
            depth: DEPTH_OFF,
            reason: DEPTH_REASON_RELEASED,
            domains: 0,
        };
        self.quiet.store(QUIET_NO, Ordering::Relaxed);
        let o = self.observe();
        c.planner.interrupted(&o);
        self.record_depth(o.now_ns, DEPTH_OFF, DEPTH_REASON_RELEASED);
        self.publish(c);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_drained_switch_runs_while_a_thread_is_parked() {
        use std::{
            sync::{atomic::AtomicBool, Arc},
            time::{Duration, Instant},
        };
        let d = Arc::new(Drain::new(true));
        let done = Arc::new(AtomicBool::new(false));
        let (d2, done2) = (d.clone(), done.clone());
        // A job thread leaving synchronising calls again and again: its longest stop there.
        let job = std::thread::spawn(move || {
            let mut longest = Duration::ZERO;
            while !done2.load(Ordering::Acquire) {
                let t0 = Instant::now();
                d2.park();
                longest = longest.max(t0.elapsed());
                std::thread::sleep(Duration::from_micros(200));
            }
            longest
        });
        let ((), drained) = d.at_drained(|| std::thread::sleep(Duration::from_millis(5)));
        done.store(true, Ordering::Release);
        let longest = job.join().expect("job");
        assert!(drained);
        // The job thread sat parked while the switch ran, and no longer than it.
        assert!(longest >= Duration::from_millis(5), "{longest:?}");
        assert!(longest < PARKED_WAIT, "{longest:?}");
        // Nobody waits: a thread leaving a synchronising call does not stop.
        let t0 = Instant::now();
        d.park();
        assert!(t0.elapsed() < Duration::from_millis(5));
    }

    use std::{cell::RefCell, ffi::c_char};

    use super::*;
    use crate::api::{BufferCompletedFn, BufferRequestedFn, CallbackFn, CuptiResult, TimestampFn};

    thread_local! {
        static CALLS: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
        static FAIL_ENABLE: RefCell<bool> = const { RefCell::new(false) };
    }

    fn log(s: String) {
        CALLS.with(|c| c.borrow_mut().push(s));
    }

    fn take() -> Vec<String> {
        CALLS.with(|c| std::mem::take(&mut *c.borrow_mut()))
    }

    unsafe extern "C" fn get_version(_: *mut u32) -> CuptiResult {
        0
    }
    unsafe extern "C" fn result_string(_: CuptiResult, _: *mut *const c_char) -> CuptiResult {
        1
    }
    unsafe extern "C" fn subscribe(
        _: *mut *mut c_void,
        _: CallbackFn,
        _: *mut c_void,
    ) -> CuptiResult {
        0
    }
    unsafe extern "C" fn unsubscribe(_: *mut c_void) -> CuptiResult {
        0
    }
    unsafe extern "C" fn enable_callback(
        on: u32,
        _: *mut c_void,
        d: u32,
        cbid: u32,
    ) -> CuptiResult {
        log(format!("cb{} {d}:{cbid}", if on == 1 { "+" } else { "-" }));
        0
    }
    unsafe extern "C" fn enable_domain(on: u32, _: *mut c_void, d: u32) -> CuptiResult {
        log(format!("domain{} {d}", if on == 1 { "+" } else { "-" }));
        0
    }
    unsafe extern "C" fn activity_enable(k: u32) -> CuptiResult {
        log(format!("enable {k}"));
        if FAIL_ENABLE.with(|f| *f.borrow()) {
            1
        } else {
            0
        }
    }
    unsafe extern "C" fn activity_disable(k: u32) -> CuptiResult {
        log(format!("disable {k}"));
        0
    }
    unsafe extern "C" fn register_callbacks(
        _: BufferRequestedFn,
        _: BufferCompletedFn,
    ) -> CuptiResult {
        0
    }
    unsafe extern "C" fn register_timestamp(_: TimestampFn) -> CuptiResult {
        0
    }
    unsafe extern "C" fn flush_all(_: u32) -> CuptiResult {
        log("flush".into());
        0
    }
    unsafe extern "C" fn next_record(_: *mut u8, _: usize, _: *mut *mut c_void) -> CuptiResult {
        12
    }
    unsafe extern "C" fn dropped(_: *mut c_void, _: u32, _: *mut usize) -> CuptiResult {
        0
    }
    unsafe extern "C" fn node_id(_: *mut c_void, _: *mut u64) -> CuptiResult {
        0
    }
    unsafe extern "C" fn graph_id(_: *mut c_void, _: *mut u32) -> CuptiResult {
        0
    }

    fn fake() -> Cupti {
        Cupti {
            cuptiGetVersion: get_version,
            cuptiGetResultString: result_string,
            cuptiSubscribe: subscribe,
            cuptiUnsubscribe: unsubscribe,
            cuptiEnableCallback: enable_callback,
            cuptiEnableDomain: enable_domain,
            cuptiActivityEnable: activity_enable,
            cuptiActivityDisable: activity_disable,
            cuptiActivityRegisterCallbacks: register_callbacks,
            cuptiActivityRegisterTimestampCallback: register_timestamp,
            cuptiActivityFlushAll: flush_all,
            cuptiActivityGetNextRecord: next_record,
            cuptiActivityGetNumDroppedRecords: dropped,
            cuptiGetGraphNodeId: node_id,
            cuptiGetGraphId: graph_id,
            optional: crate::api::Optional::default(),
        }
    }

    fn timing() -> Applied {
        Applied {
            depth: DEPTH_TIMING,
            reason: 0,
            domains: 0,
        }
    }

    const SUB: *mut c_void = 8 as *mut c_void;

    /// `SLO_PROBE_TOGGLE_AT_SYNC=inline`: kernel activity (and the kinds with it) goes on and
    /// off on the thread that left a synchronising call, which does not wait for anyone; the
    /// flusher enables the launch callbacks before, and flushes and disables them after.
    #[test]
    fn an_inline_switch_runs_on_the_thread_at_a_drained_moment() {
        use std::{
            sync::{atomic::AtomicBool, Arc},
            time::{Duration, Instant},
        };
        let d = Arc::new(Drain::from_env(Some("inline")));
        assert!(d.enabled && d.inline);
        let done = Arc::new(AtomicBool::new(false));
        let (d2, done2) = (d.clone(), done.clone());
        let job = std::thread::spawn(move || {
            let api = fake();
            let mut longest = Duration::ZERO;
            let mut ran = 0;
            while !done2.load(Ordering::Acquire) {
                let t0 = Instant::now();
                // SAFETY: a fake API.
                ran +=
                    u32::from(d2.take_inline(|on| unsafe { kernel_activity(&api, on, &[5, 6]) }));
                longest = longest.max(t0.elapsed());
                std::thread::sleep(Duration::from_micros(200));
            }
            (take(), longest, ran)
        });
        let api = fake();
        let mut a = timing();
        // SAFETY: a fake API; the subscriber is never dereferenced.
        unsafe { switch_cupti(&api, SUB, &mut a, DEPTH_KERNELS, DRIVER, &[5, 6], Some(&d)) }
            .expect("raise");
        assert!(d.inline_drained.load(Ordering::Relaxed));
        assert_eq!(take(), ["cb+ 1:307", "cb+ 1:442", "cb+ 1:652", "cb+ 1:653"]);
        // SAFETY: as above.
        unsafe { switch_cupti(&api, SUB, &mut a, DEPTH_TIMING, DRIVER, &[5, 6], Some(&d)) }
            .expect("lower");
        assert_eq!(
            take(),
            [
                "flush",
                "flush",
                "cb- 1:307",
                "cb- 1:442",
                "cb- 1:652",
                "cb- 1:653"
            ],
            "flushed before and after the switch, callbacks last"
        );
        assert_eq!(a, timing());
        done.store(true, Ordering::Release);
        let (calls, longest, ran) = job.join().expect("job");
        assert_eq!(ran, 2);
        assert_eq!(
            calls,
            [
                "enable 10",
                "enable 5",
                "enable 6",
                "disable 5",
                "disable 6",
                "disable 10"
            ]
        );
        // The thread ran the CUPTI calls and went on: it never waited for the flusher.
        assert!(longest < Duration::from_millis(5), "{longest:?}");
        assert!(d.inline_wait_ns.load(Ordering::Relaxed) > 0);
    }

    /// Without a drained moment in [`DRAIN_WAIT`], nothing is switched (under the queue it would
    /// corrupt the correlation ids).
    #[test]
    fn an_inline_switch_without_a_drained_moment_switches_nothing() {
        let d = Drain::from_env(Some("inline"));
        let api = fake();
        let mut a = timing();
        // SAFETY: a fake API; the subscriber is never dereferenced.
        let r = unsafe { switch_cupti(&api, SUB, &mut a, DEPTH_KERNELS, DRIVER, &[], Some(&d)) };
        assert!(matches!(r, Err(ShimError::NotDrained)), "{r:?}");
        assert!(!d.inline_drained.load(Ordering::Relaxed));
        // Launch callbacks on, kernel activity not: the flusher tries again at its next tick.
        assert!(take().iter().all(|c| c.starts_with("cb+")));
        assert_eq!((a.depth, a.domains), (DEPTH_TIMING, DRIVER));
        // The 3 s waited is no part of the switch's cost.
        assert!(d.inline_wait_ns.load(Ordering::Relaxed) >= DRAIN_WAIT.as_nanos() as u64);
        assert_eq!(d.inline_state.load(Ordering::Relaxed), INLINE_IDLE);
        // Nobody takes a switch that is no longer wanted.
        assert!(!d.waiting());
        assert!(!d.at_sync_exit(|_| panic!("not wanted")));
        assert!(!Drain::from_env(Some("0")).enabled);
        let auto = Drain::from_env(None);
        assert!(auto.enabled && auto.inline && auto.deep_only);
        assert!(!auto.active(false) && auto.active(true));
        assert!(Drain::from_env(Some("inline")).active(false));
        let park = Drain::from_env(Some("1"));
        assert!(park.enabled && !park.inline && park.active(false));
    }

    /// 0 → 1 → 2 → 0 makes exactly the calls the design says, in order.
    #[test]
    fn switching_calls_cupti_in_order() {
        let api = fake();
        let mut a = timing();
        // SAFETY: a fake API; the subscriber is never dereferenced.
        unsafe { switch_cupti(&api, SUB, &mut a, DEPTH_KERNELS, DRIVER, &[], None) }
            .expect("raise");
        assert_eq!(
            take(),
            [
                "cb+ 1:307",
                "cb+ 1:442",
                "cb+ 1:652",
                "cb+ 1:653",
                "enable 10"
            ],
            "callbacks first, then kernel activity"
        );
        assert_eq!((a.depth, a.domains), (DEPTH_KERNELS, DRIVER));
        // SAFETY: as above.
        unsafe { switch_cupti(&api, SUB, &mut a, DEPTH_NODES, DRIVER, &[], None) }.expect("nodes");
        assert_eq!(take(), ["flush", "disable 51"]);
        // Straight down to timing: graph-level tracing back on, flush before kernels go off,
        // callbacks last.
        // SAFETY: as above.
        unsafe { switch_cupti(&api, SUB, &mut a, DEPTH_TIMING, DRIVER, &[], None) }.expect("lower");
        assert_eq!(
            take(),
            [
                "flush",
                "enable 51",
                "flush",
                "disable 10",
                "cb- 1:307",
                "cb- 1:442",
                "cb- 1:652",
                "cb- 1:653"
            ]
        );
        assert_eq!(a, timing());
    }

    /// Quiet: flushed, graph activity off, then every callback; loud again: the callbacks of
    /// depth 0 first (graph launches, graph nodes, the synchronising calls, the copies where
    /// asked), then graph activity.
    #[test]
    fn depth_zero_goes_quiet_and_loud_again_in_order() {
        let api = fake();
        // SAFETY: a fake API; the subscriber is never dereferenced.
        unsafe { quiet_cupti(&api, SUB, true, true, true) }.expect("quiet");
        assert_eq!(
            take(),
            ["flush", "disable 51", "domain- 1", "domain- 2", "domain- 3"]
        );
        // SAFETY: as above.
        unsafe { quiet_cupti(&api, SUB, false, true, false) }.expect("loud");
        assert_eq!(
            take(),
            [
                "cb+ 1:514",
                "cb+ 1:515",
                "cb+ 2:311",
                "cb+ 2:312",
                "cb+ 3:13",
                "cb+ 3:20",
                "cb+ 1:17",
                "cb+ 1:126",
                "cb+ 1:440",
                "enable 51"
            ]
        );
        // SAFETY: as above.
        unsafe { quiet_cupti(&api, SUB, false, false, true) }.expect("loud, with copies");
        let calls = take();
        assert_eq!(calls.len(), 6 + RUNTIME_COPY_CBIDS.len() + 1, "{calls:?}");
        assert!(calls.contains(&"cb+ 2:41".to_owned()) && !calls.contains(&"cb+ 1:17".into()));
        FAIL_ENABLE.with(|f| *f.borrow_mut() = true);
        // SAFETY: as above.
        let r = unsafe { quiet_cupti(&api, SUB, false, false, false) };
        FAIL_ENABLE.with(|f| *f.borrow_mut() = false);
        assert!(r.is_err(), "a refused GRAPH_TRACE is an error");
        take();
    }

    #[test]
    fn domains_change_while_traced_and_activity_only_has_no_callbacks() {
        let api = fake();
        let mut a = timing();
        // SAFETY: a fake API.
        unsafe {
            switch_cupti(
                &api,
                SUB,
                &mut a,
                DEPTH_KERNELS,
                DRIVER | RUNTIME,
                &[],
                None,
            )
        }
        .expect("raise");
        assert_eq!(take().len(), 9);
        // SAFETY: as above.
        unsafe { switch_cupti(&api, SUB, &mut a, DEPTH_KERNELS, RUNTIME, &[], None) }
            .expect("narrow");
        assert_eq!(take(), ["cb- 1:307", "cb- 1:442", "cb- 1:652", "cb- 1:653"]);
        assert_eq!(a.domains, RUNTIME);
        let mut b = timing();
        // SAFETY: as above; no subscriber.
        unsafe {
            switch_cupti(
                &api,
                std::ptr::null_mut(),
                &mut b,
                DEPTH_KERNELS,
                DRIVER,
                &[],
                None,
            )
        }
        .expect("activity only");
        assert_eq!(take(), ["enable 10"]);
        assert_eq!((b.depth, b.domains), (DEPTH_KERNELS, 0));
    }

    #[test]
    fn a_failed_enable_leaves_applied_where_it_got() {
        let api = fake();
        let mut a = timing();
        FAIL_ENABLE.with(|f| *f.borrow_mut() = true);
        // SAFETY: a fake API.
        let r = unsafe { switch_cupti(&api, SUB, &mut a, DEPTH_KERNELS, RUNTIME, &[], None) };
        FAIL_ENABLE.with(|f| *f.borrow_mut() = false);
        let e = r.expect_err("enable fails");
        assert!(e
            .to_string()
            .starts_with("cuptiActivityEnable(CONCURRENT_KERNEL) failed"));
        assert_eq!((a.depth, a.domains), (DEPTH_TIMING, RUNTIME));
        take();
        // The next switch down removes the callbacks that went on.
        // SAFETY: as above.
        unsafe { switch_cupti(&api, SUB, &mut a, DEPTH_TIMING, RUNTIME, &[], None) }
            .expect("lower");
        assert_eq!(take(), ["cb- 2:211", "cb- 2:214", "cb- 2:430", "cb- 2:431"]);
    }

    #[test]
    fn graph_launch_ids() {
        assert!(is_graph_launch(DOMAIN_DRIVER, 514));
        assert!(is_graph_launch(DOMAIN_RUNTIME, 312));
        assert!(!is_graph_launch(DOMAIN_RUNTIME, 211));
        assert!(!is_graph_launch(3, 514));
    }
}
