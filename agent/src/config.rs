//! The agent's TOML configuration: what runs (probes, exporters) and their settings. Flags set
//! runtime knobs and override the file. Unknown keys are errors, so a typo is not silently
//! ignored.

use std::{net::SocketAddr, path::Path, time::Duration};

use serde::{Deserialize, Serialize};
use slo_probe_core::{healer as core_healer, roles};

/// The documented default configuration, shipped as `agent/slo-probe.toml`.
pub const DEFAULT_TOML: &str = include_str!("../slo-probe.toml");

/// Default tick, ms.
pub const DEFAULT_TICK_MS: u64 = 1000;
/// Default retention of exited threads and processes, s.
pub const DEFAULT_RETENTION_S: u64 = 300;
/// Default Prometheus listen address.
pub const DEFAULT_PROMETHEUS_LISTEN: &str = "127.0.0.1:9617";
/// Default outlier threshold, µs.
pub const DEFAULT_OUTLIER_THRESHOLD_US: u64 = 10_000;
/// Default capacity of the per-thread map.
pub const DEFAULT_MAX_THREADS: u32 = 16_384;
/// Default ring buffer size, KiB.
pub const DEFAULT_RING_BUFFER_KIB: u32 = 256;
/// Default capacity of the connection map.
pub const DEFAULT_MAX_CONNS: u32 = 4096;
/// Default number of connections exported one by one.
pub const DEFAULT_EXPORTED_CONNS: usize = 256;

/// Errors reading or validating a configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}")]
    Read {
        /// The path.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid TOML for this schema.
    #[error("invalid config file {path}: {source}")]
    Parse {
        /// The path.
        path: String,
        /// What TOML or serde said (line, column, key).
        source: toml::de::Error,
    },
    /// A value is out of its range.
    #[error("invalid config: {key} = {value}: {why}")]
    Invalid {
        /// The key, dotted.
        key: &'static str,
        /// The value given.
        value: String,
        /// The allowed range.
        why: &'static str,
    },
    /// The `[slo]` section does not make a tree.
    #[error("invalid config: [slo]: {0}")]
    Slo(#[from] slo_probe_core::slo::SloSpecError),
    /// The `[heal]` section is out of range or its policy table is invalid.
    #[error("invalid config: heal.{0}")]
    Heal(#[from] slo_probe_core::healer::HealerConfigError),
}

/// Where kubelet keeps its CPU manager's state (the healer leaves cpusets alone under a static
/// policy).
pub const KUBELET_CPU_MANAGER_STATE: &str = "/var/lib/kubelet/cpu_manager_state";

/// Whether `endpoint` is an OTLP endpoint this build can send to: an `http://` URL with a host
/// (`https://` needs TLS, which is not compiled in); `Err` says why not.
pub fn check_otlp_endpoint(endpoint: &str) -> Result<(), &'static str> {
    if endpoint.starts_with("https://") {
        return Err(
            "https:// needs TLS, which this build of slo-probe does not include; send \
             plain http:// to an OpenTelemetry Collector on this node or in this pod and let it \
             forward over TLS",
        );
    }
    let uri: hyper::Uri = endpoint
        .parse()
        .map_err(|_| "must be an http:// URL, e.g. \"http://otel-collector:4317\"")?;
    if uri.scheme_str() != Some("http") || uri.host().is_none_or(str::is_empty) {
        return Err("must be an http:// URL with a host, e.g. \"http://otel-collector:4317\"");
    }
    let host_port = uri
        .authority()
        .map_or("", |a| a.as_str().rsplit('@').next().unwrap_or(""));
    let port = match host_port.strip_prefix('[') {
        Some(rest) => rest.split_once(']').and_then(|(_, p)| p.strip_prefix(':')),
        None => host_port.split_once(':').map(|(_, p)| p),
    };
    if port.is_some_and(|p| p.parse::<u16>().is_err()) {
        return Err("has a port that is not 1..=65535");
    }
    Ok(())
}

/// The whole configuration.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// `[agent]`.
    pub agent: AgentConfig,
    /// `[target]`.
    pub target: TargetConfig,
    /// `[prometheus]`.
    pub prometheus: PrometheusConfig,
    /// `[api]`: the state API on the Prometheus listener.
    pub api: ApiConfig,
    /// `[probes]`.
    pub probes: ProbesConfig,
    /// `[shim]`.
    pub shim: ShimConfig,
    /// `[gpu]`.
    pub gpu: GpuConfig,
    /// `[otlp]`: OTLP push.
    pub otlp: OtlpConfig,
    /// `[slo]`: the SLO tree, its windows and detection (the seed's tree when no node is
    /// given).
    pub slo: slo_probe_core::slo::SloSpec,
    /// `[roles]`.
    pub roles: RolesConfig,
    /// `[heal]`: the self-healing loop.
    pub heal: HealConfig,
}

