#!/usr/bin/env python3
"""Writes the Grafana dashboards in this folder (slo-probe-*.json).

The JSON files are the deliverable (import them as they are); this script is how they are kept
consistent: edit it and run `python3 dashboards/generate.py`. tests/prometheus_export.rs runs
every query of the JSON files against a real Prometheus scraping a real agent.
"""

import json
import pathlib

DS = {"type": "prometheus", "uid": "${datasource}"}
# Selectors. Host and GPU families carry no job labels: a node's agent follows its job, so the
# instance selects the job's host side. Training-process families carry job_id and rank.
INST = 'instance=~"$instance"'
PROC = 'instance=~"$instance",job_id=~"$job_id",rank=~"$rank"'
RI = "$__rate_interval"


def variables():
    """The datasource, instance, job_id and rank variables."""

    def query(name, label, q, text):
        return {
            "name": name,
            "label": text,
            "type": "query",
            "datasource": DS,
            "definition": q,
            "query": {"query": q, "refId": "PrometheusVariableQueryEditor-VariableQuery"},
            "refresh": 2,
            "includeAll": True,
            "multi": True,
            "allValue": ".*",
            "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
            "sort": 1,
            "hide": 0,
            "regex": "",
            "options": [],
        }

    out = [
        {
            "name": "datasource",
            "label": "Data source",
            "type": "datasource",
            "query": "prometheus",
            "current": {},
            "hide": 0,
            "refresh": 1,
            "regex": "",
            "options": [],
        },
        query("instance", "instance", "label_values(slo_probe_build_info, instance)", "Node (agent)"),
        query(
            "job_id",
            "job_id",
            'label_values(slo_probe_iterations_total{instance=~"$instance"}, job_id)',
            "Job",
        ),
        query(
            "rank",
            "rank",
            'label_values(slo_probe_iterations_total{instance=~"$instance",job_id=~"$job_id"}, rank)',
            "Rank",
        ),
    ]
    return out


class Dashboard:
    def __init__(self, uid, title, description):
        self.uid = uid
        self.title = title
        self.description = description
        self.panels = []
        self.x = 0
        self.y = 0
        self.row_h = 0
        self.next_id = 1

    def _place(self, w, h):
        if self.x + w > 24:
            self.x = 0
            self.y += self.row_h
            self.row_h = 0
        pos = {"h": h, "w": w, "x": self.x, "y": self.y}
        self.x += w
        self.row_h = max(self.row_h, h)
        return pos

    def row(self, title):
        if self.x:
            self.x = 0
            self.y += self.row_h
            self.row_h = 0
        self.panels.append(
            {
                "id": self.next_id,
                "type": "row",
                "title": title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": self.y},
                "panels": [],
            }
        )
        self.next_id += 1
        self.y += 1

    def panel(self, kind, title, description, targets, unit="short", w=12, h=8, **extra):
        refs = "ABCDEFGHIJ"
        instant = extra.pop("instant", False)
        tgts = []
        for i, t in enumerate(targets):
            expr, legend = t if isinstance(t, tuple) else (t, "")
            tgt = {
                "refId": refs[i],
                "datasource": DS,
                "editorMode": "code",
                "expr": expr,
                "legendFormat": legend or "__auto",
                "range": not instant,
                "instant": instant,
            }
            if kind == "table":
                tgt["format"] = "table"
            tgts.append(tgt)
        defaults = {"unit": unit}
        defaults.update(extra.pop("defaults", {}))
        if kind == "timeseries":
            custom = {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 10, "showPoints": "never",
                      "spanNulls": False}
            custom.update(extra.pop("custom", {}))
            defaults["custom"] = custom
        p = {
            "id": self.next_id,
            "type": kind,
            "title": title,
            "description": description,
            "datasource": DS,
            "gridPos": self._place(w, h),
            "fieldConfig": {"defaults": defaults, "overrides": extra.pop("overrides", [])},
            "options": extra.pop("options", {}),
            "targets": tgts,
        }
        if kind == "timeseries" and not p["options"]:
            p["options"] = {
                "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                "tooltip": {"mode": "multi", "sort": "desc"},
            }
        p.update(extra)
        self.next_id += 1
        self.panels.append(p)

    def json(self):
        return {
            "annotations": {
                "list": [
                    {
                        "builtIn": 1,
                        "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                        "enable": True,
                        "hide": True,
                        "iconColor": "rgba(0, 211, 255, 1)",
                        "name": "Annotations & Alerts",
                        "type": "dashboard",
                    }
                ]
            },
            "description": self.description,
            "editable": True,
            "fiscalYearStartMonth": 0,
            "graphTooltip": 1,
            "links": [
                {
                    "asDropdown": True,
                    "includeVars": True,
                    "keepTime": True,
                    "tags": ["slo-probe"],
                    "title": "slo-probe",
                    "type": "dashboards",
                }
            ],
            "panels": self.panels,
            "refresh": "30s",
            "schemaVersion": 39,
            "tags": ["slo-probe"],
            "templating": {"list": variables()},
            "time": {"from": "now-1h", "to": "now"},
            "timepicker": {},
            "timezone": "",
            "title": self.title,
            "uid": self.uid,
            "version": 1,
            "weekStart": "",
        }


