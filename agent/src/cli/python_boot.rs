//! The Python bootstrap that `run` and `observe` give the command: automatic step markers for a
//! PyTorch script that has none (`python/slo_probe/_autostep.py`, one iteration per
//! `optimizer.step()`).
//!
//! The `slo_probe` package and its `sitecustomize` are compiled into this binary and written to
//! a private folder for the command's life: `PYTHONPATH` gets the bootstrap's folder first (the
//! environment's own `sitecustomize` still runs: the bootstrap runs the one it hides), and
//! `SLO_PROBE_PYTHON` names the package's folder, which the bootstrap puts at the *end* of
//! `sys.path` only if no `slo_probe` is importable (an installed one wins). The bootstrap
//! imports nothing until torch imports `torch.optim.optimizer`. Why: without markers the
//! shim's cheap tier cannot go quiet between its sample windows (the kernels are then the
//! agent's iteration clock), which cost about 1% of step time on a GPU-bound eager job.

use std::{
    ffi::OsString,
    path::{Path, PathBuf},
};

/// The package's files: (path under the folder, contents).
const FILES: &[(&str, &str)] = &[
    (
        "slo_probe/__init__.py",
        include_str!("../../../python/slo_probe/__init__.py"),
    ),
    (
        "slo_probe/_strategy.py",
        include_str!("../../../python/slo_probe/_strategy.py"),
    ),
    (
        "slo_probe/_autostep.py",
        include_str!("../../../python/slo_probe/_autostep.py"),
    ),
    (
        "slo_probe/_boot/sitecustomize.py",
        include_str!("../../../python/slo_probe/_boot/sitecustomize.py"),
    ),
];

/// The written folder; removed when dropped.
#[derive(Debug)]
pub struct PythonBoot {
    dir: PathBuf,
}

impl PythonBoot {
    /// Writes the package under a new private folder in `parent` (mode 0700).
    pub fn write_in(parent: &Path) -> std::io::Result<Self> {
        use std::os::unix::fs::DirBuilderExt as _;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let dir = parent.join(format!("slo-probe-python-{}-{nanos}", std::process::id()));
        std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
        let boot = Self { dir };
        for (rel, text) in FILES {
            let path = boot.dir.join(rel);
            if let Some(up) = path.parent() {
                std::fs::create_dir_all(up)?;
            }
            std::fs::write(&path, text)?;
        }
        Ok(boot)
    }

    /// Writes it under the temporary folder (`TMPDIR`, else /tmp); the error says what the
    /// command goes without.
    pub fn write() -> Result<Self, String> {
        let tmp = std::env::temp_dir();
        Self::write_in(&tmp).map_err(|e| {
            format!(
                "cannot write the Python bootstrap under {} ({e}): no automatic step markers \
                 for a script without slo_probe.step()",
                tmp.display()
            )
        })
    }

    /// The folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The command's environment: `PYTHONPATH` (the bootstrap first, then the user's) and
    /// `SLO_PROBE_PYTHON`.
    pub fn env(&self, user_pythonpath: Option<OsString>) -> Vec<(OsString, OsString)> {
        let mut path = self.dir.join("slo_probe/_boot").into_os_string();
        if let Some(user) = user_pythonpath.filter(|p| !p.is_empty()) {
            path.push(":");
            path.push(user);
        }
        vec![
            ("PYTHONPATH".into(), path),
            ("SLO_PROBE_PYTHON".into(), self.dir.clone().into_os_string()),
        ]
    }
}

impl Drop for PythonBoot {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_the_package_and_removes_it() {
        let parent = std::env::temp_dir();
        let boot = PythonBoot::write_in(&parent).unwrap();
        let dir = boot.dir().to_owned();
        for (rel, text) in FILES {
            assert_eq!(std::fs::read_to_string(dir.join(rel)).unwrap(), *text);
        }
        let env = boot.env(Some("/a:/b".into()));
        assert_eq!(
            env[0].1,
            OsString::from(format!("{}/slo_probe/_boot:/a:/b", dir.display()))
        );
        assert_eq!(env[1].1, dir.clone().into_os_string());
        assert_eq!(
            boot.env(Some("".into()))[0].1,
            dir.join("slo_probe/_boot").into_os_string()
        );
        drop(boot);
        assert!(!dir.exists());
    }

    /// Every module the package imports at its top is written (a new module of the package
    /// must be added to FILES, or `slo-probe run`'s copy fails to import).
    #[test]
    fn every_module_of_the_package_is_written() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../python/slo_probe");
        for entry in std::fs::read_dir(&root).unwrap() {
            let name = entry.unwrap().file_name().into_string().unwrap();
            if name.ends_with(".py") {
                let rel = format!("slo_probe/{name}");
                assert!(
                    FILES.iter().any(|(r, _)| *r == rel),
                    "{rel} is not in python_boot::FILES"
                );
            }
        }
    }
}