/// Default `heal.journal`.
pub const DEFAULT_HEAL_JOURNAL: &str = "/var/lib/slo-probe/heal.jsonl";
/// Default `heal.jobs_dir`.
pub const DEFAULT_HEAL_JOBS_DIR: &str = "/run/slo-probe/jobs";

/// `heal.mode`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HealMode {
    /// No healing loop (the journal is still restored at start).
    Off,
    /// Decide and record what would be done; never write a knob.
    #[default]
    Shadow,
    /// Act.
    On,
}

impl HealMode {
    /// `off`, `shadow` or `on`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::Shadow => "shadow",
            Self::On => "on",
        }
    }
}

/// `[heal]`: the self-healing loop (DESIGN decision 9). Defaults of the decision parameters
/// are `slo_probe_core::healer`'s `DEFAULT_*` constants.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HealConfig {
    /// `off`, `shadow` or `on`. Default `shadow`.
    pub mode: HealMode,
    /// The journal of every action and prior value (JSONL, fsync'd). Default
    /// [`DEFAULT_HEAL_JOURNAL`].
    pub journal: std::path::PathBuf,
    /// Where each job's strategy channel lives (`<dir>/<pid>/strategy.json`). Default
    /// [`DEFAULT_HEAL_JOBS_DIR`].
    pub jobs_dir: std::path::PathBuf,
    /// Neighbour cgroups the healer may demote: paths as /proc/<pid>/cgroup shows them, or
    /// prefixes ending in `*`. Default empty (no neighbour is touched).
    pub neighbors: Vec<String>,
    /// kubelet's CPU manager state, to leave pods' cpusets to a static policy. Default
    /// [`KUBELET_CPU_MANAGER_STATE`].
    pub kubelet_cpu_manager_state: std::path::PathBuf,
    /// Strategies the healer may choose. Default all but `fcfs-gpu` (always an arm).
    pub enabled: Vec<slo_probe_core::healer::Strategy>,
    /// Pause after every verdict, s. Default [`core_healer::DEFAULT_JOB_COOLDOWN_S`].
    pub job_cooldown_s: f64,
    /// Cooldown of a strategy after it was rolled back, failed, skipped or released, s. Default
    /// [`core_healer::DEFAULT_STRATEGY_COOLDOWN_S`].
    pub strategy_cooldown_s: f64,
    /// Actions per job and hour at most. Default [`core_healer::DEFAULT_MAX_ACTIONS_PER_HOUR`].
    pub max_actions_per_hour: u32,
    /// A kept strategy is released after the job has been healthy this long, s (0: never).
    /// Default [`core_healer::DEFAULT_HOLD_S`].
    pub hold_s: f64,
    /// The healer must have followed a job this long before its baseline counts and it acts,
    /// s. Default [`core_healer::DEFAULT_LEARN_S`].
    pub learn_s: f64,
    /// Iterations per block. Default [`core_healer::DEFAULT_BLOCK_ITERATIONS`].
    pub block_iterations: u32,
    /// Blocks on each side of the final comparison. Default [`core_healer::DEFAULT_VERIFY_BLOCKS`].
    pub verify_blocks: u32,
    /// Blocks after an action before the early-rollback check. Default
    /// [`core_healer::DEFAULT_EARLY_BLOCKS`].
    pub early_blocks: u32,
    /// Iterations skipped after an action. Default [`core_healer::DEFAULT_SETTLE_ITERATIONS`].
    pub settle_iterations: u32,
    /// Significance of both stages. Default [`core_healer::DEFAULT_ALPHA`].
    pub alpha: f64,
    /// Smallest relative improvement that keeps an action. Default
    /// [`core_healer::DEFAULT_MIN_EFFECT`].
    pub min_effect: f64,
    /// Smallest relative worsening that rolls back early. Default
    /// [`core_healer::DEFAULT_EARLY_MIN_EFFECT`].
    pub early_min_effect: f64,
    /// Another guarded SLO node worse by more than this fraction rolls back. Default
    /// [`core_healer::DEFAULT_SIDE_EFFECT_BUDGET`].
    pub side_effect_budget: f64,
    /// Longest wait for the after window, s. Default [`core_healer::DEFAULT_VERIFY_TIMEOUT_S`].
    pub verify_timeout_s: f64,
    /// Longest wait for an actuator, s. Default [`core_healer::DEFAULT_ACT_TIMEOUT_S`].
    pub act_timeout_s: f64,
    /// Discount of the tuner's posteriors per update. Default [`core_healer::DEFAULT_DISCOUNT`].
    pub discount: f64,
    /// Seed of the tuner's RNG (each job's pid is mixed in). Default 0.
    pub seed: u64,
    /// Reward weight of the latency term (seed §4.3). Default 0.4.
    pub reward_latency: f64,
    /// Reward weight of the throughput term. Default 0.35.
    pub reward_throughput: f64,
    /// Reward weight of the CPU-headroom term. Default 0.25.
    pub reward_cpu: f64,
    /// GPU utilisation may fall this fraction below the baseline (else the window is
    /// infeasible). Default 0.05.
    pub gpu_util_drop: f64,
    /// Gradient-sync jitter may rise this fraction above its baseline. Default 0.5.
    pub jitter_rise: f64,
    /// The decision table, first match wins; empty: the default table
    /// (`slo_probe_core::healer::policy::default_rules`). Default empty.
    pub policy: Vec<slo_probe_core::healer::policy::PolicyRule>,
}

