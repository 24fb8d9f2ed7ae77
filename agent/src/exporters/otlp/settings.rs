//! The exporter's settings: the `[otlp]` section resolved against the standard
//! `OTEL_EXPORTER_OTLP_*` variables, once, before the agent starts anything.

use std::time::Duration;

use crate::config::{OtlpConfig, OtlpProtocol};

use super::OtlpError;

/// Metric export period and export timeout when neither the config nor the environment sets
/// one (the OpenTelemetry defaults).
const DEFAULT_INTERVAL: Duration = Duration::from_secs(10);
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// The exporter's settings, resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    /// Transport.
    pub protocol: OtlpProtocol,
    /// Base endpoint (`None`: `OTEL_EXPORTER_OTLP_*ENDPOINT`, which the SDK's exporters read,
    /// then the transport's default on localhost).
    pub endpoint: Option<String>,
    /// Metric export period.
    pub interval: Duration,
    /// Export timeout.
    pub timeout: Duration,
    /// Whether violations go out as traces.
    pub traces: bool,
    /// Whether the healer's audit events go out as log records.
    pub logs: bool,
}

/// The variables [`Settings::resolve`] reads, as a lookup (the process environment in the
/// agent, a table in tests).
pub trait Env {
    /// A variable's value, when set and not empty.
    fn var(&self, name: &str) -> Option<String>;
}

/// The process environment.
pub struct ProcessEnv;

impl Env for ProcessEnv {
    fn var(&self, name: &str) -> Option<String> {
        std::env::var(name).ok().filter(|v| !v.is_empty())
    }
}

impl Settings {
    /// From the config section and the process environment; `Ok(None)` when OTLP is off.
    pub fn resolve(c: &OtlpConfig) -> Result<Option<Self>, OtlpError> {
        Self::resolve_with(c, &ProcessEnv)
    }

    /// From the config section and `env`.
    pub fn resolve_with(c: &OtlpConfig, env: &impl Env) -> Result<Option<Self>, OtlpError> {
        let env_endpoint = [
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        ]
        .iter()
        .any(|v| env.var(v).is_some());
        let on = c.enabled.unwrap_or(env_endpoint || !c.endpoint.is_empty());
        if !on {
            return Ok(None);
        }
        // What the SDK would read from the environment is checked as the config is.
        if c.endpoint.is_empty() {
            for var in [
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            ] {
                if let Some(v) = env.var(var) {
                    crate::config::check_otlp_endpoint(&v).map_err(|why| {
                        OtlpError::EndpointVariable {
                            var,
                            value: crate::clip(&v),
                            why,
                        }
                    })?;
                }
            }
        }
        let millis = |configured: u64, var: &str, positive: bool| {
            if configured > 0 {
                return Some(Duration::from_millis(configured));
            }
            env.var(var)
                .and_then(|v| v.trim().parse::<u64>().ok())
                .filter(|&ms| ms > 0 || !positive)
                .map(Duration::from_millis)
        };
        Ok(Some(Self {
            protocol: protocol(&c.protocol, env)?,
            endpoint: (!c.endpoint.is_empty()).then(|| c.endpoint.clone()),
            interval: millis(c.interval_ms, "OTEL_METRIC_EXPORT_INTERVAL", true)
                .unwrap_or(DEFAULT_INTERVAL),
            timeout: millis(c.timeout_ms, "OTEL_EXPORTER_OTLP_TIMEOUT", false)
                .unwrap_or(DEFAULT_TIMEOUT),
            traces: c.traces,
            logs: c.logs,
        }))
    }
}

/// The transport: the config's, then `OTEL_EXPORTER_OTLP_PROTOCOL`, then gRPC.
fn protocol(configured: &str, env: &impl Env) -> Result<OtlpProtocol, OtlpError> {
    if !configured.is_empty() {
        return OtlpProtocol::parse(configured).ok_or_else(|| OtlpError::Protocol {
            value: crate::clip(configured),
        });
    }
    match env.var("OTEL_EXPORTER_OTLP_PROTOCOL") {
        Some(v) => OtlpProtocol::parse(&v).ok_or_else(|| OtlpError::ProtocolVariable {
            value: crate::clip(&v),
        }),
        None => Ok(OtlpProtocol::Grpc),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Table(&'static [(&'static str, &'static str)]);

    impl Env for Table {
        fn var(&self, name: &str) -> Option<String> {
            self.0
                .iter()
                .find(|(k, v)| *k == name && !v.is_empty())
                .map(|(_, v)| (*v).to_owned())
        }
    }

    fn config(protocol: &str, endpoint: &str) -> OtlpConfig {
        OtlpConfig {
            protocol: protocol.into(),
            endpoint: endpoint.into(),
            ..OtlpConfig::default()
        }
    }

    #[test]
    fn off_without_an_endpoint_anywhere() {
        assert!(matches!(
            Settings::resolve_with(&config("", ""), &Table(&[])),
            Ok(None)
        ));
        let forced = OtlpConfig {
            enabled: Some(false),
            ..config("", "http://otel:4317")
        };
        assert!(matches!(
            Settings::resolve_with(&forced, &Table(&[])),
            Ok(None)
        ));
    }

    #[test]
    fn transport_from_config_or_environment() {
        let env = Table(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://otel:4318"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ("OTEL_METRIC_EXPORT_INTERVAL", "2500"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "0"),
        ]);
        let s = Settings::resolve_with(&config("", ""), &env)
            .expect("valid")
            .expect("on: the environment names an endpoint");
        assert_eq!(s.protocol, OtlpProtocol::HttpProtobuf);
        assert_eq!(s.endpoint, None);
        assert_eq!(s.interval, Duration::from_millis(2500));
        assert_eq!(s.timeout, Duration::ZERO);
        let s = Settings::resolve_with(&config("GRPC", "http://otel:4317"), &env)
            .expect("valid")
            .expect("on");
        assert_eq!(s.protocol, OtlpProtocol::Grpc, "the config wins");
        assert_eq!(s.endpoint.as_deref(), Some("http://otel:4317"));
        let s = Settings::resolve_with(&config("", "http://otel:4317"), &Table(&[]))
            .expect("valid")
            .expect("on");
        assert_eq!(
            (s.protocol, s.interval, s.timeout),
            (OtlpProtocol::Grpc, DEFAULT_INTERVAL, DEFAULT_TIMEOUT)
        );
    }

    #[test]
    fn an_unknown_protocol_names_where_it_came_from() {
        let e = Settings::resolve_with(&config("http/json", "http://otel:4318"), &Table(&[]))
            .expect_err("refused");
        assert!(
            e.to_string().starts_with("otlp.protocol = \"http/json\""),
            "{e}"
        );
        let env = Table(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://otel:4318"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
        ]);
        let e = Settings::resolve_with(&config("", ""), &env).expect_err("refused");
        assert!(
            e.to_string()
                .starts_with("OTEL_EXPORTER_OTLP_PROTOCOL=\"http/json\""),
            "{e}"
        );
    }
}
