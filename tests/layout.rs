//! Plain tier: the module layout stays acyclic. Every `crate::…`, `super::…` and `self::…` path
//! in `agent/src` and `core/src` (outside `#[cfg(test)]` modules) is an edge from the module
//! that contains it to the module it names, at the granularity of the folder table in README:
//! a top-level module of the crate (`collector`, `config`, `core`'s `slo`, …), or the second
//! level under the stage folders (`sources::shim`, `exporters::otlp`, `cli::observe`, …); the
//! files inside one such unit may reference each other freely. A cycle between units fails
//! the test and is printed.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

/// Folders whose children are units of their own.
const STAGES: [&str; 5] = ["sources", "exporters", "cli", "api", "healer"];

/// The module path of a source file (`sources/shim/transport.rs` → `sources::shim::transport`).
fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).expect("under src");
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_owned())
        .collect();
    if parts
        .last()
        .is_some_and(|p| p == "mod" || p == "lib" || p == "main")
    {
        parts.pop();
    }
    parts
}

/// Whether `path` names a module of the crate (a file or a folder).
fn is_module(src: &Path, path: &[String]) -> bool {
    let mut p = src.to_path_buf();
    for seg in path {
        p.push(seg);
    }
    p.with_extension("rs").exists() || p.join("mod.rs").exists()
}

/// The unit a module path belongs to.
fn unit_of(src: &Path, path: &[String]) -> Option<String> {
    let first = path.first()?;
    if !is_module(src, &path[..1]) {
        return None; // an item of the crate root (`crate::error_chain`)
    }
    if STAGES.contains(&first.as_str()) && path.len() > 1 && is_module(src, &path[..2]) {
        return Some(format!("{}::{}", path[0], path[1]));
    }
    Some(first.clone())
}

/// The source without its `#[cfg(test)] mod tests` block and comments.
fn code_of(text: &str) -> String {
    let text = [
        "#[cfg(test)]\nmod tests",
        "#[cfg(test)]\npub(crate) mod tests",
    ]
    .iter()
    .filter_map(|m| text.find(m))
    .min()
    .map_or(text, |i| &text[..i]);
    text.lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Expands a use tree (`a::{b, c::{d, e}}`) into paths.
fn expand(tree: &str) -> Vec<String> {
    let tree = tree.trim();
    let Some(open) = tree.find('{') else {
        return vec![tree.split(" as ").next().unwrap_or(tree).trim().to_owned()];
    };
    let prefix = tree[..open].trim_end_matches("::").trim();
    let close = tree.rfind('}').filter(|&c| c > open).unwrap_or(tree.len());
    let inner = &tree[open + 1..close];
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    parts
        .into_iter()
        .filter(|p| !p.trim().is_empty())
        .flat_map(expand)
        .map(|p| {
            if p == "self" {
                prefix.to_owned()
            } else {
                format!("{prefix}::{p}")
            }
        })
        .collect()
}

/// Every path the code names starting at `crate`, `super` or `self`.
fn paths_in(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    // `use` statements (at the start of a line), with their trees.
    let mut at = 0;
    while at < code.len() {
        let line_end = code[at..].find('\n').map_or(code.len(), |i| at + i);
        let line = code[at..line_end].trim_start();
        let stmt = ["use ", "pub use ", "pub(crate) use ", "pub(super) use "]
            .iter()
            .find_map(|p| line.strip_prefix(p));
        if let Some(stmt) = stmt {
            let start = line_end - line.len() + (line.len() - stmt.len());
            let end = code[start..].find(';').map_or(code.len(), |i| start + i);
            out.extend(expand(&code[start..end]));
            at = end + 1;
        } else {
            at = line_end + 1;
        }
    }
    // Paths in code (`crate::sources::procfs::stat(...)`).
    for anchor in ["crate::", "super::", "self::"] {
        let mut rest = code;
        while let Some(i) = rest.find(anchor) {
            let before = rest[..i].chars().last();
            let tail = &rest[i..];
            let end = tail
                .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(tail.len());
            // `super::{a, b}`: a use tree, which the statements above expanded.
            let tree = tail[end..].starts_with('{');
            if !tree && !before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                out.push(tail[..end].trim_end_matches(':').to_owned());
            }
            rest = &rest[i + anchor.len()..];
        }
    }
    out
}

