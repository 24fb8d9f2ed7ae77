//! Rebuild the eBPF object when bpf-linker changes (aya-template), and say how to get it when it
//! is missing.
fn main() {
    match which::which("bpf-linker") {
        Ok(path) => println!("cargo:rerun-if-changed={}", path.display()),
        Err(_) => println!(
            "cargo:warning=bpf-linker not found on PATH: the eBPF object cannot be linked; \
             run scripts/setup (it installs bpf-linker 0.13.0 against Debian's LLVM 22)"
        ),
    }
}
