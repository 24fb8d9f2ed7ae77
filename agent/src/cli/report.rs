//! The text reports of `observe` and `replay`: per thread role and thread, processes,
//! connections, cgroups, outliers, drops; per training process its iterations, operators and
//! SLO tree with violations; the straggler view. They read a snapshot and nothing else.

use std::fmt::Write as _;

use slo_probe_common::Counter;
use slo_probe_core::{
    net::endpoints,
    roles::Role,
    snapshot::ProcessSnapshot,
    straggler::RankView,
    threads::{RunqCounts, ThreadCounts},
};

use super::observe::Observation;

/// A duration in ns, human-readable (`830 ns`, `12.4 µs`, `3.10 ms`, `1.25 s`).
pub fn human_ns(ns: f64) -> String {
    if ns < 1e3 {
        format!("{ns:.0} ns")
    } else if ns < 1e6 {
        format!("{:.1} µs", ns / 1e3)
    } else if ns < 1e9 {
        format!("{:.2} ms", ns / 1e6)
    } else {
        format!("{:.2} s", ns / 1e9)
    }
}

/// Bytes, human-readable.
pub fn human_bytes(b: u64) -> String {
    let b = b as f64;
    if b < 1024.0 {
        format!("{b:.0} B")
    } else if b < 1024.0 * 1024.0 {
        format!("{:.1} KiB", b / 1024.0)
    } else if b < 1024.0 * 1024.0 * 1024.0 {
        format!("{:.1} MiB", b / 1024.0 / 1024.0)
    } else {
        format!("{:.2} GiB", b / 1024.0 / 1024.0 / 1024.0)
    }
}

fn quantiles(c: &RunqCounts) -> [String; 3] {
    let q = |q: f64| c.quantile_ns(q).map_or("-".to_owned(), human_ns);
    [q(0.5), q(0.99), human_ns(c.max_ns as f64)]
}

fn thread_row(out: &mut String, pid: u32, tid: &str, name: &str, role: &str, c: &ThreadCounts) {
    let [p50, p99, max] = quantiles(&c.runq);
    let _ = writeln!(
        out,
        "{pid:>7} {tid:>7}  {name:<16} {role:<13} {:>7} {:>10} {p50:>9} {p99:>9} {max:>9} \
         {:>9} {:>9}",
        c.runq.count,
        human_ns(c.runq.total_ns as f64),
        human_ns(c.offcpu_voluntary_ns as f64),
        human_ns(c.offcpu_involuntary_ns as f64),
    );
}

