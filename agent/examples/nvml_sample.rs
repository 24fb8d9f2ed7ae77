//! GPU-tier check of the NVML sampler: starts it, samples every GPU a few times one second
//! apart, prints how long each sample took and the Prometheus text of the last one. Needs an
//! NVIDIA driver; without one it prints why GPU metrics are off and exits with status 2.
//!
//! `RUST_LOG=debug cargo run --release -p slo-probe --example nvml_sample -- [samples]`

use std::time::{Duration, Instant};

use slo_probe::{
    error_chain,
    exporters::{model, prometheus::TextSink},
    sources::nvml::NvmlSampler,
};

fn main() {
    env_logger::init();
    let samples: u32 = std::env::args()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(3)
        .max(1);
    let mut sampler = match NvmlSampler::new() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{}", error_chain(&e));
            std::process::exit(2);
        }
    };
    println!("{}", sampler.describe());
    let start = Instant::now();
    let mut last = None;
    for n in 0..samples {
        if n > 0 {
            std::thread::sleep(Duration::from_secs(1));
        }
        let now_ns = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let t0 = Instant::now();
        let snapshot = sampler.sample(now_ns);
        println!("sample {n}: {:?}", t0.elapsed());
        for d in &snapshot.devices {
            println!("  {d:?}");
        }
        last = Some(snapshot);
    }
    if let Some(snapshot) = last {
        let mut text = String::new();
        model::gpu::walk(&mut TextSink::new(&mut text), &snapshot);
        print!("{text}");
    }
}
