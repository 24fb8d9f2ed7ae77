//! `slo-probe agent`: the collector thread, the Prometheus server and the OTLP exporter on a
//! small async runtime, until SIGINT or SIGTERM.

use std::{
    process::ExitCode,
    sync::{atomic::AtomicBool, Arc},
};

use anyhow::Context as _;
use slo_probe_core::snapshot::Snapshot;
use tokio::sync::watch;

use crate::{
    api::{self, Api},
    collector::{self, Collector},
    config::Config,
    exporters::{self, prometheus::PrometheusServer},
};

/// Runs the agent until SIGINT or SIGTERM.
pub fn run(config: Config, no_ebpf: bool) -> anyhow::Result<ExitCode> {
    // The OTLP settings (config and OTEL_* variables) are checked before anything starts.
    let otlp = exporters::otlp::Settings::resolve(&config.otlp)
        .map_err(|e| anyhow::anyhow!("OTLP: {e}"))?;
    let collector = Collector::new(&config, no_ebpf, false)?;
    let shim_socket = collector.shim().map(|s| s.path().display().to_string());
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
        let server = if config.prometheus.enabled {
            let server =
                PrometheusServer::bind(config.prometheus.listen, config.prometheus.per_thread)
                    .await?
                    .with_api(Api::new(api::convert::Context {
                        host: crate::sources::procfs::hostname(),
                        shim_socket: shim_socket.clone(),
                        writes_allowed: config.api.allow_writes,
                    }));
            let addr = server.local_addr()?;
            log::info!("serving Prometheus metrics at http://{addr}/metrics");
            log::info!("serving the state API at http://{addr}/api/v1/snapshot and /api/v1/watch");
            Some(tokio::spawn(server.serve(rx.clone(), shutdown_rx.clone())))
        } else {
            None
        };
        let otlp = match otlp {
            Some(settings) => {
                let exporter = exporters::otlp::OtlpExporter::new(
                    settings,
                    std::time::Duration::from_secs(config.agent.retention_s),
                )
                .map_err(|e| anyhow::anyhow!("OTLP: {e}"))?;
                Some(tokio::spawn(exporters::otlp::run(
                    exporter,
                    rx.clone(),
                    shutdown_rx.clone(),
                )))
            }
            None => None,
        };
        let stop = Arc::new(AtomicBool::new(false));
        let handle = collector::spawn(collector, config.tick(), tx, stop.clone())
            .context("cannot start the collector thread")?;

        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            _ = tokio::signal::ctrl_c() => log::info!("SIGINT: stopping"),
            _ = term.recv() => log::info!("SIGTERM: stopping"),
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let _ = shutdown_tx.send(true);
        if let Some(s) = server {
            let _ = s.await;
        }
        if let Some(o) = otlp {
            let _ = o.await;
        }
        let collector = tokio::task::spawn_blocking(move || handle.join())
            .await
            .context("collector thread")?
            .map_err(|_| anyhow::anyhow!("the collector thread panicked"))?;
        drop(collector); // detaches every eBPF program
        log::info!("probes detached; bye");
        Ok(ExitCode::SUCCESS)
    })
}
