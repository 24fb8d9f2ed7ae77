//! The known-answer evaluation of the SLO engine at scale: `cargo run --release -p
//! slo-probe-core --example known_answer -- [PER_KIND] [SEED]` generates PER_KIND (default 100)
//! jobs of every kind in `synth::KINDS` from SEED (default 1), runs each through record decoding,
//! iteration assembly and the engine (`synth::run_case`), and prints top-1 accuracy per kind,
//! false alarms, detection latency and the wrong cases.

use slo_probe_core::synth::{cases, known_answer, test_spec, KINDS};

fn main() {
    let mut args = std::env::args().skip(1);
    let per_kind: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(100);
    let seed: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(1);
    let cases = cases(per_kind, seed);
    let started = std::time::Instant::now();
    let outcomes = known_answer(&cases, &test_spec());
    let secs = started.elapsed().as_secs_f64();
    let kernels: u64 = outcomes.iter().map(|o| o.kernels).sum();
    println!(
        "{} cases ({per_kind} per kind, seed {seed}), {} kernel records, {:.1} s",
        outcomes.len(),
        kernels,
        secs
    );
    println!("| kind | cases | correct | violations before onset | detection latency p50 / max |");
    println!("|---|---|---|---|---|");
    for kind in KINDS {
        let of: Vec<_> = outcomes.iter().filter(|o| o.kind == kind).collect();
        let ok = of.iter().filter(|o| o.correct()).count();
        let early = of.iter().filter(|o| o.early > 0).count();
        let mut lat: Vec<f64> = of
            .iter()
            .filter_map(|o| o.latency_ns)
            .map(|l| l as f64 / 1e9)
            .collect();
        lat.sort_by(f64::total_cmp);
        let lat = if lat.is_empty() {
            "-".to_owned()
        } else {
            format!("{:.1} s / {:.1} s", lat[lat.len() / 2], lat[lat.len() - 1])
        };
        println!("| {kind} | {} | {ok} | {early} | {lat} |", of.len());
    }
    let faulty: Vec<_> = outcomes.iter().filter(|o| o.truth.is_some()).collect();
    let healthy: Vec<_> = outcomes.iter().filter(|o| o.truth.is_none()).collect();
    let correct = faulty.iter().filter(|o| o.correct()).count();
    let alarms = healthy.iter().filter(|o| !o.correct()).count();
    let healthy_hours = healthy.len() as f64 * 20.0 / 3600.0;
    println!(
        "\ntop-1 accuracy: {correct}/{} = {:.1}%; healthy jobs with a violation: {alarms}/{} \
         ({:.2} false alarms per job-hour of healthy running)",
        faulty.len(),
        100.0 * correct as f64 / faulty.len().max(1) as f64,
        healthy.len(),
        alarms as f64 / healthy_hours.max(1e-9)
    );
    println!("\none case of each kind:");
    for kind in KINDS {
        if let Some(o) = outcomes.iter().find(|o| o.kind == kind) {
            println!(
                "  {kind}: {}",
                if o.chain.is_empty() {
                    "no violation".to_owned()
                } else {
                    o.chain.clone()
                }
            );
        }
    }
    for o in outcomes.iter().filter(|o| !o.correct()) {
        println!(
            "wrong: {} seed {}: expected {:?}, top {:?}, violations before onset {}\n  {}",
            o.kind, o.seed, o.truth, o.top, o.early, o.chain
        );
    }
}