# A stat or gauge panel's value: the latest one.
LAST_VALUE = {"calcs": ["lastNotNull"], "fields": "", "values": False}


def timeline_options(align=None):
    """A state timeline's options: no values drawn, equal values merged, no legend."""
    out = {"showValue": "never", "mergeValues": True}
    if align:
        out["alignValue"] = align
    out["rowHeight"] = 0.8
    out["legend"] = {"displayMode": "list", "placement": "bottom", "showLegend": False}
    return out


def thresholds(*steps):
    return {"mode": "absolute", "steps": [{"color": c, "value": v} for c, v in steps]}


STATE_MAPPING = [
    {
        "type": "value",
        "options": {
            "0": {"text": "unknown", "color": "text", "index": 0},
            "1": {"text": "ok", "color": "green", "index": 1},
            "2": {"text": "breaching", "color": "yellow", "index": 2},
            "3": {"text": "warning", "color": "orange", "index": 3},
            "4": {"text": "critical", "color": "red", "index": 4},
        },
    }
]


def slo():
    d = Dashboard(
        "slo-probe-slo",
        "slo-probe / SLO",
        "The SLO tree of each training process (rank): state, compliance, burn rate, iteration "
        "time, violations and the operators they were attributed to; the healer's timeline.",
    )
    d.row("Status")
    d.panel(
        "stat", "Job score",
        "Weighted compliance over the SLO tree's weighted nodes, per rank (1: every judged window "
        "met its threshold).",
        [(f"slo_probe_slo_score{{{PROC}}}", "{{job_id}} rank {{rank}}")],
        unit="percentunit", w=6, h=6,
        defaults={"min": 0, "max": 1, "decimals": 1,
                  "thresholds": thresholds(("red", None), ("orange", 0.95), ("green", 0.99))},
        options={"colorMode": "background", "graphMode": "area", "textMode": "value_and_name",
                 "reduceOptions": LAST_VALUE},
    )
    d.panel(
        "stat", "Open violations",
        "SLO nodes with an open violation (warning or critical), per job.",
        [(f'sum by (job_id) (slo_probe_slo_state{{{PROC},state=~"warning|critical"}})', "{{job_id}}")],
        w=6, h=6,
        defaults={"thresholds": thresholds(("green", None), ("red", 1))},
        options={"colorMode": "background", "graphMode": "none", "textMode": "value_and_name",
                 "reduceOptions": LAST_VALUE},
    )
    d.panel(
        "bargauge", "Violations opened in the time range",
        "Violations opened per node over the dashboard's time range (a node breaching its "
        "threshold in slo.breach_windows consecutive windows).",
        [(f"sum by (node) (increase(slo_probe_slo_violations_total{{{PROC}}}[$__range]))", "{{node}}")],
        w=12, h=6, instant=True,
        defaults={"min": 0, "decimals": 0, "thresholds": thresholds(("green", None), ("red", 0.5))},
        options={"displayMode": "basic", "orientation": "horizontal", "showUnfilled": True,
                 "reduceOptions": LAST_VALUE},
    )
    d.panel(
        "state-timeline", "SLO state by node",
        "Each node's state over time: ok, breaching (the last window missed), warning or "
        "critical (a violation is open; critical: 1.5x past the threshold), unknown (no value yet).",
        [(
            "max by (job_id, rank, node) ("
            f'slo_probe_slo_state{{{PROC},state="ok"}} * 1'
            f' or slo_probe_slo_state{{{PROC},state="breaching"}} * 2'
            f' or slo_probe_slo_state{{{PROC},state="warning"}} * 3'
            f' or slo_probe_slo_state{{{PROC},state="critical"}} * 4)',
            "rank {{rank}} {{node}}",
        )],
        w=24, h=10,
        defaults={"mappings": STATE_MAPPING, "color": {"mode": "thresholds"},
                  "thresholds": thresholds(("text", None), ("green", 1), ("yellow", 2),
                                           ("orange", 3), ("red", 4))},
        options=timeline_options(align="left"),
    )
    d.panel(
        "table", "SLO tree (last judged window)",
        "Per node: its value in the last window (in its unit), the threshold in force and where it "
        "comes from, the learned baseline, compliance and the agent's burn rate.",
        [
            (f"max by (job_id, rank, node, state) (slo_probe_slo_state{{{PROC}}} == 1)", ""),
            (f"max by (job_id, rank, node, unit) (slo_probe_slo_value{{{PROC}}})", ""),
            (f"max by (job_id, rank, node, source) (slo_probe_slo_threshold{{{PROC}}})", ""),
            (f"max by (job_id, rank, node) (slo_probe_slo_baseline{{{PROC}}})", ""),
            (f"max by (job_id, rank, node) (slo_probe_slo_compliance_ratio{{{PROC}}})", ""),
            (f"max by (job_id, rank, node) (slo_probe_slo_burn_rate{{{PROC}}})", ""),
        ],
        w=24, h=10, instant=True,
        transformations=[
            {"id": "merge", "options": {}},
            {"id": "organize", "options": {
                "excludeByName": {"Time": True, "Value #A": True},
                "renameByName": {"Value #B": "value", "Value #C": "threshold",
                                 "Value #D": "baseline", "Value #E": "compliance",
                                 "Value #F": "burn rate"},
                "indexByName": {"job_id": 0, "rank": 1, "node": 2, "state": 3, "Value #B": 4,
                                "unit": 5, "Value #C": 6, "source": 7, "Value #D": 8,
                                "Value #E": 9, "Value #F": 10},
            }},
        ],
        overrides=[
            {"matcher": {"id": "byName", "options": "compliance"},
             "properties": [{"id": "unit", "value": "percentunit"}]},
            {"matcher": {"id": "byName", "options": "state"},
             "properties": [{"id": "custom.cellOptions", "value": {"type": "color-text"}},
                            {"id": "mappings", "value": [{"type": "value", "options": {
                                "ok": {"color": "green", "index": 0},
                                "breaching": {"color": "yellow", "index": 1},
                                "warning": {"color": "orange", "index": 2},
                                "critical": {"color": "red", "index": 3}}}]}]},
        ],
        options={"showHeader": True, "cellHeight": "sm",
                 "sortBy": [{"displayName": "node", "desc": False}]},
        defaults={"decimals": 3},
    )
    d.row("Compliance and error budget")
    d.panel(
        "timeseries", "Compliance by node",
        "Share of the node's judged windows (up to slo.compliance_windows) that met the threshold.",
        [(f"slo_probe_slo_compliance_ratio{{{PROC}}}", "rank {{rank}} {{node}}")],
        unit="percentunit", w=8, defaults={"min": 0, "max": 1},
    )
    d.panel(
        "timeseries", "Burn rate (agent, last slo.burn_windows windows)",
        "Share of the last slo.burn_windows windows that missed, over the error budget "
        "(1 - target). Above 1 the budget runs out before the compliance period ends.",
        [(f"slo_probe_slo_burn_rate{{{PROC}}}", "rank {{rank}} {{node}}")],
        w=8,
        defaults={"min": 0, "thresholds": thresholds(("green", None), ("red", 1))},
        custom={"thresholdsStyle": {"mode": "dashed"}},
    )
    d.panel(
        "timeseries", "Burn rate over 5 min (recording rule)",
        "slo_probe:slo_burn_rate5m, from collector-config/rules: the windows missed over the "
        "windows judged in the last 5 minutes, over the error budget; the input of the "
        "multi-window burn-rate alerts.",
        [(f"slo_probe:slo_burn_rate5m{{{PROC}}}", "rank {{rank}} {{node}}")],
        w=8,
        defaults={"min": 0, "thresholds": thresholds(("green", None), ("red", 1))},
        custom={"thresholdsStyle": {"mode": "dashed"}},
    )
    d.row("Iterations")
    d.panel(
        "timeseries", "Iteration time P50 / P99",
        "Iteration wall time over the agent's last 512 iterations, with the iteration node's P99 "
        "threshold (learned from the job's healthy windows unless set).",
        [
            (f"slo_probe_iteration_duration_seconds{{{PROC}}}", "rank {{rank}} q{{quantile}}"),
            (f'max by (job_id, rank) (slo_probe_slo_threshold{{{PROC},node="iteration"}}) / 1000',
             "rank {{rank}} P99 threshold"),
        ],
        unit="s", w=16,
        overrides=[{"matcher": {"id": "byRegexp", "options": ".*threshold"},
                    "properties": [{"id": "custom.lineStyle",
                                    "value": {"fill": "dash", "dash": [10, 10]}},
                                   {"id": "custom.fillOpacity", "value": 0}]}],
    )
    d.panel(
        "timeseries", "Iterations per second",
        "Training iterations completed per second (step markers, or detected).",
        [(f"sum by (job_id, rank) (rate(slo_probe_iterations_total{{{PROC}}}[{RI}]))",
          "rank {{rank}}")],
        unit="short", w=8,
    )
    d.row("Violations and attribution")
    d.panel(
        "table", "Top attributed operators in the time range",
        "For violations of iteration nodes open at any time in the range: the operators that made "
        "iterations slower, with the dimension (execution, occupancy, memory_bandwidth, "
        "launch_latency, communication, data_loading); the largest contribution per iteration seen.",
        [(f"topk(10, max by (node, op, dimension) "
          f"(max_over_time(slo_probe_attribution_seconds{{{PROC}}}[$__range])))", "")],
        unit="s", w=12, h=9, instant=True,
        transformations=[{"id": "organize", "options": {
            "excludeByName": {"Time": True},
            "renameByName": {"Value": "added per iteration"}}}],
        options={"showHeader": True, "cellHeight": "sm",
                 "sortBy": [{"displayName": "added per iteration", "desc": True}]},
    )
    d.panel(
        "timeseries", "Attribution of open violations",
        "While a violation is open: the top causes' contribution per iteration (cause_rank 1-5), "
        "by operator and dimension.",
        [(f'max by (node, op, dimension) (slo_probe_attribution_seconds{{{PROC},cause_rank=~"[1-5]"}})',
          "{{op}} ({{dimension}})")],
        unit="s", w=12, h=9,
        custom={"drawStyle": "points", "pointSize": 4, "showPoints": "always"},
    )
    healer(d)
    return d


