//! Plain tier: `slo-probe run` around a launcher that starts two ranks, as `torchrun` does: both
//! python ranks load the shim that `run` injected (they read `CUDA_INJECTION64_PATH`, no GPU:
//! iterations from step markers), register with the agent `run` started, and the report has
//! both processes, their iterations, the job's straggler scores (rank 1 is slower) and the
//! shadow healer's view of both ranks.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use slo_probe::cli::run::RunReport;
use slo_probe_tests::{artefact, free_addr, is_root, tempdir};

/// `run.toml` in `dir`: a private listener, the workspace's shim, no NVML, 200 ms ticks, the
/// healer's files in `dir`, and `extra` (more TOML tables).
fn run_config(dir: &Path, extra: &str) -> PathBuf {
    let config = dir.join("run.toml");
    std::fs::write(
        &config,
        format!(
            "[prometheus]\nlisten = \"{}\"\n[shim]\nlibrary = {:?}\n[gpu]\nnvml = false\n\
             [agent]\ntick_ms = 200\n[heal]\njournal = {:?}\njobs_dir = {:?}\n{extra}",
            free_addr(),
            artefact("libslo_probe_cupti.so", "slo-probe-cupti"),
            dir.join("heal.jsonl"),
            dir.join("jobs")
        ),
    )
    .expect("config");
    config
}

/// The JSON report `run -o NAME` wrote in `dir`.
fn report(dir: &Path, name: &str) -> RunReport {
    serde_json::from_slice(&std::fs::read(dir.join(format!("{name}.json"))).expect("report"))
        .expect("parses")
}