impl Default for HealConfig {
    fn default() -> Self {
        let c = core_healer::HealerConfig::default();
        Self {
            mode: HealMode::Shadow,
            journal: DEFAULT_HEAL_JOURNAL.into(),
            jobs_dir: DEFAULT_HEAL_JOBS_DIR.into(),
            neighbors: Vec::new(),
            kubelet_cpu_manager_state: KUBELET_CPU_MANAGER_STATE.into(),
            enabled: c.enabled,
            job_cooldown_s: c.job_cooldown_s,
            strategy_cooldown_s: c.strategy_cooldown_s,
            max_actions_per_hour: c.max_actions_per_hour,
            hold_s: c.hold_s,
            learn_s: c.learn_s,
            block_iterations: c.block_iterations,
            verify_blocks: c.verify_blocks,
            early_blocks: c.early_blocks,
            settle_iterations: c.settle_iterations,
            alpha: c.alpha,
            min_effect: c.min_effect,
            early_min_effect: c.early_min_effect,
            side_effect_budget: c.side_effect_budget,
            verify_timeout_s: c.verify_timeout_s,
            act_timeout_s: c.act_timeout_s,
            discount: c.discount,
            seed: c.seed,
            reward_latency: c.weights.latency,
            reward_throughput: c.weights.throughput,
            reward_cpu: c.weights.cpu,
            gpu_util_drop: c.constraints.gpu_util_drop,
            jitter_rise: c.constraints.jitter_rise,
            policy: Vec::new(),
        }
    }
}