HEAL_PHASES = ["watching", "diagnosing", "acting", "verifying", "kept", "rolled_back", "cooldown"]
HEAL_COLOURS = ["green", "yellow", "orange", "blue", "dark-green", "red", "text"]


def healer(d):
    """The healer's timeline (slo_probe_heal_*: per job pid, on the node's agent)."""
    d.row("Healer")
    phase = " or ".join(
        f'slo_probe_heal_state{{{INST},state="{p}"}} * {i + 1}' for i, p in enumerate(HEAL_PHASES)
    )
    d.panel(
        "state-timeline", "Healer phase by job",
        "The self-healing loop of each job (heal.mode shadow or on): watching, diagnosing, "
        "acting, verifying, kept, rolled back, cooldown. `slo-probe heal history` and the OTLP log "
        "records have every event behind it.",
        [(f"max by (pid) ({phase})", "job {{pid}}")],
        w=16, h=6,
        defaults={"mappings": [{"type": "value", "options": {
                      str(i + 1): {"text": p, "color": c, "index": i}
                      for i, (p, c) in enumerate(zip(HEAL_PHASES, HEAL_COLOURS))}}],
                  "color": {"mode": "thresholds"},
                  "thresholds": thresholds(*[(c, None if i == 0 else i + 1)
                                             for i, c in enumerate(HEAL_COLOURS)])},
        options=timeline_options(align="left"),
    )
    d.panel(
        "stat", "Healer actions in the last hour",
        "Actions per job in the last hour, against heal.max_actions_per_hour.",
        [(f"slo_probe_heal_actions_last_hour{{{INST}}}", "job {{pid}}")],
        w=8, h=6,
        options={"colorMode": "value", "graphMode": "area", "textMode": "value_and_name",
                 "reduceOptions": LAST_VALUE},
    )
    d.panel(
        "timeseries", "Healer decisions by strategy and outcome",
        "Verdicts per strategy in the range: kept, rolled_back, failed, skipped, shadow (what "
        "shadow mode would have done). Empty until the healer has decided something.",
        [(f"sum by (strategy, outcome) (increase(slo_probe_heal_actions_total{{{INST}}}[{RI}]))",
          "{{strategy}} {{outcome}}")],
        w=8, custom={"drawStyle": "bars", "fillOpacity": 60},
    )
    d.panel(
        "state-timeline", "Strategies in force",
        "Each strategy kept on a job, with its level and action id, while it is in force (until "
        "heal.hold_s of health releases it, or an undo). Empty while nothing is in force.",
        [(f"max by (pid, strategy, level) (slo_probe_heal_strategy_in_force{{{INST}}})",
          "job {{pid}} {{strategy}}/{{level}}")],
        w=8,
        options=timeline_options(),
    )
    d.panel(
        "timeseries", "Reward and Pareto hypervolume",
        "The tuner's reward of the latest measured window (seed §4.3: 0.4 latency + 0.35 "
        "throughput + 0.25 CPU headroom against the job's own baseline) and the hypervolume of "
        "the Pareto front of the strategies measured. Reward is empty until a window is measured.",
        [
            (f"slo_probe_heal_reward{{{INST}}}", "job {{pid}} reward"),
            (f"slo_probe_heal_hypervolume{{{INST}}}", "job {{pid}} hypervolume"),
        ],
        w=8, defaults={"min": 0},
    )