/// Resolves a path named in module `here` to a path from the crate root.
fn resolve(here: &[String], path: &str, is_dir_module: bool) -> Option<Vec<String>> {
    let segs: Vec<&str> = path.split("::").filter(|s| !s.is_empty()).collect();
    let (base, rest): (Vec<String>, &[&str]) = match *segs.first()? {
        "crate" => (Vec::new(), &segs[1..]),
        "self" => (here.to_vec(), &segs[1..]),
        "super" => {
            let mut b = here.to_vec();
            let mut k = 0;
            while segs.get(k) == Some(&"super") {
                b.pop();
                k += 1;
            }
            let _ = is_dir_module;
            (b, &segs[k..])
        }
        _ => return None,
    };
    let mut p = base;
    p.extend(rest.iter().map(|s| s.to_string()));
    Some(p)
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("read_dir").flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The unit graph of one crate.
fn graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in files {
        let module = module_of(src, &f);
        let Some(from) = unit_of(src, &module) else {
            continue;
        };
        let text = std::fs::read_to_string(&f).expect("read");
        let dir_module = f.file_name().is_some_and(|n| n == "mod.rs");
        for path in paths_in(&code_of(&text)) {
            let Some(to) = resolve(&module, &path, dir_module).and_then(|p| unit_of(src, &p))
            else {
                continue;
            };
            if to != from {
                g.entry(from.clone()).or_default().insert(to);
            }
        }
        g.entry(from).or_default();
    }
    g
}

/// A cycle in `g`, if there is one.
fn find_cycle(g: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        g: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(n.to_owned(), 1);
        stack.push(n.to_owned());
        for m in g.get(n).into_iter().flatten() {
            match state.get(m.as_str()).copied().unwrap_or(0) {
                1 => {
                    let at = stack.iter().position(|s| s == m).unwrap_or(0);
                    let mut c = stack[at..].to_vec();
                    c.push(m.clone());
                    return Some(c);
                }
                0 => {
                    if let Some(c) = visit(m, g, state, stack) {
                        return Some(c);
                    }
                }
                _ => {}
            }
        }
        stack.pop();
        state.insert(n.to_owned(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for n in g.keys() {
        if state.get(n.as_str()).copied().unwrap_or(0) == 0 {
            if let Some(c) = visit(n, g, &mut state, &mut Vec::new()) {
                return Some(c);
            }
        }
    }
    None
}

#[test]
fn modules_form_no_import_cycle() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut failures = Vec::new();
    for krate in ["agent/src", "core/src"] {
        let g = graph(&root.join(krate));
        if std::env::var_os("SLO_PROBE_LAYOUT_DEBUG").is_some() {
            for (k, v) in &g {
                eprintln!("{krate}: {k} -> {v:?}");
            }
        }
        assert!(g.len() > 5, "{krate}: {g:?}");
        if let Some(c) = find_cycle(&g) {
            failures.push(format!("{krate}: {}", c.join(" -> ")));
        }
    }
    assert!(
        failures.is_empty(),
        "import cycles: {}",
        failures.join("; ")
    );
}

#[test]
fn the_checker_sees_a_cycle() {
    let g: BTreeMap<String, BTreeSet<String>> = [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a"]),
        ("d", vec![]),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.into_iter().map(str::to_owned).collect()))
    .collect();
    assert_eq!(
        find_cycle(&g),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
    assert_eq!(
        expand("crate::{collector::{self, Collector}, config::Config}"),
        vec![
            "crate::collector",
            "crate::collector::Collector",
            "crate::config::Config"
        ]
    );
    assert_eq!(
        resolve(&["sources".into(), "shim".into()], "super::procfs::x", true),
        Some(vec!["sources".into(), "procfs".into(), "x".into()])
    );
}