/// The report printed at the end of `observe`: per role, then the threads with the longest
/// run-queue waits (at most `top`), the processes, TCP connections, cgroups, outliers and drops.
pub fn report(obs: &Observation, command: &str, top: usize) -> String {
    let mut out = String::new();
    let s = &obs.snapshot;
    let status = match obs.exit {
        Some(st) => format!("exited with {st}"),
        None => "still running; stopped".to_owned(),
    };
    let _ = writeln!(
        out,
        "slo-probe observed `{command}` for {:.1} s ({status}): {} processes",
        obs.elapsed.as_secs_f64(),
        obs.pids.len()
    );
    let Some(t) = &s.threads else {
        let reason = s
            .probes
            .iter()
            .map(|p| format!("{}: {}", p.name, p.reason))
            .collect::<Vec<_>>()
            .join("; ");
        let _ = writeln!(out, "no per-thread data: {reason}");
        return out;
    };

    let by_role = t.by_role(Some(&obs.pids));
    let retrans = |role: Role| -> u64 {
        s.net.as_ref().map_or(0, |n| {
            n.retransmits
                .iter()
                .filter(|((pid, r), _)| *r == role && obs.pids.contains(pid))
                .map(|(_, n)| n)
                .sum()
        })
    };
    let _ = writeln!(
        out,
        "\nby thread role (run-queue wait = runnable, waiting for a CPU):"
    );
    let _ = writeln!(
        out,
        "{:<14} {:>7} {:>8} {:>10} {:>9} {:>9} {:>9} {:>10} {:>10} {:>10} {:>10} {:>7}",
        "role",
        "threads",
        "waits",
        "run-queue",
        "p50",
        "p99",
        "max",
        "off-cpu v",
        "off-cpu i",
        "tcp sent",
        "tcp recv",
        "retrans"
    );
    for role in Role::ALL {
        let Some(c) = by_role.get(&role) else {
            continue;
        };
        let threads = t
            .threads
            .iter()
            .filter(|th| th.role == role && obs.pids.contains(&th.pid))
            .count();
        let [p50, p99, max] = quantiles(&c.runq);
        let _ = writeln!(
            out,
            "{:<14} {threads:>7} {:>8} {:>10} {p50:>9} {p99:>9} {max:>9} {:>10} {:>10} {:>10} \
             {:>10} {:>7}",
            role.as_str(),
            c.runq.count,
            human_ns(c.runq.total_ns as f64),
            human_ns(c.offcpu_voluntary_ns as f64),
            human_ns(c.offcpu_involuntary_ns as f64),
            human_bytes(c.tcp_sent_bytes),
            human_bytes(c.tcp_recv_bytes),
            retrans(role),
        );
    }

    let mut threads: Vec<_> = t
        .threads
        .iter()
        .filter(|th| obs.pids.contains(&th.pid))
        .collect();
    threads.sort_by_key(|th| std::cmp::Reverse(th.counts.runq.total_ns));
    let _ = writeln!(out, "\nthreads with the longest run-queue waits:");
    let _ = writeln!(
        out,
        "{:>7} {:>7}  {:<16} {:<13} {:>7} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "pid",
        "tid",
        "thread",
        "role",
        "waits",
        "run-queue",
        "p50",
        "p99",
        "max",
        "off-cpu v",
        "off-cpu i"
    );
    for th in threads.iter().take(top) {
        let name = if th.exited {
            format!("{}*", th.name)
        } else {
            th.name.clone()
        };
        thread_row(
            &mut out,
            th.pid,
            &th.tid.to_string(),
            &name,
            th.role.as_str(),
            &th.counts,
        );
    }
    if threads.len() > top {
        let _ = writeln!(out, "  ... {} more threads", threads.len() - top);
    }
    if threads.iter().any(|th| th.exited) {
        let _ = writeln!(out, "  (* exited)");
    }

    let _ = writeln!(out, "\nprocesses:");
    for p in t.processes.iter().filter(|p| obs.pids.contains(&p.pid)) {
        let _ = writeln!(
            out,
            "{:>7} (parent {:>7})  {:<16} {:<11} {:>3} threads, {} run-queue waits",
            p.pid,
            p.ppid,
            p.name,
            p.kind.as_str(),
            p.threads,
            p.counts.runq.count
        );
    }

    if let Some(net) = &s.net {
        let conns: Vec<_> = net
            .conns
            .iter()
            .filter(|c| obs.pids.contains(&c.pid))
            .collect();
        let _ = writeln!(out, "\nTCP connections: {}", conns.len());
        for c in conns.iter().take(5) {
            let (local, remote) = endpoints(&c.tuple);
            let _ = writeln!(
                out,
                "  {local} -> {remote}  {} ({}, tid {})  {} retransmits, srtt {}, cwnd {}",
                c.process,
                c.role,
                c.tid,
                c.retransmits,
                human_ns(f64::from(c.srtt_us) * 1e3),
                c.snd_cwnd
            );
        }
    } else if let Some(p) = s.probes.iter().find(|p| p.name == "tcp" && !p.up) {
        let _ = writeln!(out, "\nTCP: down: {}", p.reason);
    }

    if !s.cgroups.is_empty() {
        let _ = writeln!(out, "\ncgroups:");
        for c in &s.cgroups {
            let limit = c
                .limit
                .and_then(|l| l.cpus())
                .map_or("no limit".to_owned(), |cpus| {
                    format!("limit {cpus:.2} CPUs")
                });
            let throttled = c.cpu.map_or("no bandwidth control".to_owned(), |st| {
                format!(
                    "throttled {}/{} periods, {} since the cgroup was created",
                    st.nr_throttled,
                    st.nr_periods,
                    human_ns(st.throttled_ns as f64)
                )
            });
            let roles: Vec<&str> = c.roles.iter().map(|r| r.as_str()).collect();
            let _ = writeln!(
                out,
                "  v{} {}  {limit}, {throttled}; roles {}",
                c.version,
                c.path,
                roles.join(",")
            );
        }
    }

    for p in s.processes.iter().filter(|p| obs.pids.contains(&p.pid)) {
        gpu_report(&mut out, p);
        if let Some(h) = obs.healers.get(&p.pid) {
            shadow_heal_report(&mut out, h);
        }
    }
    let ranks: Vec<RankView> = s
        .stragglers
        .iter()
        .filter(|v| obs.pids.contains(&v.pid))
        .cloned()
        .collect();
    straggler_report(&mut out, &ranks);
    if let Some(g) = &s.gpus {
        for d in &g.devices {
            let pct = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.0}%"));
            let _ = writeln!(
                out,
                "GPU {} {} (NVML, last sample): utilisation {}, memory {} of {}, SM clock {} MHz, \
                 power {} W; GPM: SM occupancy {}, DRAM bandwidth {}, tensor {}",
                d.index,
                d.name,
                pct(d.gpu_util_percent),
                d.memory_used_bytes.map_or("-".into(), human_bytes),
                d.memory_total_bytes.map_or("-".into(), human_bytes),
                d.sm_clock_mhz.map_or("-".into(), |v| v.to_string()),
                d.power_watts.map_or("-".into(), |v| format!("{v:.0}")),
                pct(d.gpm.sm_occupancy_percent),
                pct(d.gpm.dram_bw_util_percent),
                pct(d.gpm.any_tensor_util_percent),
            );
        }
    }

    let outliers: u64 = obs
        .pids
        .iter()
        .filter_map(|pid| s.outliers.per_process.get(pid))
        .sum();
    let _ = writeln!(
        out,
        "\nrun-queue outliers (waits above the threshold): {outliers}"
    );
    for o in s
        .outliers
        .recent
        .iter()
        .rev()
        .filter(|o| obs.pids.contains(&o.pid))
        .take(5)
    {
        let _ = writeln!(
            out,
            "  {} tid {} ({}) on cpu {} after {} (behind tid {})",
            human_ns(o.delay_ns as f64),
            o.tid,
            o.thread,
            o.cpu,
            if o.preempted {
                "a preemption"
            } else {
                "a wakeup"
            },
            o.prev_tid
        );
    }
    let drops: Vec<String> = Counter::ALL
        .iter()
        .filter(|c| c.is_drop() || **c == Counter::DecodeFailed || **c == Counter::ProbeReadFailed)
        .filter(|c| s.counters[**c as usize] > 0)
        .map(|c| format!("{} {}", c.name(), s.counters[*c as usize]))
        .collect();
    let _ = writeln!(
        out,
        "drops and errors: {}",
        if drops.is_empty() {
            "none".to_owned()
        } else {
            drops.join(", ")
        }
    );
    let down: Vec<String> = s
        .probes
        .iter()
        .filter(|p| !p.up)
        .map(|p| format!("{} ({})", p.name, p.reason))
        .collect();
    if !down.is_empty() {
        let _ = writeln!(out, "probes down: {}", down.join("; "));
    }
    out
}