def gpu():
    d = Dashboard(
        "slo-probe-gpu",
        "slo-probe / GPU",
        "What the GPUs did (NVML and GPM samples of the agent) and what each training iteration "
        "spent its time on (CUPTI shim).",
    )
    d.row("Devices (NVML; GPM on Hopper and newer)")
    dev = "{{instance}} GPU {{gpu}}"
    d.panel(
        "timeseries", "GPU utilisation",
        "Fraction of the driver's sample period with one or more kernels running "
        "(NVML utilization.gpu; busy, not how busy).",
        [(f"slo_probe_gpu_utilization_ratio{{{INST}}}", dev)],
        unit="percentunit", w=8, defaults={"min": 0, "max": 1},
    )
    d.panel(
        "timeseries", "SM activity and occupancy (GPM)",
        "SM utilisation: share of time each SM had a warp assigned. Occupancy: resident warps over "
        "the theoretical maximum. Both averaged over SMs.",
        [
            (f"slo_probe_gpu_sm_utilization_ratio{{{INST}}}", dev + " SM active"),
            (f"slo_probe_gpu_sm_occupancy_ratio{{{INST}}}", dev + " occupancy"),
        ],
        unit="percentunit", w=8, defaults={"min": 0, "max": 1},
    )
    d.panel(
        "timeseries", "DRAM bandwidth (GPM)",
        "DRAM bandwidth used, as a fraction of peak.",
        [(f"slo_probe_gpu_dram_bandwidth_utilization_ratio{{{INST}}}", dev)],
        unit="percentunit", w=8, defaults={"min": 0, "max": 1},
    )
    d.panel(
        "timeseries", "Tensor cores and pipes (GPM)",
        "Share of time the SMs issued tensor-core instructions, and per pipe (pipes overlap: do "
        "not sum them).",
        [
            (f"slo_probe_gpu_tensor_utilization_ratio{{{INST}}}", dev + " any tensor"),
            (f"slo_probe_gpu_pipe_utilization_ratio{{{INST}}}", dev + " {{pipe}}"),
        ],
        unit="percentunit", w=8, defaults={"min": 0, "max": 1},
    )
    d.panel(
        "timeseries", "Power",
        "Power draw.",
        [(f"slo_probe_gpu_power_watts{{{INST}}}", dev)],
        unit="watt", w=8,
    )
    d.panel(
        "timeseries", "Clocks",
        "SM and memory clocks; an SM clock below its usual value under load means power or "
        "thermal capping.",
        [
            (f"slo_probe_gpu_sm_clock_hertz{{{INST}}}", dev + " SM"),
            (f"slo_probe_gpu_memory_clock_hertz{{{INST}}}", dev + " memory"),
        ],
        unit="hertz", w=8,
    )
    d.panel(
        "timeseries", "Device memory",
        "Device memory in use, and in total.",
        [
            (f"slo_probe_gpu_memory_used_bytes{{{INST}}}", dev + " used"),
            (f"slo_probe_gpu_memory_total_bytes{{{INST}}}", dev + " total"),
        ],
        unit="bytes", w=12, defaults={"min": 0},
        overrides=[{"matcher": {"id": "byRegexp", "options": ".* total"},
                    "properties": [{"id": "custom.lineStyle",
                                    "value": {"fill": "dash", "dash": [10, 10]}},
                                   {"id": "custom.fillOpacity", "value": 0}]}],
    )
    d.panel(
        "timeseries", "Memory activity",
        "Share of the driver's sample period with device memory being read or written "
        "(NVML utilization.memory; not capacity).",
        [(f"slo_probe_gpu_memory_utilization_ratio{{{INST}}}", dev)],
        unit="percentunit", w=12, defaults={"min": 0, "max": 1},
    )
    d.row("Iterations (CUPTI shim)")
    d.panel(
        "timeseries", "Time per iteration by phase, P50",
        "Median time per iteration in GPU compute, communication (NCCL kernels), memory "
        "operations, host_wait (GPU idle before the iteration's first activity: data loading, the "
        "host) and launch_gaps (GPU idle between activities), over the last 512 iterations.",
        [(f'slo_probe_iteration_phase_seconds{{{PROC},quantile="0.5"}}', "rank {{rank}} {{phase}}")],
        unit="s", w=12,
        custom={"stacking": {"mode": "normal", "group": "A"}, "fillOpacity": 40},
    )
    d.panel(
        "timeseries", "Time per iteration by phase, P99",
        "As on the left, the 99th percentile of each phase (not stacked: the P99s of the phases "
        "come from different iterations).",
        [(f'slo_probe_iteration_phase_seconds{{{PROC},quantile="0.99"}}', "rank {{rank}} {{phase}}")],
        unit="s", w=12,
    )
    d.panel(
        "timeseries", "GPU busy share of an iteration",
        "Median over the last 512 iterations of the share of the iteration's wall time with the "
        "GPU busy.",
        [(f"slo_probe_iteration_gpu_busy_ratio{{{PROC}}}", "rank {{rank}}")],
        unit="percentunit", w=12, defaults={"min": 0, "max": 1},
    )
    d.panel(
        "timeseries", "Kernel launch latency P50 / P99",
        "From the launch API call to the kernel's start on the GPU, over the last 512 iterations.",
        [(f"slo_probe_gpu_launch_latency_seconds{{{PROC}}}", "rank {{rank}} q{{quantile}}")],
        unit="s", w=12,
    )
    return d


