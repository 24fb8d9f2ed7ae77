//! Builds the eBPF object from `ebpf/` (aya-build) so that `src/sources/ebpf` can embed it.
//!
//! The object is built with the stable toolchain plus `rust-src` and `-Z build-std=core`, which
//! stable accepts when `RUSTC_BOOTSTRAP=1` is set for the eBPF build only (see
//! shared/research/ebpf-build.md). Linking needs `bpf-linker` 0.13 built against LLVM 22:
//! `scripts/setup` installs it.
use anyhow::Context as _;

fn main() -> anyhow::Result<()> {
    println!("cargo:rerun-if-env-changed=AYA_BUILD_SKIP");
    if std::env::var_os("AYA_BUILD_SKIP").is_some_and(|v| v == "1") {
        // The fuzz targets (fuzz/) use the agent's parsers, not its probes: an empty object
        // keeps them from needing bpf-linker and the eBPF build. Loading it fails cleanly.
        let out = std::env::var("OUT_DIR").context("OUT_DIR not set")?;
        std::fs::write(format!("{out}/slo-probe-ebpf"), b"")
            .context("cannot write the placeholder eBPF object")?;
        return Ok(());
    }
    let manifest_dir = std::env::var("CARGO_MANIFEST_DIR").context("CARGO_MANIFEST_DIR not set")?;
    let ebpf_dir = format!("{manifest_dir}/../ebpf");
    // Inherited by the nested cargo that aya-build spawns; this build script's own process is
    // the only other reader.
    std::env::set_var("RUSTC_BOOTSTRAP", "1");
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "slo-probe-ebpf",
            root_dir: &ebpf_dir,
            ..Default::default()
        }],
        aya_build::Toolchain::Custom("stable"),
    )
    .context(
        "building the eBPF programs failed; check that rust-src is installed \
         (`rustup component add rust-src --toolchain stable`) and bpf-linker 0.13 is on PATH \
         (scripts/setup installs both)",
    )
}