fn gpu_report(out: &mut String, p: &ProcessSnapshot) {
    use slo_probe_common::ring::{STATUS_DIAGNOSTIC, STATUS_LOST_RACE, STATUS_TRACING};
    let _ = writeln!(
        out,
        "\nGPU (CUPTI shim of pid {}, CUPTI {}): {} records ({} kernels, {} graph launches, {} \
         memory ops, {} graph nodes, {} steps); dropped {} by the shim, {} by CUPTI{}{}",
        p.pid,
        p.cupti_version,
        p.records,
        p.seen[0],
        p.seen[1],
        p.seen[2],
        p.seen[3],
        p.seen[5] / 2,
        p.dropped,
        p.cupti_dropped,
        if p.status & STATUS_LOST_RACE != 0 {
            "; LOST the CUPTI race (another tool subscribed first)"
        } else if p.status & STATUS_TRACING == 0 {
            "; not tracing"
        } else {
            ""
        },
        if p.status & STATUS_DIAGNOSTIC != 0 {
            "; node-level tracing on"
        } else {
            ""
        },
    );
    depth_report(out, p);
    iterations_report(out, p);
}

/// The shim's tracing depth, its duty cycle, what the SLO engine asked for and the shim's cost.
fn depth_report(out: &mut String, p: &ProcessSnapshot) {
    use slo_probe_common::gpu::{
        DEPTH_OFF, DEPTH_REASON_AGENT, DEPTH_REASON_RELEASED, DEPTH_REASON_SAMPLE,
        DEPTH_REASON_SCRIPT,
    };
    let Some(d) = p.depth else { return };
    let name = |d: u32| match d {
        0 => "timing",
        1 => "kernels",
        2 => "graph nodes",
        DEPTH_OFF => "off",
        _ => "?",
    };
    let why = match d.reason {
        // The duty cycle publishes no window while kernel tracing is held on.
        DEPTH_REASON_SAMPLE if d.window == 0 => {
            "held on: the GPU runs far behind the launches, or the job launches CUDA graphs"
        }
        DEPTH_REASON_SAMPLE => "a sample window",
        DEPTH_REASON_AGENT => "the agent asked",
        DEPTH_REASON_SCRIPT => "the script asked",
        DEPTH_REASON_RELEASED => "CUPTI handed over",
        _ => "its tier",
    };
    let unit = if d.millis { "ms" } else { "steps" };
    let sampling = if d.period > 0 {
        format!(
            "; samples kernels {} {unit} in every {} {unit}",
            d.window, d.period
        )
    } else {
        String::new()
    };
    let _ = writeln!(
        out,
        "  shim depth {} ({why}){sampling}; the SLO engine wants {}; shim cost {:.2}% of step \
         time (callbacks + estimated CUPTI records)",
        name(d.depth),
        name(p.depth_wanted),
        100.0 * p.shim_overhead_ratio()
    );
    if p.status & slo_probe_common::ring::STATUS_DRAINED_SWITCHING != 0 {
        let _ = writeln!(
            out,
            "  the GPU runs far behind the launches: the shim switches kernel tracing only when \
             the job synchronises (a window or a requested depth starts and ends at its next \
             synchronising call)"
        );
    }
    if p.gpu_records_stalled_s > 0 {
        let _ = writeln!(
            out,
            "  no GPU record has arrived for {} s while kernels are traced: CUPTI is holding them; \
             the SLO tree is judged on wall times and host data until they come",
            p.gpu_records_stalled_s
        );
    }
}