def host():
    d = Dashboard(
        "slo-probe-host",
        "slo-probe / Host causes",
        "What the kernel did to the job's threads, by thread role (eBPF): run-queue latency, "
        "off-CPU time, cgroup throttling, TCP; communication jitter and stragglers across ranks.",
    )
    d.row("Run queue (runnable, waiting for a CPU)")
    d.panel(
        "timeseries", "Run-queue latency P99 by role",
        "99th percentile of the waits of the role's threads for a CPU, from the per-wait histogram "
        "(log2 buckets: the value is a bucket bound, accurate to a factor of 2).",
        [(f"histogram_quantile(0.99, sum by (instance, role, le) "
          f"(rate(slo_probe_runqueue_latency_seconds_bucket{{{INST}}}[{RI}])))",
          "{{instance}} {{role}}")],
        unit="s", w=12,
    )
    d.panel(
        "timeseries", "Run-queue wait per second by role",
        "Seconds the role's threads spent waiting for a CPU per second (2: two threads waiting all "
        "the time).",
        [(f"sum by (instance, role) (rate(slo_probe_runqueue_latency_seconds_sum{{{INST}}}[{RI}]))",
          "{{instance}} {{role}}")],
        unit="s", w=12,
    )
    d.row("Off CPU and CPU limits")
    d.panel(
        "timeseries", "Off-CPU time by role",
        "Seconds off CPU per second: voluntary (blocked or sleeping: I/O, locks, waiting for work) "
        "or involuntary (preempted).",
        [(f"sum by (instance, role, kind) (rate(slo_probe_offcpu_seconds_total{{{INST}}}[{RI}]))",
          "{{instance}} {{role}} {{kind}}")],
        unit="s", w=8,
    )
    d.panel(
        "timeseries", "cgroup CPU throttling",
        "Seconds per second the job's cgroups were throttled by their CPU quota (CFS bandwidth), "
        "with the roles of the threads in each cgroup.",
        [(f"sum by (instance, cgroup, roles) "
          f"(rate(slo_probe_cgroup_cpu_throttled_seconds_total{{{INST}}}[{RI}]))",
          "{{instance}} {{cgroup}} ({{roles}})")],
        unit="s", w=8,
    )
    d.panel(
        "timeseries", "CPU pressure (PSI)",
        "Seconds per second in which some (or all) runnable tasks of the node waited for a CPU.",
        [(f'sum by (instance, kind) (rate(slo_probe_pressure_stalled_seconds_total{{{INST},resource="cpu"}}[{RI}]))',
          "{{instance}} {{kind}}")],
        unit="s", w=8,
    )
    d.row("Network")
    d.panel(
        "timeseries", "TCP throughput by role",
        "TCP payload bytes per second sent and received by the role's threads.",
        [
            (f"sum by (instance, role) (rate(slo_probe_tcp_sent_bytes_total{{{INST}}}[{RI}]))",
             "{{instance}} {{role}} sent"),
            (f"sum by (instance, role) (rate(slo_probe_tcp_received_bytes_total{{{INST}}}[{RI}]))",
             "{{instance}} {{role}} received"),
        ],
        unit="Bps", w=12,
    )
    d.panel(
        "timeseries", "TCP retransmits by role",
        "Retransmitted segments per second on the connections the role's threads own (0 for roles "
        "that sent data without retransmitting).",
        [(f"sum by (instance, role) (rate(slo_probe_tcp_retransmits_total{{{INST}}}[{RI}])) "
          f"or sum by (instance, role) (rate(slo_probe_tcp_sent_bytes_total{{{INST}}}[{RI}])) * 0",
          "{{instance}} {{role}}")],
        unit="short", w=12, defaults={"min": 0},
    )
    d.row("Communication and stragglers")
    d.panel(
        "timeseries", "Communication jitter",
        "The communication node of the SLO tree: P99 - P50 of the time per iteration in "
        "communication kernels, per window, with its threshold.",
        [
            (f'slo_probe_slo_value{{{PROC},node="communication"}}', "rank {{rank}}"),
            (f'slo_probe_slo_threshold{{{PROC},node="communication"}}', "rank {{rank}} threshold"),
        ],
        unit="ms", w=12,
        overrides=[{"matcher": {"id": "byRegexp", "options": ".*threshold"},
                    "properties": [{"id": "custom.lineStyle",
                                    "value": {"fill": "dash", "dash": [10, 10]}},
                                   {"id": "custom.fillOpacity", "value": 0}]}],
    )
    d.panel(
        "timeseries", "Host wait per iteration by rank",
        "Median GPU idle time before each iteration's first activity. In synchronous data-parallel "
        "training the straggler rank has the most: the others wait for it inside the all-reduce.",
        [(f'slo_probe_iteration_phase_seconds{{{PROC},phase="host_wait",quantile="0.5"}}',
          "{{instance}} rank {{rank}}")],
        unit="s", w=12,
    )
    d.panel(
        "timeseries", "Straggler score by rank (recording rule)",
        "slo_probe:straggler_score:ratio, from collector-config/rules: how far a rank lags the "
        "job's other ranks.",
        [('slo_probe:straggler_score:ratio{job_id=~"$job_id",rank=~"$rank"}',
          "{{job_id}} rank {{rank}}")],
        unit="short", w=12,
    )
    d.panel(
        "timeseries", "Worst straggler score per job (recording rule)",
        "slo_probe:job_straggler_score:max: the largest straggler score among the job's ranks.",
        [('slo_probe:job_straggler_score:max{job_id=~"$job_id"}', "{{job_id}}")],
        unit="short", w=12,
    )
    d.panel(
        "timeseries", "Host straggler score by rank (recording rule)",
        "slo_probe:host_straggler_score:ratio: a rank's CPU waits (run queue of its main, loader "
        "and communication threads, cgroup throttling) against the job's best rank; the straggler "
        "with a host cause stands out here whatever the collective (gloo included).",
        [('slo_probe:host_straggler_score:ratio{job_id=~"$job_id",rank=~"$rank"}',
          "{{job_id}} rank {{rank}}"),
         ('slo_probe:rank_host_delay_ms_per_s{job_id=~"$job_id",rank=~"$rank"}',
          "{{job_id}} rank {{rank}} delay ms/s")],
        unit="short", w=12,
    )
    return d


