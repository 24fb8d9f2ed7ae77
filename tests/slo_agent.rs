//! Plain tier: the SLO engine inside the agent's shim source, fed by a real process. The real
//! `libslo_probe_cupti.so` is loaded by python (no GPU here: iterations come from its step
//! markers alone, so the whole iteration is GPU idle before its first activity); the steps
//! take 20 ms, then 45 ms. The source's engine learns the 20 ms baseline, opens a violation
//! on the iteration nodes and attributes it to data loading; Prometheus renders it.

use std::{
    path::PathBuf,
    process::Command,
    time::{Duration, Instant},
};

use slo_probe::exporters::prometheus::slo::render_slo;
use slo_probe_core::{attribution::DATA_LOADING_OP, pipeline::PipelineSettings, slo::SloSpec};
use slo_probe_tests::Shims;

fn shim_library() -> PathBuf {
    slo_probe_tests::artefact("libslo_probe_cupti.so", "slo-probe-cupti")
}

#[test]
fn a_slower_job_opens_a_violation_in_the_agent() {
    let socket = std::env::temp_dir().join(format!(
        "slo-probe-test-slo-{}/shim.sock",
        std::process::id()
    ));
    let src = Shims::start(
        &socket,
        PipelineSettings::live(
            SloSpec {
                window_ms: 500,
                learn_windows: 3,
                warmup_iterations: 5,
                ..SloSpec::default()
            },
            100_000_000,
        ),
    )
    .expect("listen");
    let script = format!(
        "import ctypes, time\n\
         lib = ctypes.PyDLL({lib:?})\n\
         lib.slo_probe_step_begin.argtypes = [ctypes.c_uint64]\n\
         lib.slo_probe_step_end.argtypes = [ctypes.c_uint64]\n\
         for i in range(260):\n\
         \x20   lib.slo_probe_step_begin(i)\n\
         \x20   time.sleep(0.020 if i < 160 else 0.045)\n\
         \x20   lib.slo_probe_step_end(i)\n\
         time.sleep(30)\n",
        lib = shim_library().display().to_string(),
    );
    let mut child = Command::new("python3")
        .args(["-c", &script])
        .env("SLO_PROBE_SOCKET", &socket)
        .env_remove("CUDA_INJECTION64_PATH")
        .spawn()
        .expect("python3");
    let pid = child.id();
    let deadline = Instant::now() + Duration::from_secs(40);
    let found = loop {
        let p = src.processes().into_iter().find(|p| p.pid == pid);
        if let Some(v) = p.as_ref().and_then(|p| p.slo.as_ref()).and_then(|s| {
            s.violations
                .iter()
                .find(|v| v.attribution.is_some())
                .cloned()
        }) {
            break (p.expect("process"), v);
        }
        assert!(
            Instant::now() < deadline,
            "no violation: {:?}",
            p.and_then(|p| p.slo)
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let _ = child.kill();
    let _ = child.wait();
    let (p, v) = found;
    eprintln!("{}", v.chain);
    assert!(
        v.node.starts_with("iteration") || v.node == "data_loading",
        "{v:?}"
    );
    let top = v
        .attribution
        .as_ref()
        .and_then(|a| a.top())
        .expect("top cause");
    assert_eq!(top.op, DATA_LOADING_OP);
    // About 25 ms more per iteration.
    assert!((15e6..35e6).contains(&top.delta_ns), "{top:?}");
    let mut text = String::new();
    render_slo(&mut text, &[p]);
    assert!(text.contains(&format!(
        "slo_probe_attribution_seconds{{pid=\"{pid}\",rank=\"\",job_id=\"\",node=\"{}\",cause_rank=\"1\",op=\"(data loading)\",dimension=\"data_loading\"}}",
        v.node
    )), "{text}");
}