impl HealConfig {
    /// The core healer's settings.
    pub fn healer_config(&self) -> core_healer::HealerConfig {
        core_healer::HealerConfig {
            enabled: self.enabled.clone(),
            policy: if self.policy.is_empty() {
                core_healer::policy::default_rules()
            } else {
                self.policy.clone()
            },
            block_iterations: self.block_iterations,
            verify_blocks: self.verify_blocks,
            early_blocks: self.early_blocks,
            settle_iterations: self.settle_iterations,
            alpha: self.alpha,
            min_effect: self.min_effect,
            early_min_effect: self.early_min_effect,
            side_effect_budget: self.side_effect_budget,
            job_cooldown_s: self.job_cooldown_s,
            strategy_cooldown_s: self.strategy_cooldown_s,
            max_actions_per_hour: self.max_actions_per_hour,
            verify_timeout_s: self.verify_timeout_s,
            act_timeout_s: self.act_timeout_s,
            hold_s: self.hold_s,
            learn_s: self.learn_s,
            discount: self.discount,
            weights: core_healer::tuner::RewardWeights {
                latency: self.reward_latency,
                throughput: self.reward_throughput,
                cpu: self.reward_cpu,
            },
            constraints: core_healer::tuner::Constraints {
                gpu_util_drop: self.gpu_util_drop,
                jitter_rise: self.jitter_rise,
                jitter_slo_ms: None,
            },
            seed: self.seed,
            timeline: core_healer::DEFAULT_TIMELINE,
        }
    }
}

/// `[shim]`: the CUPTI shims' socket.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ShimConfig {
    /// Accept shims. Default true.
    pub enabled: bool,
    /// Socket path. Default [`crate::sources::shim::DEFAULT_SOCKET`].
    pub socket: std::path::PathBuf,
    /// Extra uids allowed to connect. Default empty.
    pub allowed_uids: Vec<u32>,
    /// Library `observe` injects; empty: next to the binary. Default empty.
    pub library: std::path::PathBuf,
    /// Where to record GPU records; empty: off. Default empty.
    pub record_dir: std::path::PathBuf,
    /// Ask a process's shim for kernel (or graph-node) depth while its SLO tree breaches, and
    /// lower it again after. Off: the shims keep their own duty cycle (an overhead benchmark
    /// whose conditions would read as breaches). Default true.
    pub depth_on_demand: bool,
}

impl Default for ShimConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            socket: crate::sources::shim::DEFAULT_SOCKET.into(),
            allowed_uids: Vec::new(),
            library: std::path::PathBuf::new(),
            record_dir: std::path::PathBuf::new(),
            depth_on_demand: true,
        }
    }
}

impl ShimConfig {
    /// The shim library to inject: the configured one, else `libslo_probe_cupti.so` next to
    /// the running binary.
    pub fn library_path(&self) -> Option<std::path::PathBuf> {
        if !self.library.as_os_str().is_empty() {
            return Some(self.library.clone());
        }
        let exe = std::env::current_exe().ok()?;
        let lib = exe.parent()?.join("libslo_probe_cupti.so");
        lib.exists().then_some(lib)
    }
}

/// `[gpu]`: NVML sampling.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GpuConfig {
    /// Sample NVML (and GPM) when a driver is there. Default true.
    pub nvml: bool,
    /// Sampling period in ms (100..=60000). Default [`DEFAULT_GPU_SAMPLE_MS`].
    pub sample_ms: u64,
}

/// Default NVML sampling period, ms.
pub const DEFAULT_GPU_SAMPLE_MS: u64 = 200;

impl Default for GpuConfig {
    fn default() -> Self {
        Self {
            nvml: true,
            sample_ms: DEFAULT_GPU_SAMPLE_MS,
        }
    }
}

/// `[otlp]`: OTLP push to a collector. The standard `OTEL_EXPORTER_OTLP_*` variables apply
/// where a key here is left empty: the exporter resolves them
/// (`crate::exporters::otlp::Settings`); this is plain data.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OtlpConfig {
    /// Push or not; unset: on when an OTLP endpoint is given here or in
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` (or its `_METRICS_`/`_TRACES_` variants).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// `grpc` or `http/protobuf`; empty: `OTEL_EXPORTER_OTLP_PROTOCOL`, then `grpc`.
    pub protocol: String,
    /// Base endpoint, e.g. `http://collector:4317`; empty: the environment's, then
    /// localhost:4317 (gRPC) or :4318 (HTTP).
    pub endpoint: String,
    /// Metric export period in ms; 0: `OTEL_METRIC_EXPORT_INTERVAL`, then 10000.
    pub interval_ms: u64,
    /// Export timeout in ms; 0: `OTEL_EXPORTER_OTLP_TIMEOUT`, then 10000.
    pub timeout_ms: u64,
    /// Send SLO violations as traces. Default true.
    pub traces: bool,
    /// Send the healer's decisions and actions as log records. Default true.
    pub logs: bool,
}