/// The straggler view of every job with two or more ranks in the observed tree.
pub fn straggler_report(out: &mut String, views: &[RankView]) {
    let mut job = "";
    for v in views {
        if v.job_id != job {
            job = &v.job_id;
            let _ = writeln!(
                out,
                "Stragglers of job {job} (each rank against the median of the others; named from \
                 noncomm {} or host delay {}):",
                slo_probe_core::straggler::NONCOMM_OUTLIER,
                slo_probe_core::straggler::HOST_OUTLIER
            );
        }
        let score = |x: Option<f64>| x.map_or("-".to_owned(), |x| format!("{x:.2}"));
        let _ = writeln!(
            out,
            "  rank {:>3} pid {:>7}: noncomm {} ({}), host delay {} ({}){}",
            v.rank,
            v.pid,
            v.noncomm_s.map_or("-".to_owned(), |x| human_ns(x * 1e9)),
            score(v.noncomm_score),
            v.host_delay_ms_per_s
                .map_or("-".to_owned(), |x| format!("{x:.1} ms/s")),
            score(v.host_score),
            v.straggler
                .as_deref()
                .map_or(String::new(), |c| format!("  <- the straggler: {c}"))
        );
    }
}

/// The SLO tree as of its last window, and its violations with their causal chains.
pub fn slo_report(out: &mut String, s: &slo_probe_core::slo::SloSnapshot) {
    use slo_probe_core::slo::ROOT;
    let root = &s.nodes[0];
    let _ = writeln!(
        out,
        "  SLO tree ({} windows of {}, {} iterations{}): score {}",
        s.windows,
        human_ns(s.window_ns as f64),
        s.iterations,
        if s.learning {
            "; learning baselines"
        } else {
            ""
        },
        root.compliance
            .map_or("-".to_owned(), |c| format!("{:.1}%", 100.0 * c)),
    );
    let _ = writeln!(
        out,
        "    {:<34} {:>11} {:>22} {:>11} {:>10} {:>6}  state",
        "node", "value", "threshold", "baseline", "compliance", "burn"
    );
    fn walk(out: &mut String, s: &slo_probe_core::slo::SloSnapshot, parent: &str, depth: usize) {
        for n in s.nodes.iter().skip(1).filter(|n| n.parent == parent) {
            let num = |v: Option<f64>| match v {
                Some(v) if v.abs() >= 100.0 => format!("{v:.0}"),
                Some(v) => format!("{v:.2}"),
                None => "-".to_owned(),
            };
            let name = format!(
                "{}{} {}",
                "  ".repeat(depth),
                n.name,
                n.stat.map_or("", |s| s.as_str())
            );
            let threshold = n.threshold.map_or("-".to_owned(), |(t, src)| {
                format!(
                    "{} {} {}",
                    match n.objective {
                        Some(slo_probe_core::slo::Objective::Above) => ">",
                        _ => "<",
                    },
                    num(Some(t)),
                    src.as_str()
                )
            });
            let _ = writeln!(
                out,
                "    {:<34} {:>11} {:>22} {:>11} {:>10} {:>6}  {}",
                name,
                format!("{} {}", num(n.value), n.unit),
                threshold,
                num(n.baseline),
                n.compliance
                    .map_or("-".to_owned(), |c| format!("{:.1}%", 100.0 * c)),
                num(n.burn_rate),
                if n.past_by_chance() {
                    slo_probe_core::slo::NodeView::PAST_BY_CHANCE
                } else {
                    n.state.as_str()
                }
            );
            walk(out, s, &n.name, depth + 1);
        }
    }
    walk(out, s, ROOT, 0);
    if s.violations.is_empty() {
        let _ = writeln!(out, "  violations: none");
    }
    for v in &s.violations {
        let _ = writeln!(
            out,
            "  violation #{} ({}, {}): {}",
            v.id,
            v.severity.as_str(),
            if v.closed_ns.is_some() {
                "closed"
            } else {
                "open"
            },
            v.chain
        );
        if let Some(a) = &v.attribution {
            for c in a.causes.iter().skip(1) {
                let _ = writeln!(
                    out,
                    "      also {} {:+.2} ms per iteration ({}: {})",
                    c.op,
                    c.delta_ns / 1e6,
                    c.dimension.as_str(),
                    c.detail
                );
            }
        }
    }
}

