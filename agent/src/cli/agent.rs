//! `slo-probe agent`: the collector thread, the healer thread, and the exporters the config
//! enables (the Prometheus server with the state API, the OTLP exporter) on a small async
//! runtime, until SIGINT or SIGTERM. With `[api] allow_writes` the API's write endpoints are
//! carried out by [`AgentControl`] (the shims' depth, the healer's journal).

use std::{
    process::ExitCode,
    sync::{atomic::AtomicBool, Arc},
};

use anyhow::Context as _;
use slo_probe_core::snapshot::Snapshot;
use tokio::sync::watch;

use crate::{
    api::{self, control::AgentControl, Api},
    collector::{self, Collector},
    config::{Config, HealMode},
    exporters::{
        otlp::{OtlpExporter, Settings},
        prometheus::PrometheusServer,
        Exporter,
    },
    healer,
    sources::shim::ShimSource,
};

/// What the agent checks before it starts anything, and `config check` checks too: the OTLP
/// settings (the config and the OTEL_* variables), and that `shim.socket` is free to use (no
/// file that is not a socket in its place). Returns the OTLP settings, `None` when OTLP is off.
pub fn check_startup(config: &Config) -> anyhow::Result<Option<Settings>> {
    let otlp = Settings::resolve(&config.otlp).context("OTLP")?;
    if config.shim.enabled {
        let path = &config.shim.socket;
        if let Ok(m) = std::fs::symlink_metadata(path) {
            use std::os::unix::fs::FileTypeExt as _;
            anyhow::ensure!(
                m.file_type().is_socket(),
                "shim.socket {} exists and is not a socket; refusing to replace it: remove it or \
                 choose another path",
                crate::clip(&path.display().to_string())
            );
        }
    }
    Ok(otlp)
}

/// Runs the agent until SIGINT or SIGTERM.
pub fn run(config: Config, no_ebpf: bool) -> anyhow::Result<ExitCode> {
    let otlp = check_startup(&config)?;
    crate::tune_allocator();
    let collector = Collector::new(&config, no_ebpf, false)?;
    let shim_socket = collector.shim().map(|s| s.path().display().to_string());
    // Taken before the collector moves into its thread, which keeps owning the shims.
    let shim = collector.shim().map(ShimSource::handle);
    if collector.ebpf_up() {
        if config.target.is_set() {
            log::info!(
                "probes attached; following pids {:?} and cgroups {:?} with their descendants",
                config.target.pids,
                config.target.cgroups
            );
        } else {
            log::info!("probes attached; following every process on the node");
        }
    } else {
        log::warn!("running without eBPF probes: only self-metrics are served");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("slo-io")
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async move {
        let (tx, rx) = watch::channel(Arc::new(Snapshot::default()));
        let (shutdown_tx, shutdown_rx) = watch::channel(false);
        let mut exporters: Vec<Box<dyn Exporter>> = Vec::new();
        if config.prometheus.enabled {
            let mut api = Api::new(api::convert::Context {
                host: crate::sources::procfs::hostname(),
                shim_socket: shim_socket.clone(),
                writes_allowed: config.api.allow_writes,
                heal_mode: config.heal.mode.as_str(),
            });
            if config.api.allow_writes {
                api = api.with_control(Arc::new(AgentControl::new(shim.clone(), &config.heal)));
                log::info!("the state API's write endpoints are on ([api] allow_writes)");
            }
            let server =
                PrometheusServer::bind(config.prometheus.listen, config.prometheus.per_thread)
                    .await?
                    .with_api(api);
            let addr = server.local_addr()?;
            log::info!("serving Prometheus metrics at http://{addr}/metrics");
            log::info!("serving the state API at http://{addr}/api/v1/snapshot and /api/v1/watch");
            exporters.push(Box::new(server));
        }
        if let Some(settings) = otlp {
            let retention = std::time::Duration::from_secs(config.agent.retention_s);
            exporters.push(Box::new(
                OtlpExporter::new(settings, retention).context("OTLP")?,
            ));
        }
        let running: Vec<_> = exporters
            .into_iter()
            .map(|e| (e.name(), e.start(rx.clone(), shutdown_rx.clone())))
            .collect();
        let stop = Arc::new(AtomicBool::new(false));
        let mut collector = collector;
        // The healer never stops the agent: without its journal it is off.
        let heal = if config.heal.mode == HealMode::Off {
            if let Err(e) = healer::restore_at_start(&config.heal) {
                log::warn!("heal: {}", crate::error_chain(&e));
            }
            None
        } else {
            let shim = healer::shim_control(collector.shim());
            match healer::spawn(&config.heal, rx.clone(), stop.clone(), shim) {
                Ok((h, views)) => {
                    // Its views go into every snapshot from now on.
                    collector.set_healer_views(views);
                    Some(h)
                }
                Err(e) => {
                    log::warn!("heal: {}; healing is off", crate::error_chain(&e));
                    None
                }
            }
        };
        let handle = collector::spawn(collector, config.tick(), tx, stop.clone())
            .context("cannot start the collector thread")?;

        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            _ = tokio::signal::ctrl_c() => log::info!("SIGINT: stopping"),
            _ = term.recv() => log::info!("SIGTERM: stopping"),
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let _ = shutdown_tx.send(true);
        for (name, task) in running {
            if task.await.is_err() {
                log::warn!("the {name} exporter panicked");
            }
        }
        let mut collector = tokio::task::spawn_blocking(move || handle.join())
            .await
            .context("collector thread")?
            .map_err(|_| anyhow::anyhow!("the collector thread panicked"))?;
        collector.stop(); // detaches every eBPF program, ends the shim and NVML threads
        if let Some(h) = heal {
            let _ = tokio::task::spawn_blocking(move || h.join()).await;
        }
        log::info!("probes detached; bye");
        Ok(ExitCode::SUCCESS)
    })
}