/// The OTLP transports `otlp.protocol` (and `OTEL_EXPORTER_OTLP_PROTOCOL`) may name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OtlpProtocol {
    /// gRPC (port 4317).
    Grpc,
    /// HTTP with protobuf bodies (port 4318, `/v1/metrics`, `/v1/traces`, `/v1/logs`).
    HttpProtobuf,
}

impl OtlpProtocol {
    /// Parses `grpc` or `http/protobuf` (`http` too), any case.
    pub fn parse(s: &str) -> Option<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "grpc" => Some(Self::Grpc),
            "http/protobuf" | "http" => Some(Self::HttpProtobuf),
            _ => None,
        }
    }
}

impl Default for OtlpConfig {
    fn default() -> Self {
        Self {
            enabled: None,
            protocol: String::new(),
            endpoint: String::new(),
            interval_ms: 0,
            timeout_ms: 0,
            traces: true,
            logs: true,
        }
    }
}

/// `[target]`: the job to follow.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TargetConfig {
    /// Root processes of the job. Default empty (with `cgroups` empty: the whole node).
    pub pids: Vec<u32>,
    /// cgroups whose processes are part of the job. Default empty.
    pub cgroups: Vec<String>,
}

impl TargetConfig {
    /// Whether a job is named (else the whole node is followed).
    pub fn is_set(&self) -> bool {
        !self.pids.is_empty() || !self.cgroups.is_empty()
    }
}

/// `[roles]`: thread-name patterns per role.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RolesConfig {
    /// Default [`roles::DEFAULT_DATA_LOADER`].
    pub data_loader: Vec<String>,
    /// Default [`roles::DEFAULT_COMMUNICATION`].
    pub communication: Vec<String>,
    /// Default [`roles::DEFAULT_PIN_MEMORY`].
    pub pin_memory: Vec<String>,
    /// Default [`roles::DEFAULT_MAIN`].
    pub main: Vec<String>,
}

impl Default for RolesConfig {
    fn default() -> Self {
        let v = |s: &[&str]| s.iter().map(|p| (*p).to_owned()).collect();
        Self {
            data_loader: v(roles::DEFAULT_DATA_LOADER),
            communication: v(roles::DEFAULT_COMMUNICATION),
            pin_memory: v(roles::DEFAULT_PIN_MEMORY),
            main: v(roles::DEFAULT_MAIN),
        }
    }
}

impl RolesConfig {
    /// The rules the core applies.
    pub fn rules(&self) -> roles::RoleRules {
        let p = |v: &[String]| v.iter().map(|s| roles::Pattern::new(s)).collect();
        roles::RoleRules {
            data_loader: p(&self.data_loader),
            communication: p(&self.communication),
            pin_memory: p(&self.pin_memory),
            main: p(&self.main),
        }
    }
}

/// `[agent]`: the main loop.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AgentConfig {
    /// Read-and-publish period in ms. Default [`DEFAULT_TICK_MS`].
    pub tick_ms: u64,
    /// How long exited threads and processes stay exported, s. Default [`DEFAULT_RETENTION_S`].
    pub retention_s: u64,
}

impl Default for AgentConfig {
    fn default() -> Self {
        Self {
            tick_ms: DEFAULT_TICK_MS,
            retention_s: DEFAULT_RETENTION_S,
        }
    }
}

