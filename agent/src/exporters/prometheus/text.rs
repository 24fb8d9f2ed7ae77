//! The text exposition format (0.0.4) as a [`Sink`] of the metric model: `# HELP` and
//! `# TYPE` per family, `name{label="value",...} value` per sample, label values escaped;
//! histograms as cumulative `_bucket` lines (`le`, then `+Inf`), `_sum` and `_count`.

use std::fmt::Write as _;

use crate::exporters::model::{Family, Histogram, Label, Sink};

/// Appends the exposition of what it is given to a string.
pub struct TextSink<'a> {
    out: &'a mut String,
}

impl<'a> TextSink<'a> {
    /// Appends to `out`.
    pub fn new(out: &'a mut String) -> Self {
        Self { out }
    }

    /// Writes a label value, escaping backslash, double quote and newline.
    fn escaped(&mut self, value: &str) {
        for c in value.chars() {
            match c {
                '\\' => self.out.push_str("\\\\"),
                '"' => self.out.push_str("\\\""),
                '\n' => self.out.push_str("\\n"),
                c => self.out.push(c),
            }
        }
    }

    /// `name{a="x",b="y"[,le="…"]}` (no braces without labels).
    fn series(&mut self, name: &str, suffix: &str, labels: &[Label<'_>], le: Option<&str>) {
        self.out.push_str(name);
        self.out.push_str(suffix);
        if labels.is_empty() && le.is_none() {
            return;
        }
        self.out.push('{');
        let le = le.map(|v| ("le", v));
        for (k, (key, value)) in labels.iter().copied().chain(le).enumerate() {
            if k > 0 {
                self.out.push(',');
            }
            self.out.push_str(key);
            self.out.push_str("=\"");
            self.escaped(value);
            self.out.push('"');
        }
        self.out.push('}');
    }
}

impl Sink for TextSink<'_> {
    fn family(&mut self, f: &'static Family) {
        let _ = writeln!(self.out, "# HELP {} {}", f.name, f.help);
        let _ = writeln!(self.out, "# TYPE {} {}", f.name, f.kind.as_str());
    }

    fn sample(&mut self, f: &'static Family, labels: &[Label<'_>], value: f64) {
        self.series(f.name, "", labels, None);
        let _ = writeln!(self.out, " {value}");
    }

    fn histogram(&mut self, f: &'static Family, labels: &[Label<'_>], h: &Histogram<'_>) {
        let mut le = String::new();
        for (bound, n) in h.buckets {
            le.clear();
            let _ = write!(le, "{bound}");
            self.series(f.name, "_bucket", labels, Some(&le));
            let _ = writeln!(self.out, " {n}");
        }
        self.series(f.name, "_bucket", labels, Some("+Inf"));
        let _ = writeln!(self.out, " {}", h.count);
        self.series(f.name, "_sum", labels, None);
        let _ = writeln!(self.out, " {}", h.sum);
        self.series(f.name, "_count", labels, None);
        let _ = writeln!(self.out, " {}", h.count);
    }
}
