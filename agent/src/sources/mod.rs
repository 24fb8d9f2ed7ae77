//! Sources: adapt what the kernel, NVML (and later the GPU shim) report into the core's input
//! types.
pub mod cgroup;
pub mod ebpf;
pub mod nvml;
pub mod procfs;
pub mod shim;

/// Appends `value` as one JSON line to `path` (the recordings beside `shim.record_dir`'s GPU
/// records); a failure is logged once per path and otherwise ignored: recording never stops
/// the agent.
pub fn append_json_line(path: &std::path::Path, value: &impl serde::Serialize) {
    use std::io::Write as _;
    static WARNED: std::sync::Mutex<Vec<std::path::PathBuf>> = std::sync::Mutex::new(Vec::new());
    let result = serde_json::to_vec(value)
        .map_err(std::io::Error::other)
        .and_then(|mut line| {
            line.push(b'\n');
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)?
                .write_all(&line)
        });
    if let Err(e) = result {
        if let Ok(mut w) = WARNED.lock() {
            if !w.iter().any(|p| p == path) {
                log::warn!("cannot record to {}: {e}", path.display());
                w.push(path.to_owned());
            }
        }
    }
}