/// `[prometheus]`: the embedded text endpoint.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PrometheusConfig {
    /// Serve `/metrics`. Default true.
    pub enabled: bool,
    /// Listen address. Default [`DEFAULT_PROMETHEUS_LISTEN`].
    pub listen: SocketAddr,
    /// Export per-thread histograms too. Default true.
    pub per_thread: bool,
    /// Connections exported one by one. Default [`DEFAULT_EXPORTED_CONNS`].
    pub max_connections: usize,
}

impl Default for PrometheusConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            listen: DEFAULT_PROMETHEUS_LISTEN
                .parse()
                .unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 9617))),
            per_thread: true,
            max_connections: DEFAULT_EXPORTED_CONNS,
        }
    }
}

/// Default of `api.allow_writes`: the write endpoints are off.
pub const DEFAULT_API_ALLOW_WRITES: bool = false;

/// `[api]`: the state API (`/api/v1/snapshot`, `/api/v1/watch`), served on the Prometheus
/// listener.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ApiConfig {
    /// Allow the write endpoints (`POST /api/v1/diagnostic`, `POST /api/v1/heal/undo`); they
    /// answer 403 otherwise. Default [`DEFAULT_API_ALLOW_WRITES`].
    pub allow_writes: bool,
}

impl Default for ApiConfig {
    fn default() -> Self {
        Self {
            allow_writes: DEFAULT_API_ALLOW_WRITES,
        }
    }
}

/// `[probes]`: the eBPF probe families.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProbesConfig {
    /// `[probes.runqueue]`.
    pub runqueue: RunqueueConfig,
    /// `[probes.tcp]`.
    pub tcp: TcpConfig,
    /// `[probes.cgroup]`.
    pub cgroup: CgroupConfig,
}

/// `[probes.tcp]`: TCP per thread and connection.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TcpConfig {
    /// Attach the TCP probes. Default true.
    pub enabled: bool,
    /// Connection map capacity. Default [`DEFAULT_MAX_CONNS`].
    pub max_connections: u32,
}

impl Default for TcpConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            max_connections: DEFAULT_MAX_CONNS,
        }
    }
}

/// `[probes.cgroup]`: cgroup CPU throttling and PSI.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CgroupConfig {
    /// Read them. Default true.
    pub enabled: bool,
}

impl Default for CgroupConfig {
    fn default() -> Self {
        Self { enabled: true }
    }
}

/// `[probes.runqueue]`: the scheduling probes (run-queue latency, off-CPU time, process tree).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RunqueueConfig {
    /// Attach the scheduling probes (false: no eBPF at all, as `--no-ebpf`). Default true.
    pub enabled: bool,
    /// Outlier threshold, µs. Default [`DEFAULT_OUTLIER_THRESHOLD_US`].
    pub outlier_threshold_us: u64,
    /// Per-thread map capacity. Default [`DEFAULT_MAX_THREADS`].
    pub max_threads: u32,
    /// Outlier ring size, KiB. Default [`DEFAULT_RING_BUFFER_KIB`].
    pub ring_buffer_kib: u32,
}

impl Default for RunqueueConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            outlier_threshold_us: DEFAULT_OUTLIER_THRESHOLD_US,
            max_threads: DEFAULT_MAX_THREADS,
            ring_buffer_kib: DEFAULT_RING_BUFFER_KIB,
        }
    }
}

