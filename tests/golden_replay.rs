//! Plain tier: `slo-probe replay` of both H200 fixtures, with step markers and with iterations
//! detected, gives exactly the reports recorded in `tests/fixtures/gpu/golden/` (the text
//! report byte for byte, the `--json` output by SHA-256). They were taken before the GPU
//! pipeline moved into `slo_probe_core::pipeline`; a change to them must be deliberate: rerun
//! with `SLO_PROBE_BLESS=1` and say why in the commit.

use std::{path::Path, process::Command};

fn sha256(path: &Path) -> String {
    let out = Command::new("sha256sum")
        .arg(path)
        .output()
        .expect("sha256sum (coreutils)");
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_owned()
}

#[test]
fn replay_reports_match_the_golden_ones() {
    let bin = slo_probe_tests::artefact("slo-probe", "slo-probe");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let golden = root.join("tests/fixtures/gpu/golden");
    let bless = std::env::var_os("SLO_PROBE_BLESS").is_some();
    let tmp = std::env::temp_dir().join(format!("slo-probe-golden-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).expect("tmp");
    let mut failures = Vec::new();
    for fixture in ["h200-eager", "h200-graphs"] {
        for mode in ["markers", "detect"] {
            let json = tmp.join(format!("{fixture}.{mode}.json"));
            let mut cmd = Command::new(&bin);
            cmd.current_dir(&root)
                .args(["replay", "--compute-capability", "9.0"]);
            if mode == "detect" {
                cmd.arg("--detect");
            }
            let out = cmd
                .arg("--json")
                .arg(&json)
                .arg(format!("tests/fixtures/gpu/{fixture}.bin"))
                .output()
                .expect("slo-probe replay");
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let text_path = golden.join(format!("{fixture}.{mode}.txt"));
            let sha_path = golden.join(format!("{fixture}.{mode}.json.sha256"));
            let sha = sha256(&json);
            if bless {
                std::fs::write(&text_path, &out.stdout).expect("bless");
                std::fs::write(&sha_path, format!("{sha}\n")).expect("bless");
                continue;
            }
            let want = std::fs::read(&text_path).expect("golden report");
            if out.stdout != want {
                failures.push(format!(
                    "{fixture} {mode}: the text report differs from {}:\n{}",
                    text_path.display(),
                    String::from_utf8_lossy(&out.stdout)
                ));
            }
            let want_sha = std::fs::read_to_string(&sha_path).expect("golden sha");
            if sha != want_sha.trim() {
                failures.push(format!(
                    "{fixture} {mode}: the JSON report differs (sha {sha})"
                ));
            }
        }
    }
    let _ = std::fs::remove_dir_all(&tmp);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
