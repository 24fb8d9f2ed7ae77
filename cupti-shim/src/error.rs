//! The shim's errors: why CUPTI could not be found, subscribed to, or switched. Each message
//! names the thing and what to do; the shim prints it on stderr and keeps the job running.

use std::fmt;

/// A CUPTI result code with CUPTI's own text for it (`cuptiGetResultString`), when it has one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CuptiStatus {
    /// The raw `CUptiResult`.
    pub code: u32,
    /// CUPTI's text for it.
    pub text: Option<String>,
}

impl fmt::Display for CuptiStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.text {
            Some(t) => write!(f, "{t} ({})", self.code),
            None => write!(f, "CUPTI error {}", self.code),
        }
    }
}

/// Errors of the shim's CUPTI side.
#[derive(Debug, thiserror::Error)]
pub enum ShimError {
    /// No libcupti in the process or on the library path.
    #[error("libcupti.so.13 is neither loaded in the process nor on the library path")]
    NoLibcupti,
    /// No CUDA driver (`libcuda.so.1`) in the process or on the library path: a machine
    /// without a GPU driver. libcupti is then not called at all.
    #[error("no CUDA driver (libcuda.so.1 is neither loaded nor on the library path)")]
    NoDriver,
    /// A libcupti without a function the shim calls (older than CUPTI 13).
    #[error(
        "libcupti has no {symbol}: it is older than CUPTI 13 (CUDA 13.0); use a PyTorch built \
         for CUDA 13 or put CUPTI 13 first on the library path"
    )]
    MissingSymbol {
        /// The function's name.
        symbol: &'static str,
    },
    /// Tracing was asked for but no libcupti was loaded at start.
    #[error("libcupti not available")]
    Unavailable,
    /// Another CUPTI subscriber was first.
    #[error(
        "CUPTI already has a subscriber in this process (torch.profiler / Kineto, Nsight, or \
         another tool started first): GPU tracing is off for pid {pid}. Start that tool inside \
         `slo_probe.cupti_released()`, or let the shim initialise first (it does at cuInit when \
         injected with CUDA_INJECTION64_PATH)"
    )]
    LostRace {
        /// This process.
        pid: u32,
    },
    /// Kernel activity is switched at drained moments (`SLO_PROBE_TOGGLE_AT_SYNC`) and no
    /// thread left a synchronising call within the wait, so it was left as it is.
    #[error(
        "no drained moment (the exit of a synchronising call) came in time: kernel activity left \
         as it is until one comes (SLO_PROBE_TOGGLE_AT_SYNC=0 holds kernel tracing on instead)"
    )]
    NotDrained,
    /// A CUPTI call failed.
    #[error("{call} failed: {status}")]
    Cupti {
        /// The call, with its argument where it says which (`cuptiActivityEnable(10)`).
        call: String,
        /// What CUPTI returned.
        status: CuptiStatus,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_call_and_the_way_out() {
        let e = ShimError::Cupti {
            call: "cuptiActivityEnable(10)".into(),
            status: CuptiStatus {
                code: 1,
                text: Some("CUPTI_ERROR_INVALID_PARAMETER".into()),
            },
        };
        assert_eq!(
            e.to_string(),
            "cuptiActivityEnable(10) failed: CUPTI_ERROR_INVALID_PARAMETER (1)"
        );
        let s = CuptiStatus {
            code: 7,
            text: None,
        };
        assert_eq!(s.to_string(), "CUPTI error 7");
        let race = ShimError::LostRace { pid: 42 }.to_string();
        assert!(race.contains("pid 42") && race.contains("slo_probe.cupti_released()"));
    }
}