impl Config {
    /// Reads and validates a config file.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_toml(&text, &path.display().to_string())
    }

    /// Parses and validates TOML; `origin` names it in errors.
    pub fn from_toml(text: &str, origin: &str) -> Result<Self, ConfigError> {
        let config: Self = toml::from_str(text).map_err(|source| ConfigError::Parse {
            path: origin.to_owned(),
            source,
        })?;
        config.validate()?;
        Ok(config)
    }

    /// Checks ranges that the types do not.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |key, value: &dyn ToString, why| ConfigError::Invalid {
            key,
            value: crate::clip(&value.to_string()),
            why,
        };
        if !(100..=60_000).contains(&self.agent.tick_ms) {
            return Err(invalid(
                "agent.tick_ms",
                &self.agent.tick_ms,
                "must be 100..=60000 ms",
            ));
        }
        if !(100..=60_000).contains(&self.gpu.sample_ms) {
            return Err(invalid(
                "gpu.sample_ms",
                &self.gpu.sample_ms,
                "must be 100..=60000 ms (GPM needs at least 100 ms between samples)",
            ));
        }
        self.slo.validate()?;
        if !self.otlp.protocol.is_empty() && OtlpProtocol::parse(&self.otlp.protocol).is_none() {
            return Err(invalid(
                "otlp.protocol",
                &self.otlp.protocol,
                "must be \"grpc\" or \"http/protobuf\"",
            ));
        }
        if !self.otlp.endpoint.is_empty() {
            check_otlp_endpoint(&self.otlp.endpoint)
                .map_err(|why| invalid("otlp.endpoint", &self.otlp.endpoint, why))?;
        }
        if self.otlp.interval_ms != 0 && !(100..=3_600_000).contains(&self.otlp.interval_ms) {
            return Err(invalid(
                "otlp.interval_ms",
                &self.otlp.interval_ms,
                "must be 0 (the environment's) or 100..=3600000 ms",
            ));
        }
        let rq = &self.probes.runqueue;
        if rq.max_threads == 0 || rq.max_threads > 1 << 22 {
            return Err(invalid(
                "probes.runqueue.max_threads",
                &rq.max_threads,
                "must be 1..=4194304",
            ));
        }
        if !rq.ring_buffer_kib.is_power_of_two() || !(4..=1 << 20).contains(&rq.ring_buffer_kib) {
            return Err(invalid(
                "probes.runqueue.ring_buffer_kib",
                &rq.ring_buffer_kib,
                "must be a power of two from 4 to 1048576",
            ));
        }
        let tcp = &self.probes.tcp;
        if tcp.max_connections == 0 || tcp.max_connections > 1 << 22 {
            return Err(invalid(
                "probes.tcp.max_connections",
                &tcp.max_connections,
                "must be 1..=4194304",
            ));
        }
        for (key, patterns) in [
            ("roles.data_loader", &self.roles.data_loader),
            ("roles.communication", &self.roles.communication),
            ("roles.pin_memory", &self.roles.pin_memory),
            ("roles.main", &self.roles.main),
        ] {
            if let Some(p) = patterns.iter().find(|p| p.is_empty() || p.len() > 64) {
                return Err(invalid(key, p, "patterns must be 1 to 64 characters"));
            }
        }
        self.heal.healer_config().validate()?;
        for c in &self.heal.neighbors {
            if !c.starts_with('/') || c == "/" || c == "/*" {
                return Err(invalid(
                    "heal.neighbors",
                    c,
                    "must be cgroup paths as /proc/<pid>/cgroup shows them (or prefixes ending in \
                     *), below the root",
                ));
            }
        }
        if self.heal.reward_latency + self.heal.reward_throughput + self.heal.reward_cpu <= 0.0 {
            return Err(invalid(
                "heal.reward_latency",
                &self.heal.reward_latency,
                "the three reward weights must sum to more than 0",
            ));
        }
        for c in &self.target.cgroups {
            if !c.starts_with('/') {
                return Err(invalid(
                    "target.cgroups",
                    c,
                    "must be a path as /proc/<pid>/cgroup shows it, starting with /",
                ));
            }
        }
        Ok(())
    }

    /// The tick period.
    pub fn tick(&self) -> Duration {
        Duration::from_millis(self.agent.tick_ms)
    }

    /// Retention in ticks (at least one).
    pub fn retention_ticks(&self) -> u64 {
        (self.agent.retention_s * 1000 / self.agent.tick_ms).max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_file_is_the_default() {
        let parsed = Config::from_toml(DEFAULT_TOML, "slo-probe.toml").expect("shipped config");
        assert_eq!(parsed, Config::default());
    }

    /// Every field of the schema appears in the shipped file, so that it documents all of them
    /// (a new field without a line there fails here).
    #[test]
    fn shipped_file_lists_every_key() {
        fn keys(prefix: &str, v: &toml::Value, out: &mut Vec<String>) {
            if let toml::Value::Table(t) = v {
                for (k, v) in t {
                    let path = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    keys(&path, v, out);
                    out.push(path);
                }
            }
        }
        let mut from_default = Vec::new();
        keys(
            "",
            &toml::Value::try_from(Config::default()).expect("serialize"),
            &mut from_default,
        );
        let mut from_file = Vec::new();
        keys(
            "",
            &toml::from_str::<toml::Value>(DEFAULT_TOML).expect("toml"),
            &mut from_file,
        );
        from_default.sort();
        from_file.sort();
        assert_eq!(from_default, from_file);
    }

    #[test]
    fn otlp_settings_are_checked() {
        for (text, key) in [
            ("[otlp]\nprotocol = \"http/json\"\n", "otlp.protocol"),
            ("[otlp]\nendpoint = \"collector:4317\"\n", "otlp.endpoint"),
            ("[otlp]\nendpoint = \"http://not a url\"\n", "otlp.endpoint"),
            ("[otlp]\ninterval_ms = 5\n", "otlp.interval_ms"),
        ] {
            let err = Config::from_toml(text, "x.toml").unwrap_err().to_string();
            assert!(err.contains(key), "{text}: {err}");
        }
        let ok = "[otlp]\nprotocol = \"grpc\"\nendpoint = \"http://otel:4317\"\n";
        assert!(Config::from_toml(ok, "x.toml").is_ok());
    }

    /// Issue 16, item 9: what the agent would reject at start is rejected here, and a long
    /// value is quoted cut.
    #[test]
    fn https_and_malformed_endpoints_are_config_errors_quoted_short() {
        for endpoint in [
            "https://otel:4317",
            "http://",
            "http://[::1",
            "ftp://otel:4317",
            "http://otel:99999999",
        ] {
            let text = format!("[otlp]\nendpoint = \"{endpoint}\"\n");
            let err = Config::from_toml(&text, "x.toml").unwrap_err().to_string();
            assert!(err.contains("otlp.endpoint"), "{endpoint}: {err}");
        }
        let err = Config::from_toml("[otlp]\nendpoint = \"https://otel:4317\"\n", "x")
            .unwrap_err()
            .to_string();
        assert!(err.contains("TLS"), "{err}");
        let long = format!("http://{}", "a".repeat(10 << 20));
        let err = Config::from_toml(&format!("[otlp]\nendpoint = \"{long}\"\n"), "x")
            .unwrap_err()
            .to_string();
        assert!(err.contains("otlp.endpoint"), "{}", crate::clip(&err));
        assert!(err.len() < 1000, "{} bytes", err.len());
    }

    #[test]
    fn unknown_key_is_an_error_naming_it() {
        let err = Config::from_toml("[agent]\ntick_msec = 5\n", "x.toml").unwrap_err();
        let text = err.to_string();
        assert!(text.contains("tick_msec"), "{text}");
        assert!(text.contains("x.toml"), "{text}");
    }

    #[test]
    fn out_of_range_values_are_errors() {
        for (toml, key) in [
            ("[agent]\ntick_ms = 5\n", "agent.tick_ms"),
            (
                "[probes.runqueue]\nring_buffer_kib = 100\n",
                "probes.runqueue.ring_buffer_kib",
            ),
            (
                "[probes.runqueue]\nmax_threads = 0\n",
                "probes.runqueue.max_threads",
            ),
        ] {
            let err = Config::from_toml(toml, "x").unwrap_err().to_string();
            assert!(err.contains(key), "{err}");
        }
    }

    #[test]
    fn wrong_type_is_an_error() {
        let err = Config::from_toml("[prometheus]\nlisten = 9617\n", "x").unwrap_err();
        assert!(err.to_string().contains("listen"), "{err}");
    }

    #[test]
    fn partial_file_keeps_other_defaults() {
        let c = Config::from_toml("[prometheus]\nlisten = \"127.0.0.1:1\"\n", "x").expect("ok");
        assert_eq!(c.prometheus.listen.port(), 1);
        assert_eq!(c.agent, AgentConfig::default());
    }
}