/// The iterations of one process: wall time, GPU busy, kernels and graph launches, launch
/// latency, what NVML saw, and the operators by GPU time.
pub fn iterations_report(out: &mut String, p: &ProcessSnapshot) {
    let Some(st) = &p.stats else {
        let _ = writeln!(out, "  no complete iteration");
        return;
    };
    let lat = |k: usize| {
        st.launch_latency_ns
            .map_or("-".to_owned(), |l| human_ns(l[k] as f64))
    };
    let _ = writeln!(
        out,
        "  {} iterations ({}): wall p50 {}, p99 {}; GPU busy p50 {:.1}%; {:.1} kernels and {:.1} graph \
         launches per iteration; launch latency p50 {}, p99 {}; GPU idle before the first kernel \
         {} on average",
        st.count,
        if st.marked { "step markers" } else { "detected" },
        human_ns(st.wall_ns[0] as f64),
        human_ns(st.wall_ns[1] as f64),
        100.0 * st.gpu_busy_ratio_p50,
        st.kernels_mean,
        st.graph_launches_mean,
        lat(0),
        lat(1),
        human_ns(st.idle_before_first_mean_ns),
    );
    nvml_during_iterations(out, p);
    let _ = writeln!(out, "  operators by GPU time:");
    for o in st.ops.iter().take(8) {
        let (op, ns, k) = (&*o.op, o.gpu_ns, o.count);
        let occ = o.occupancy.map_or(String::new(), |occ| {
            format!(", theoretical occupancy {:.0}%", 100.0 * occ)
        });
        let runs = slo_probe_core::gputrace::graph_id_of(op)
            .and_then(|id| p.graph_ops.get(&id))
            .map(|ops| {
                let list: Vec<String> = ops
                    .iter()
                    .take(4)
                    .map(|(o, share)| format!("{o} {:.0}%", 100.0 * share))
                    .collect();
                format!(
                    " = {}{}",
                    list.join(", "),
                    if ops.len() > 4 { ", …" } else { "" }
                )
            })
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "    {:>5.1}%  {op} ({k} {}{occ}){runs}",
            100.0 * ns as f64 / st.ops_gpu_ns.max(1) as f64,
            if op.starts_with("graph#") {
                "launches"
            } else if op.contains("memcpy") || op.contains("memset") {
                "operations"
            } else {
                "kernels"
            }
        );
    }
    if let Some(slo) = &p.slo {
        slo_report(out, slo);
    }
}

