//! Classic tracepoint formats: the field offsets of the classic network tracepoints, read from
//! `/sys/kernel/tracing/events/<category>/<name>/format` so that the eBPF programs read the right
//! bytes on any kernel (the offsets moved between releases).

use std::{collections::HashMap, path::Path};

use slo_probe_common::NetTpOffsets;

use super::preflight::TRACEFS;

/// Errors reading a tracepoint format.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    /// The format file could not be read.
    #[error(
        "cannot read tracepoint format {path}: {source}; mount tracefs \
         (`sudo mount -t tracefs nodev {TRACEFS}`), point probes.tcp.tracefs at its mount, or \
         set probes.tcp.enabled = false"
    )]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A field the programs need is missing or has another size.
    #[error(
        "tracepoint {tracepoint} has no field {field} of {size} bytes (kernel too old or too new)"
    )]
    Field {
        /// `category/name`.
        tracepoint: String,
        /// The field.
        field: &'static str,
        /// The size the programs read.
        size: u32,
    },
}

/// Parses a format file into `name → (offset, size)`.
pub fn parse_format(text: &str) -> HashMap<String, (u32, u32)> {
    let mut out = HashMap::new();
    for line in text.lines() {
        let line = line.trim();
        let Some(rest) = line.strip_prefix("field:") else {
            continue;
        };
        let mut parts = rest.split(';').map(str::trim);
        let Some(decl) = parts.next() else { continue };
        // `__u8 saddr[4]`, `const void * skaddr`: the name is the last word, minus any `[n]`.
        let name = decl
            .rsplit(|c: char| c.is_whitespace() || c == '*')
            .next()
            .unwrap_or("")
            .split('[')
            .next()
            .unwrap_or("");
        let mut offset = None;
        let mut size = None;
        for p in parts {
            if let Some(v) = p.strip_prefix("offset:") {
                offset = v.parse().ok();
            } else if let Some(v) = p.strip_prefix("size:") {
                size = v.parse().ok();
            }
        }
        if let (Some(o), Some(s)) = (offset, size) {
            out.insert(name.to_owned(), (o, s));
        }
    }
    out
}

/// Reads `category/name`'s format from tracefs.
pub fn read_format(
    tracefs: &Path,
    tracepoint: &str,
) -> Result<HashMap<String, (u32, u32)>, FormatError> {
    let path = tracefs.join("events").join(tracepoint).join("format");
    let text = std::fs::read_to_string(&path).map_err(|source| FormatError::Read {
        path: path.display().to_string(),
        source,
    })?;
    Ok(parse_format(&text))
}

/// The offsets the network programs need, from formats given by `format(tracepoint)`.
pub fn net_offsets(
    mut format: impl FnMut(&str) -> Result<HashMap<String, (u32, u32)>, FormatError>,
) -> Result<NetTpOffsets, FormatError> {
    let mut o = NetTpOffsets::default();
    for tp in ["sock/sock_send_length", "sock/sock_recv_length"] {
        let f = format(tp)?;
        let get = |field, size| lookup(&f, tp, field, size);
        let (sk, family, protocol, ret) = (
            get("sk", 8)?,
            get("family", 2)?,
            get("protocol", 2)?,
            get("ret", 4)?,
        );
        // One set of offsets serves both programs: the formats must agree.
        if tp.ends_with("recv_length")
            && (sk, family, protocol, ret)
                != (o.sock_sk, o.sock_family, o.sock_protocol, o.sock_ret)
        {
            return Err(FormatError::Field {
                tracepoint: tp.to_owned(),
                field: "sk/family/protocol/ret (differs from sock_send_length)",
                size: 0,
            });
        }
        (o.sock_sk, o.sock_family, o.sock_protocol, o.sock_ret) = (sk, family, protocol, ret);
    }
    {
        let tp = "sock/inet_sock_set_state";
        let f = format(tp)?;
        let get = |field, size| lookup(&f, tp, field, size);
        o.state_skaddr = get("skaddr", 8)?;
        o.state_newstate = get("newstate", 4)?;
        o.state_sport = get("sport", 2)?;
        o.state_dport = get("dport", 2)?;
        o.state_family = get("family", 2)?;
        o.state_protocol = get("protocol", 2)?;
        o.state_saddr = get("saddr", 4)?;
        o.state_daddr = get("daddr", 4)?;
        o.state_saddr_v6 = get("saddr_v6", 16)?;
        o.state_daddr_v6 = get("daddr_v6", 16)?;
    }
    {
        let tp = "tcp/tcp_probe";
        let f = format(tp)?;
        let get = |field, size| lookup(&f, tp, field, size);
        o.probe_skaddr = get("skaddr", 8)?;
        o.probe_srtt = get("srtt", 4)?;
        o.probe_snd_cwnd = get("snd_cwnd", 4)?;
        o.probe_sport = get("sport", 2)?;
        o.probe_dport = get("dport", 2)?;
        o.probe_family = get("family", 2)?;
        o.probe_saddr = get("saddr", 28)?;
        o.probe_daddr = get("daddr", 28)?;
    }
    Ok(o)
}

fn lookup(
    f: &HashMap<String, (u32, u32)>,
    tracepoint: &str,
    field: &'static str,
    size: u32,
) -> Result<u32, FormatError> {
    match f.get(field) {
        Some(&(offset, s)) if s == size => Ok(offset),
        _ => Err(FormatError::Field {
            tracepoint: tracepoint.to_owned(),
            field,
            size,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(tp: &str) -> Result<HashMap<String, (u32, u32)>, FormatError> {
        let name = tp.rsplit('/').next().unwrap_or(tp);
        let path = format!(
            "{}/../tests/fixtures/tracefs/{name}.format",
            env!("CARGO_MANIFEST_DIR")
        );
        Ok(parse_format(
            &std::fs::read_to_string(path).expect("fixture"),
        ))
    }

    /// Formats recorded from kernel 6.18.
    #[test]
    fn offsets_from_recorded_formats() {
        let o = net_offsets(fixture).expect("offsets");
        assert_eq!(o.sock_ret, 20);
        assert_eq!(o.state_newstate, 20);
        assert_eq!(o.probe_srtt, 100);
        assert_eq!(o.probe_skaddr, 128);
        assert_eq!(o.probe_saddr, 8);
    }

    #[test]
    fn a_missing_field_is_named() {
        let err = net_offsets(|tp| {
            let mut f = fixture(tp)?;
            f.remove("srtt");
            Ok(f)
        })
        .expect_err("srtt removed");
        assert!(err.to_string().contains("srtt"), "{err}");
    }

    #[test]
    fn a_missing_tracefs_says_how_to_mount_it() {
        let err = read_format(Path::new("/nonexistent"), "tcp/tcp_probe").expect_err("missing");
        assert!(err.to_string().contains("mount -t tracefs"), "{err}");
    }
}