#[test]
fn a_launcher_with_two_ranks_gets_one_report_with_both() {
    let dir = tempdir("run", "ranks");
    let config = run_config(
        &dir,
        "[slo]\nwindow_ms = 500\nlearn_windows = 3\nwarmup_iterations = 5\n",
    );
    let rank = "import ctypes, os, time\n\
                lib = ctypes.PyDLL(os.environ['CUDA_INJECTION64_PATH'])\n\
                lib.slo_probe_step_begin.argtypes = [ctypes.c_uint64]\n\
                lib.slo_probe_step_end.argtypes = [ctypes.c_uint64]\n\
                pause = 0.02 if os.environ['RANK'] == '0' else 0.04\n\
                for i in range(100):\n\
                \x20   lib.slo_probe_step_begin(i)\n\
                \x20   time.sleep(pause)\n\
                \x20   lib.slo_probe_step_end(i)\n\
                time.sleep(1.5)\n";
    let launcher = "for r in 0 1; do RANK=$r python3 -c \"$RANK_SCRIPT\" & done; wait";
    let out = Command::new(artefact("slo-probe", "slo-probe"))
        .current_dir(&dir)
        .args(["run", "--no-ebpf", "-o", "ranks", "--config"])
        .arg(&config)
        .args(["--", "sh", "-c", launcher])
        .env("RANK_SCRIPT", rank)
        .env("SLO_PROBE_JOB", "two-ranks")
        .env_remove("CUDA_INJECTION64_PATH")
        .output()
        .expect("slo-probe run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let r = report(&dir, "ranks");
    assert_eq!(
        r.state.processes.len(),
        2,
        "{err}\n{:#?}",
        r.state.processes
    );
    for p in &r.state.processes {
        assert!(p.iterations.total >= 90, "{p:#?}");
        assert!(p.slo.is_some());
        assert!(r.pids.contains(&p.pid));
    }
    let job = r
        .state
        .jobs
        .iter()
        .find(|j| j.id == "two-ranks")
        .expect("job");
    assert_eq!(job.ranks.len(), 2);
    let (r0, r1) = (&job.ranks[0], &job.ranks[1]);
    assert_eq!((r0.rank, r1.rank), (0, 1));
    let (a, b) = (r0.relative.expect("score"), r1.relative.expect("score"));
    assert!((a - 1.0).abs() < 1e-9 && (0.3..0.7).contains(&b), "{a} {b}");
    // The healer (shadow: the config's default, capped there without --heal) followed both
    // ranks; their views stay in the report after the ranks ended.
    let healer = r.state.healer.as_ref().expect("healer");
    assert_eq!(healer.mode, "shadow");
    for p in &r.state.processes {
        assert!(
            healer.state.contains(&format!("job {}", p.pid)),
            "{healer:#?}"
        );
    }
    let text = std::fs::read_to_string(dir.join("ranks.txt")).expect("text");
    assert!(text.contains("stragglers of job two-ranks"), "{text}");
    assert!(text.contains("healer:     shadow"), "{text}");
    assert!(err.contains("2 training processes, "), "{err}");
}

/// Real `torchrun` (two ranks, gloo on the CPU, `examples/train_ddp.py` with its DataLoader
/// workers) under `slo-probe run` with the eBPF probes: both ranks register, the report has
/// both with their iterations and one job of two ranks, and host time by thread role. Runs
/// where `torchrun` is on PATH with a PyTorch that imports (`scripts/torchrun-check` makes
/// one); skips, saying so, elsewhere. Needs root for the probes; without root it runs
/// `--no-ebpf`.
///
/// A CUDA build of PyTorch on a machine without a GPU driver is the case it was written for:
/// there the shim the python client loaded for the step markers crashed both ranks (SIGSEGV in
/// libcupti) before the shim stopped calling libcupti where no driver is (2026-12-02).
/// Whether PyTorch (and with `torchrun`, the `torchrun` command) is on PATH; says why a test is
/// skipped when not, and fails it where `SLO_PROBE_REQUIRE_TORCHRUN` is set.
fn torch_on_path(torchrun: bool) -> bool {
    let ok = |cmd: &mut Command| cmd.output().is_ok_and(|o| o.status.success());
    let here = ok(Command::new("python3").args(["-c", "import torch, torch.distributed.run"]))
        && (!torchrun || ok(Command::new("torchrun").arg("--help")));
    if !here {
        let need = std::env::var_os("SLO_PROBE_REQUIRE_TORCHRUN").is_some();
        assert!(
            !need,
            "SLO_PROBE_REQUIRE_TORCHRUN is set but torchrun/torch are not there"
        );
        eprintln!("skipped: no torchrun with PyTorch on PATH (scripts/torchrun-check makes one)");
    }
    here
}

/// `slo-probe run -o NAME --config CONFIG` in `dir`, without eBPF unless root.
fn slo_probe_run(dir: &Path, config: &Path, name: &str) -> Command {
    let mut cmd = Command::new(artefact("slo-probe", "slo-probe"));
    cmd.current_dir(dir)
        .args(["run", "-o", name, "--config"])
        .arg(config);
    if !is_root() {
        cmd.arg("--no-ebpf");
    }
    cmd
}

#[test]
fn real_torchrun_with_two_ranks_on_the_cpu() {
    if !torch_on_path(true) {
        return;
    }
    let dir = tempdir("run", "torchrun");
    let config = run_config(&dir, "");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/train_ddp.py");
    let root = is_root();
    let out = slo_probe_run(&dir, &config, "torchrun")
        .args(["--", "torchrun", "--nproc-per-node", "2", script])
        .args(["--device", "cpu", "--steps", "60", "--warmup", "5"])
        .args([
            "--batch",
            "32",
            "--dim",
            "128",
            "--depth",
            "2",
            "--workers",
            "1",
        ])
        .env_remove("CUDA_INJECTION64_PATH")
        .env("OMP_NUM_THREADS", "1")
        .output()
        .expect("slo-probe run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let r = report(&dir, "torchrun");
    assert_eq!(
        r.state.processes.len(),
        2,
        "{err}\n{:#?}",
        r.state.processes
    );
    let mut ranks: Vec<u32> = Vec::new();
    for p in &r.state.processes {
        assert!(p.iterations.total >= 55, "{p:#?}");
        ranks.extend(p.rank);
    }
    ranks.sort_unstable();
    assert_eq!(ranks, [0, 1], "ranks from torchrun's RANK");
    let job = r
        .state
        .jobs
        .iter()
        .find(|j| j.ranks.len() == 2)
        .unwrap_or_else(|| panic!("no job of two ranks: {:#?}", r.state.jobs));
    assert!(job.ranks.iter().all(|k| k.relative.is_some()), "{job:#?}");
    let text = std::fs::read_to_string(dir.join("torchrun.txt")).expect("text");
    assert!(text.contains("exited with 0"), "{text}");
    if root {
        // The DataLoader worker processes and the ranks' main threads, by the probes.
        assert!(
            text.contains("data_loader") && text.contains("main "),
            "{text}"
        );
    }
    eprintln!("{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A real PyTorch script that marks no steps, under `slo-probe run` on this machine's CPU
/// (PyTorch from `scripts/torchrun-check`'s environment): run's Python bootstrap gives it one
/// iteration per `optimizer.step()`, which the shim (loaded by the python client, no GPU
/// needed) carries to the agent as step markers. Skipped without PyTorch on PATH.
#[test]
fn real_torch_without_markers_gets_automatic_ones() {
    if !torch_on_path(false) {
        return;
    }
    let dir = tempdir("run", "autosteps");
    let config = run_config(&dir, "");
    let script = dir.join("unmarked.py");
    std::fs::write(
        &script,
        "import torch\n\
         m = torch.nn.Linear(64, 64)\n\
         opt = torch.optim.SGD(m.parameters(), lr=0.01)\n\
         for _ in range(200):\n    m(torch.randn(32, 64)).pow(2).mean().backward()\n    \
         opt.step()\n    opt.zero_grad()\n",
    )
    .expect("script");
    let out = slo_probe_run(&dir, &config, "auto")
        .arg("--")
        .arg("python3")
        .arg(&script)
        .env_remove("CUDA_INJECTION64_PATH")
        .env_remove("SLO_PROBE_AUTO_STEPS")
        .env("OMP_NUM_THREADS", "1")
        .output()
        .expect("slo-probe run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let r = report(&dir, "auto");
    assert_eq!(
        r.state.processes.len(),
        1,
        "{err}\n{:#?}",
        r.state.processes
    );
    let p = &r.state.processes[0];
    // 200 optimizer steps: the first begins step 0, each later one ends a step.
    assert_eq!(p.iterations.total, 199, "{p:#?}");
    assert_eq!(
        p.iterations.source,
        slo_probe::api::types::IterationSource::Markers
    );
    let _ = std::fs::remove_dir_all(&dir);
}