/// What NVML saw while the iterations ran: medians over the iterations that have samples (the
/// warm-up iterations, seconds long and mostly idle, do not weigh more), and the lowest SM clock.
fn nvml_during_iterations(out: &mut String, p: &ProcessSnapshot) {
    let aligned: Vec<_> = p.iterations.iter().filter_map(|i| i.gpu.as_ref()).collect();
    if aligned.is_empty() {
        // No NVML (no driver, or a replayed recording): nothing to say.
        return;
    }
    let median = |f: &dyn Fn(&slo_probe_core::gpu::IterationGpu) -> Option<f64>| {
        let mut v: Vec<f64> = aligned.iter().filter_map(|g| f(g)).collect();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied()
    };
    let pct = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.0}%"));
    let min_clock = aligned
        .iter()
        .filter_map(|g| g.sm_clock_mhz)
        .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.min(v))));
    let _ = writeln!(
        out,
        "  NVML during iterations ({} of {} with samples, GPU {}), medians: utilisation {}, SM \
         clock {} MHz (lowest {}), power {} W; GPM: SM occupancy {}, SM active {}, DRAM \
         bandwidth {}, tensor {}",
        aligned.len(),
        p.iterations.len(),
        aligned[0].index,
        pct(median(&|g| g.gpu_util_percent)),
        median(&|g| g.sm_clock_mhz).map_or("-".into(), |v| format!("{v:.0}")),
        min_clock.map_or("-".into(), |v| format!("{v:.0}")),
        median(&|g| g.power_watts).map_or("-".into(), |v| format!("{v:.0}")),
        pct(median(&|g| g.sm_occupancy_percent)),
        pct(median(&|g| g.sm_util_percent)),
        pct(median(&|g| g.dram_bw_util_percent)),
        pct(median(&|g| g.tensor_util_percent)),
    );
}

/// A shadow healer's part of a report (`replay`, `observe`): its decisions, in seconds from
/// its first tick.
pub fn shadow_heal_report(out: &mut String, h: &crate::healer::shadow::Decided) {
    let t0 = h.first_ns;
    use slo_probe_core::healer::Event;
    let decisions: Vec<_> = h
        .events
        .iter()
        .filter(|e| !matches!(e.event, Event::Learning { .. }))
        .collect();
    let _ = writeln!(
        out,
        "  healer (shadow, deciding only; seconds from its first look): {} action{} it would \
         have taken{}",
        h.actions,
        if h.actions == 1 { "" } else { "s" },
        if decisions.is_empty() {
            "; nothing to decide"
        } else {
            ""
        }
    );
    for e in decisions.iter().take(MAX_HEAL_LINES) {
        let at = t0.map_or(String::new(), |t| {
            format!("{:+8.1} s  ", (e.at_ns as f64 - t as f64) / 1e9)
        });
        let _ = writeln!(out, "    {at}{}", crate::healer::audit::body(e));
    }
    if decisions.len() > MAX_HEAL_LINES {
        let _ = writeln!(
            out,
            "    ... {} more (--json has them all)",
            decisions.len() - MAX_HEAL_LINES
        );
    }
}

