//! The OTLP resources: the node's (service, host, the agent's own Kubernetes pod and node, and
//! what `OTEL_RESOURCE_ATTRIBUTES` / `OTEL_SERVICE_NAME` add), made once when the exporter
//! starts; and one per training process: the node's attributes plus what the process is, from
//! its snapshot (its identity was read when its shim registered). Nothing here reads `/proc` or
//! the environment after the exporter has started.

use opentelemetry::KeyValue;
use opentelemetry_sdk::Resource;
use slo_probe_core::snapshot::ProcessSnapshot;

/// The node's resource: service, host, and the agent's own Kubernetes pod and node (downward
/// API: `K8S_POD_NAME`, `K8S_NAMESPACE`, `K8S_NODE_NAME`). The SDK adds
/// `OTEL_RESOURCE_ATTRIBUTES`; `OTEL_SERVICE_NAME` (or a `service.name` there) wins over
/// `slo-probe`.
pub(super) fn node() -> Resource {
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default();
    let mut attrs = vec![
        KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
        KeyValue::new("service.instance.id", host.clone()),
        KeyValue::new("host.name", host),
    ];
    if let Ok(id) = std::fs::read_to_string("/etc/machine-id") {
        if !id.trim().is_empty() {
            attrs.push(KeyValue::new("host.id", id.trim().to_owned()));
        }
    }
    for (var, key) in [
        ("K8S_NODE_NAME", "k8s.node.name"),
        ("K8S_POD_NAME", "k8s.pod.name"),
        ("K8S_NAMESPACE", "k8s.namespace.name"),
    ] {
        if let Some(v) = env(var) {
            attrs.push(KeyValue::new(key, v));
        }
    }
    let env_names_service = env("OTEL_SERVICE_NAME").is_some()
        || env("OTEL_RESOURCE_ATTRIBUTES").is_some_and(|s| s.contains("service.name="));
    let mut b = Resource::builder();
    if !env_names_service {
        b = b.with_service_name("slo-probe");
    }
    b.with_attributes(attrs).build()
}

/// What a training process is, as resource attributes.
fn process_attributes(p: &ProcessSnapshot) -> Vec<KeyValue> {
    let mut a = vec![KeyValue::new("process.pid", i64::from(p.pid))];
    for (key, value) in [
        ("process.executable.name", &p.executable),
        ("slo_probe.job.id", &p.job_id),
        ("hw.id", &p.gpu_uuid),
        ("k8s.pod.uid", &p.pod_uid),
        ("k8s.pod.name", &p.pod_name),
        ("k8s.namespace.name", &p.pod_namespace),
    ] {
        if let Some(v) = value {
            a.push(KeyValue::new(key, v.clone()));
        }
    }
    if let Some(r) = p.rank {
        a.push(KeyValue::new("slo_probe.rank", i64::from(r)));
    }
    if p.gpu_uuid.is_some() {
        a.push(KeyValue::new("hw.type", "gpu"));
    }
    a
}

/// A training process's resource: the node's attributes, then its own (which win: its pod,
/// not the agent's).
pub(super) fn process(node: &Resource, p: &ProcessSnapshot) -> Resource {
    let inherited = node
        .iter()
        .map(|(k, v)| KeyValue::new(k.clone(), v.clone()));
    Resource::builder_empty()
        .with_attributes(inherited)
        .with_attributes(process_attributes(p))
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::{Key, Value};

    #[test]
    fn a_process_resource_is_the_node_plus_what_the_process_is() {
        let node = Resource::builder_empty()
            .with_attributes([
                KeyValue::new("service.name", "slo-probe"),
                KeyValue::new("host.name", "gpu-7"),
                KeyValue::new("k8s.pod.name", "slo-probe-agent-x"),
            ])
            .build();
        let p = ProcessSnapshot {
            pid: 4100,
            rank: Some(3),
            job_id: Some("llama".into()),
            executable: Some("python3".into()),
            pod_uid: Some("8f1c2d3e-1111-2222-3333-444455556666".into()),
            pod_name: Some("trainer-3".into()),
            pod_namespace: Some("ml".into()),
            gpu_uuid: Some("GPU-8d6c1f2e".into()),
            ..ProcessSnapshot::default()
        };
        let r = process(&node, &p);
        let get = |k: &'static str| r.get(&Key::from_static_str(k));
        assert_eq!(get("service.name"), Some(Value::from("slo-probe")));
        assert_eq!(get("host.name"), Some(Value::from("gpu-7")));
        assert_eq!(get("k8s.pod.name"), Some(Value::from("trainer-3")));
        assert_eq!(get("process.pid"), Some(Value::I64(4100)));
        assert_eq!(get("slo_probe.rank"), Some(Value::I64(3)));
        assert_eq!(get("slo_probe.job.id"), Some(Value::from("llama")));
        assert_eq!(get("process.executable.name"), Some(Value::from("python3")));
        assert_eq!(get("hw.id"), Some(Value::from("GPU-8d6c1f2e")));
        assert_eq!(get("hw.type"), Some(Value::from("gpu")));
        assert_eq!(get("k8s.namespace.name"), Some(Value::from("ml")));
        let bare = process(&node, &ProcessSnapshot::default());
        assert_eq!(bare.get(&Key::from_static_str("hw.type")), None);
        assert_eq!(bare.get(&Key::from_static_str("slo_probe.rank")), None);
    }
}