def agent():
    d = Dashboard(
        "slo-probe-agent",
        "slo-probe / Agent",
        "The agent's own health: its CPU and memory, probes, event drops, CUPTI shims and the "
        "records they deliver.",
    )
    d.row("Agent")
    d.panel(
        "timeseries", "Agent CPU",
        "CPU the agent used, in cores (user + system).",
        [(f"rate(slo_probe_agent_cpu_seconds_total{{{INST}}}[{RI}])", "{{instance}}")],
        unit="short", w=8, defaults={"min": 0},
    )
    d.panel(
        "timeseries", "Agent resident memory",
        "The agent's resident set size.",
        [(f"slo_probe_agent_resident_memory_bytes{{{INST}}}", "{{instance}}")],
        unit="bytes", w=8, defaults={"min": 0},
    )
    d.panel(
        "timeseries", "Ticks and samples per scrape",
        "Agent ticks per second (agent.tick_ms) and samples per scrape (the agent's series "
        "count: per-thread series are the larger share).",
        [
            (f"rate(slo_probe_agent_ticks_total{{{INST}}}[{RI}])", "{{instance}} ticks/s"),
            (f"scrape_samples_scraped{{{INST}}}", "{{instance}} samples"),
        ],
        unit="short", w=8,
        overrides=[{"matcher": {"id": "byRegexp", "options": ".*samples"},
                    "properties": [{"id": "custom.axisPlacement", "value": "right"}]}],
    )
    d.panel(
        "table", "Probes",
        "Whether each probe family is attached (1) or down (0), and why.",
        [(f"max by (instance, probe, reason) (slo_probe_probe_up{{{INST}}})", "")],
        w=12, h=7, instant=True,
        transformations=[{"id": "organize", "options": {
            "excludeByName": {"Time": True}, "renameByName": {"Value": "up"}}}],
        overrides=[{"matcher": {"id": "byName", "options": "up"},
                    "properties": [{"id": "custom.cellOptions", "value": {"type": "color-background"}},
                                   {"id": "thresholds",
                                    "value": thresholds(("red", None), ("green", 1))}]}],
        options={"showHeader": True, "cellHeight": "sm"},
    )
    d.panel(
        "table", "CUPTI shims",
        "Training processes whose shim registered, and the states that are on: connected, "
        "tracing, lost_race (another CUPTI subscriber was first), diagnostic.",
        [(f"max by (instance, job_id, rank, pid, state) (slo_probe_shim_state{{{PROC}}} == 1)", "")],
        w=12, h=7, instant=True,
        transformations=[{"id": "organize", "options": {"excludeByName": {"Time": True, "Value": True}}}],
        options={"showHeader": True, "cellHeight": "sm"},
    )
    d.row("Records and drops")
    d.panel(
        "timeseries", "eBPF events dropped and errors",
        "Events the probes dropped instead of blocking (ring buffer full, a map full), and read or "
        "decode errors, per second. Anything above 0 means missing data.",
        [
            (f"sum by (instance, reason) (rate(slo_probe_ebpf_events_dropped_total{{{INST}}}[{RI}]))",
             "{{instance}} dropped {{reason}}"),
            (f"sum by (instance, reason) (rate(slo_probe_ebpf_errors_total{{{INST}}}[{RI}]))",
             "{{instance}} error {{reason}}"),
        ],
        unit="short", w=8, defaults={"min": 0},
    )
    d.panel(
        "timeseries", "GPU records from the shims",
        "GPU records consumed per second from the CUPTI shims, by kind, and the eBPF outlier "
        "records.",
        [
            (f"sum by (instance, job_id, rank, kind) (rate(slo_probe_shim_records_total{{{PROC}}}[{RI}]))",
             "{{instance}} rank {{rank}} {{kind}}"),
            (f"sum by (instance, kind) (rate(slo_probe_ebpf_records_total{{{INST}}}[{RI}]))",
             "{{instance}} eBPF {{kind}}"),
        ],
        unit="short", w=8, defaults={"min": 0},
    )
    d.panel(
        "timeseries", "Shim records lost",
        "GPU records lost per second: ring_full (the shim dropped rather than block the job), "
        "cupti (CUPTI's buffers overflowed), strings_full; and activities counted under "
        "\"(other operators)\" past 4096 operators.",
        [
            (f"sum by (instance, job_id, rank, reason) "
             f"(rate(slo_probe_shim_dropped_records_total{{{PROC}}}[{RI}]))",
             "{{instance}} rank {{rank}} {{reason}}"),
            (f"sum by (instance, job_id, rank) "
             f"(rate(slo_probe_shim_operators_overflowed_total{{{PROC}}}[{RI}]))",
             "{{instance}} rank {{rank}} operators overflowed"),
        ],
        unit="short", w=8, defaults={"min": 0},
    )
    return d


def main():
    here = pathlib.Path(__file__).resolve().parent
    for d in (slo(), gpu(), host(), agent()):
        path = here / f"{d.uid}.json"
        path.write_text(json.dumps(d.json(), indent=2) + "\n")
        print(f"wrote {path.name}: {sum(1 for p in d.panels if p['type'] != 'row')} panels")


if __name__ == "__main__":
    main()