/// Healer events a text report lists.
const MAX_HEAL_LINES: usize = 40;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depth_line_tells_a_window_from_a_hold() {
        use slo_probe_common::{gpu::DEPTH_REASON_SAMPLE, ring::ShimDepth};
        let report = |p: &ProcessSnapshot| {
            let mut out = String::new();
            depth_report(&mut out, p);
            out
        };
        let sampling = |window, period| ProcessSnapshot {
            depth: Some(ShimDepth {
                depth: 1,
                reason: DEPTH_REASON_SAMPLE,
                window,
                period,
                millis: false,
            }),
            ..ProcessSnapshot::default()
        };
        let line = |window, period| report(&sampling(window, period));
        let w = line(5, 400);
        assert!(
            w.contains("(a sample window); samples kernels 5 steps in every 400 steps"),
            "{w}"
        );
        let h = line(0, 0);
        assert!(h.contains("(held on: ") && !h.contains("samples"), "{h}");
        assert!(!w.contains("only when the job synchronises"), "{w}");
        // Switched at drained moments (the shim's status bit): said.
        let out = report(&ProcessSnapshot {
            status: slo_probe_common::ring::STATUS_DRAINED_SWITCHING,
            ..sampling(5, 400)
        });
        assert!(out.contains("only when the job synchronises"), "{out}");
        // The first window, before its period is known.
        let first = line(5, 0);
        assert!(first.contains("(a sample window)"), "{first}");
        assert!(!first.contains("CUPTI is holding them"), "{first}");
        let out = report(&ProcessSnapshot {
            depth: Some(ShimDepth {
                depth: 1,
                ..ShimDepth::default()
            }),
            gpu_records_stalled_s: 45,
            ..ProcessSnapshot::default()
        });
        assert!(
            out.contains("no GPU record has arrived for 45 s while kernels are traced"),
            "{out}"
        );
    }

    #[test]
    fn human_units() {
        assert_eq!(human_ns(830.0), "830 ns");
        assert_eq!(human_ns(12_400.0), "12.4 µs");
        assert_eq!(human_ns(3_100_000.0), "3.10 ms");
        assert_eq!(human_ns(1_250_000_000.0), "1.25 s");
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(3 * 1024 * 1024), "3.0 MiB");
    }

    #[test]
    fn straggler_report_names_the_starved_rank() {
        use slo_probe_core::{
            gputrace::Iteration,
            slo::{NodeView, SloSnapshot},
            straggler::stragglers,
        };
        let rank = |pid: u32, r: u32, main_ms_per_s: f64| ProcessSnapshot {
            pid,
            rank: Some(r),
            job_id: Some("ddp".into()),
            iterations: vec![
                Iteration {
                    end_ns: 400_000_000,
                    ..Default::default()
                };
                5
            ]
            .into(),
            slo: Some(std::sync::Arc::new(SloSnapshot {
                nodes: vec![NodeView {
                    name: "host.runqueue.main".into(),
                    value: Some(main_ms_per_s),
                    ..Default::default()
                }],
                ..Default::default()
            })),
            ..Default::default()
        };
        let mut out = String::new();
        straggler_report(
            &mut out,
            &stragglers(&[rank(10, 0, 0.5), rank(11, 1, 120.0)]),
        );
        assert!(out.starts_with("Stragglers of job ddp"), "{out}");
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 3, "{out}");
        assert!(!lines[1].contains("straggler:"), "{out}");
        assert!(
            lines[2].contains("rank   1")
                && lines[2].ends_with("<- the straggler: host.runqueue.main"),
            "{out}"
        );
    }
}
