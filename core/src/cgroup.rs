//! CPU throttling of the job's cgroups and pressure stall information (PSI): parsing of the
//! kernel's text files (the agent reads them), cgroup v1 and v2 alike.
//!
//! v1 `cpu.stat`: `nr_periods`, `nr_throttled`, `throttled_time` (ns). v2 `cpu.stat`:
//! `nr_periods`, `nr_throttled`, `throttled_usec`. PSI (`/proc/pressure/*`, v2 `*.pressure`):
//! `some ... total=<µs>` and `full ... total=<µs>`.

use crate::roles::Role;

/// CFS bandwidth counters of one cgroup.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuStat {
    /// Enforcement periods elapsed with the group runnable.
    pub nr_periods: u64,
    /// Periods in which the group was throttled.
    pub nr_throttled: u64,
    /// Total time throttled, ns.
    pub throttled_ns: u64,
}

/// Parses `cpu.stat` (v1 or v2). Unknown lines are ignored; `None` when no throttling field is
/// present (no CFS bandwidth control on that controller).
pub fn parse_cpu_stat(text: &str) -> Option<CpuStat> {
    let mut s = CpuStat::default();
    let mut seen = false;
    for line in text.lines() {
        let mut f = line.split_whitespace();
        let (Some(key), Some(value)) = (f.next(), f.next().and_then(|v| v.parse::<u64>().ok()))
        else {
            continue;
        };
        match key {
            "nr_periods" => s.nr_periods = value,
            "nr_throttled" => {
                s.nr_throttled = value;
                seen = true;
            }
            "throttled_time" => s.throttled_ns = value,
            "throttled_usec" => s.throttled_ns = value.saturating_mul(1000),
            _ => {}
        }
    }
    seen.then_some(s)
}

/// A CFS bandwidth limit: `quota` µs of CPU per `period` µs; `None` quota = unlimited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuLimit {
    /// µs per period, `None` when unlimited.
    pub quota_us: Option<u64>,
    /// Period, µs.
    pub period_us: u64,
}

impl CpuLimit {
    /// The limit in CPUs (`quota / period`), `None` when unlimited.
    pub fn cpus(&self) -> Option<f64> {
        self.quota_us
            .filter(|_| self.period_us > 0)
            .map(|q| q as f64 / self.period_us as f64)
    }
}

/// Parses v2 `cpu.max` (`max 100000` or `50000 100000`).
pub fn parse_cpu_max(text: &str) -> Option<CpuLimit> {
    let mut f = text.split_whitespace();
    let quota = f.next()?;
    let period = f.next()?.parse().ok()?;
    let quota_us = if quota == "max" {
        None
    } else {
        Some(quota.parse().ok()?)
    };
    Some(CpuLimit {
        quota_us,
        period_us: period,
    })
}

/// Builds a limit from v1 `cpu.cfs_quota_us` (-1 = unlimited) and `cpu.cfs_period_us`.
pub fn cpu_limit_v1(quota: &str, period: &str) -> Option<CpuLimit> {
    let quota: i64 = quota.trim().parse().ok()?;
    let period: u64 = period.trim().parse().ok()?;
    Some(CpuLimit {
        quota_us: u64::try_from(quota).ok(),
        period_us: period,
    })
}

/// Cumulative stall times of one resource.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pressure {
    /// Time some runnable task was stalled, µs.
    pub some_us: u64,
    /// Time all non-idle tasks were stalled, µs (0 where the kernel reports no `full` line).
    pub full_us: u64,
}

/// Parses a PSI file.
pub fn parse_pressure(text: &str) -> Option<Pressure> {
    let mut p = Pressure::default();
    let mut seen = false;
    for line in text.lines() {
        let mut f = line.split_whitespace();
        let kind = f.next();
        let total = f
            .find_map(|kv| kv.strip_prefix("total="))
            .and_then(|v| v.parse::<u64>().ok());
        match (kind, total) {
            (Some("some"), Some(t)) => {
                p.some_us = t;
                seen = true;
            }
            (Some("full"), Some(t)) => p.full_us = t,
            _ => {}
        }
    }
    seen.then_some(p)
}

/// One cgroup of the job at one tick.
#[derive(Clone, Debug, PartialEq)]
pub struct CgroupRow {
    /// Path inside the hierarchy (`/` for the root), as in `/proc/<pid>/cgroup`.
    pub path: String,
    /// 1 or 2.
    pub version: u8,
    /// Throttling counters (`None` when the controller has no bandwidth control).
    pub cpu: Option<CpuStat>,
    /// The CPU limit, when readable.
    pub limit: Option<CpuLimit>,
    /// CPU pressure of this cgroup (v2 with PSI only).
    pub pressure: Option<Pressure>,
    /// Job processes in it.
    pub pids: Vec<u32>,
    /// Roles of the job's threads in it (sorted, distinct).
    pub roles: Vec<Role>,
}

/// System-wide pressure of one resource.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PressureRow {
    /// `cpu`, `memory` or `io`.
    pub resource: &'static str,
    /// The counters.
    pub pressure: Pressure,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_stat_v1_and_v2() {
        let v1 = "nr_periods 11\nnr_throttled 10\nthrottled_time 912345678\n";
        assert_eq!(
            parse_cpu_stat(v1),
            Some(CpuStat {
                nr_periods: 11,
                nr_throttled: 10,
                throttled_ns: 912_345_678
            })
        );
        let v2 = "usage_usec 100\nuser_usec 60\nsystem_usec 40\nnr_periods 5\nnr_throttled 2\n\
                  throttled_usec 1500\nnr_bursts 0\nburst_usec 0\n";
        assert_eq!(
            parse_cpu_stat(v2),
            Some(CpuStat {
                nr_periods: 5,
                nr_throttled: 2,
                throttled_ns: 1_500_000
            })
        );
        assert_eq!(parse_cpu_stat("usage_usec 5\n"), None);
        assert_eq!(parse_cpu_stat("garbage\n\nnr_throttled x\n"), None);
    }

    #[test]
    fn limits() {
        assert_eq!(parse_cpu_max("max 100000\n").and_then(|l| l.cpus()), None);
        assert_eq!(
            parse_cpu_max("50000 100000\n").and_then(|l| l.cpus()),
            Some(0.5)
        );
        assert_eq!(parse_cpu_max("bogus"), None);
        assert_eq!(
            cpu_limit_v1("-1\n", "100000\n").and_then(|l| l.cpus()),
            None
        );
        assert_eq!(
            cpu_limit_v1("10000", "100000").and_then(|l| l.cpus()),
            Some(0.1)
        );
    }

    #[test]
    fn pressure() {
        let text = "some avg10=0.00 avg60=0.57 avg300=6.32 total=129631745\n\
                    full avg10=0.00 avg60=0.00 avg300=0.00 total=42\n";
        assert_eq!(
            parse_pressure(text),
            Some(Pressure {
                some_us: 129_631_745,
                full_us: 42
            })
        );
        assert_eq!(parse_pressure(""), None);
    }
}
