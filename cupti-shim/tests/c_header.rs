//! The shim's C ABI has one description, `cupti-shim/include/slo_probe_shim.h`; this test checks
//! the three copies that must agree with it, on every `cargo test` (no GPU, no built shim):
//! (a) every `#[no_mangle] pub extern "C" fn` of `src/lib.rs` is declared there with the same
//! argument and return types, and nothing is declared that the shim lacks; (b) the python
//! client's ctypes tables (`_ABI`, `_OPTIONAL_ABI`) name the same functions with the same types
//! and the same blocking flag (header comments that say "Blocks."); (c) the C stub
//! `python/tests/stub_shim.c` defines every function with the same signature.
//!
//! The parsers understand exactly the subset the files use (one declaration per line in the
//! header, fixed-width integer types, pointers) and fail loudly on anything else, so that a new
//! type gets a mapping here rather than a silent pass.

use std::{collections::BTreeMap, path::PathBuf, process::Command};

/// A C signature with canonical type spellings: `void`, `int32_t`, `uint32_t`, `uint64_t`,
/// `size_t`, `const char*`, `uint64_t*`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Sig {
    ret: String,
    args: Vec<String>,
}

impl std::fmt::Display for Sig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.ret, self.args.join(", "))
    }
}

const C_TYPES: [&str; 7] = [
    "void",
    "int32_t",
    "uint32_t",
    "uint64_t",
    "size_t",
    "const char*",
    "uint64_t*",
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("cupti-shim has a parent")
        .to_path_buf()
}

fn read(rel: &str) -> String {
    let p = root().join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("cannot read {}: {e}", p.display()))
}

fn is_abi_name(name: &str) -> bool {
    name.starts_with("slo_probe_") || name == "InitializeInjection"
}

/// Removes `/* */` and `//` comments, preprocessor lines, and the `extern "C" {` guard of C++
/// (`#ifdef __cplusplus` blocks).
fn strip_c(src: &str) -> String {
    let mut out = String::with_capacity(src.len());
    let mut rest = src;
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix("/*") {
            let (inside, after) = r.split_once("*/").unwrap_or((r, ""));
            // Keep line breaks so that preprocessor lines stay lines.
            out.extend(inside.chars().filter(|&c| c == '\n'));
            out.push(' ');
            rest = after;
        } else if let Some(r) = rest.strip_prefix("//") {
            rest = r.split_once('\n').map_or("", |(_, after)| after);
            out.push('\n');
        } else {
            let c = rest.chars().next().expect("non-empty");
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    let mut lines = Vec::new();
    let mut in_cplusplus = false;
    for l in out.lines() {
        let t = l.trim_start();
        if t.starts_with("#ifdef __cplusplus") {
            in_cplusplus = true;
        } else if in_cplusplus && t.starts_with("#endif") {
            in_cplusplus = false;
        } else if !in_cplusplus && !t.starts_with('#') {
            lines.push(l);
        }
    }
    lines.join("\n")
}

/// The one-line comment (`/* ... */` or `// ...` on a line of its own) just above each line
/// that names an ABI function outside comments.
fn comments_above(src: &str) -> BTreeMap<String, String> {
    let mut m = BTreeMap::new();
    let (mut last, mut in_block) = (String::new(), false);
    for line in src.lines() {
        let t = line.trim();
        if in_block {
            in_block = !t.contains("*/");
            continue;
        }
        if t.starts_with("/*") {
            in_block = !t.contains("*/");
            last = if in_block {
                String::new()
            } else {
                t.to_owned()
            };
            continue;
        }
        if t.starts_with("//") {
            last = t.to_owned();
            continue;
        }
        if let Some(name) = t
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .find(|w| is_abi_name(w))
        {
            m.entry(name.to_owned()).or_insert_with(|| last.clone());
        }
        last.clear();
    }
    m
}

/// Canonical spelling of a C type (`const char *` → `const char*`); panics on types outside
/// [`C_TYPES`].
fn c_type(t: &str, what: &str) -> String {
    let mut s = t.split_whitespace().collect::<Vec<_>>().join(" ");
    s = s.replace(" *", "*");
    assert!(
        C_TYPES.contains(&s.as_str()),
        "{what}: C type `{t}` has no mapping in tests/c_header.rs (known: {C_TYPES:?})"
    );
    s
}

/// One C parameter without its name.
fn c_param(p: &str, what: &str) -> String {
    let p = p.trim().replace('*', " * ");
    let mut toks: Vec<&str> = p.split_whitespace().collect();
    if toks.len() >= 2 {
        let last = toks[toks.len() - 1];
        let is_ident = last.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if is_ident && !C_TYPES.contains(&last) && last != "char" {
            toks.pop();
        }
    }
    c_type(&toks.join(" "), what)
}

fn c_params(args: &str, what: &str) -> Vec<String> {
    let a = args.trim();
    if a.is_empty() || a == "void" {
        return Vec::new();
    }
    a.split(',').map(|p| c_param(p, what)).collect()
}

/// The ABI functions declared (`;`) or defined (`{`) at file scope of a C source:
/// name → (signature, the comment line just above it).
fn c_functions(src: &str, file: &str, definitions: bool) -> BTreeMap<String, (Sig, String)> {
    let comment_above = comments_above(src);
    let code = strip_c(src);
    let bytes = code.as_bytes();
    let mut out = BTreeMap::new();
    let (mut depth, mut stmt_start, mut i) = (0i32, 0usize, 0usize);
    while i < bytes.len() {
        let c = bytes[i] as char;
        match c {
            '{' => {
                depth += 1;
                i += 1;
                stmt_start = i;
                continue;
            }
            '}' => {
                depth -= 1;
                i += 1;
                stmt_start = i;
                continue;
            }
            ';' => {
                i += 1;
                stmt_start = i;
                continue;
            }
            _ => {}
        }
        let at_word = (c.is_ascii_alphabetic() || c == '_')
            && (i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_'));
        if depth != 0 || !at_word {
            i += 1;
            continue;
        }
        let end = i + code[i..]
            .find(|ch: char| !(ch.is_ascii_alphanumeric() || ch == '_'))
            .unwrap_or(code.len() - i);
        let name = &code[i..end];
        let after = code[end..].trim_start();
        if !is_abi_name(name) || !after.starts_with('(') {
            i = end;
            continue;
        }
        let open = code.len() - after.len();
        let close = open + code[open..].find(')').expect("a closing parenthesis");
        let next = code[close + 1..].trim_start().chars().next();
        let want = if definitions { '{' } else { ';' };
        assert_eq!(
            next,
            Some(want),
            "{file}: `{name}(...)` is followed by {next:?}, expected `{want}`"
        );
        let what = format!("{file}: {name}");
        let sig = Sig {
            ret: c_type(&code[stmt_start..i], &what),
            args: c_params(&code[open + 1..close], &what),
        };
        let comment = comment_above.get(name).cloned().unwrap_or_default();
        assert!(
            out.insert(name.to_owned(), (sig, comment)).is_none(),
            "{file}: `{name}` appears twice"
        );
        i = close + 1;
    }
    out
}

/// Rust FFI type → canonical C type.
fn rust_type(t: &str, what: &str) -> String {
    let t = t.split_whitespace().collect::<Vec<_>>().join(" ");
    let c = match t.as_str() {
        "" | "()" => "void",
        "i32" => "int32_t",
        "u32" => "uint32_t",
        "u64" => "uint64_t",
        "usize" => "size_t",
        "*const c_char" | "*const std::ffi::c_char" => "const char*",
        "*mut u64" => "uint64_t*",
        _ => panic!("{what}: Rust type `{t}` has no C mapping in tests/c_header.rs"),
    };
    c.to_owned()
}

/// Every `#[no_mangle] pub [unsafe] extern "C" fn` of a Rust source.
fn rust_functions(src: &str) -> BTreeMap<String, Sig> {
    let mut out = BTreeMap::new();
    for (_, rest) in src
        .match_indices("#[no_mangle]")
        .map(|(i, _)| ((), &src[i..]))
    {
        let f = rest.find("fn ").expect("fn after #[no_mangle]");
        let head = &rest[..f];
        assert!(
            head.contains("extern \"C\""),
            "#[no_mangle] item is not an extern \"C\" fn: {}",
            &rest[..rest.len().min(120)]
        );
        let rest = &rest[f + 3..];
        let open = rest.find('(').expect("(");
        let name = rest[..open].trim().to_owned();
        let close = rest.find(')').expect(")");
        let body = rest[close + 1..].find('{').expect("{");
        let what = format!("cupti-shim/src/lib.rs: {name}");
        let ret = rest[close + 1..close + 1 + body]
            .trim()
            .strip_prefix("->")
            .unwrap_or("")
            .trim()
            .to_owned();
        let args = rest[open + 1..close]
            .split(',')
            .map(str::trim)
            .filter(|a| !a.is_empty())
            .map(|a| {
                let (_, ty) = a.split_once(':').expect("name: type");
                rust_type(ty, &what)
            })
            .collect();
        let sig = Sig {
            ret: rust_type(&ret, &what),
            args,
        };
        assert!(out.insert(name.clone(), sig).is_none(), "{name} twice");
    }
    out
}

/// The python client's ctypes tables: name → (restype, argtypes, blocking, optional), as the
/// names ctypes gives the types.
fn python_table() -> BTreeMap<String, (String, Vec<String>, bool, bool)> {
    let script = r#"
import sys
sys.path.insert(0, sys.argv[1])
import slo_probe
def n(t):
    return "None" if t is None else t.__name__
for optional, table in ((0, slo_probe._ABI), (1, slo_probe._OPTIONAL_ABI)):
    for name, (res, args, blocking) in table.items():
        print(name, optional, int(bool(blocking)), n(res), *[n(a) for a in args])
"#;
    let out = Command::new("python3")
        .args(["-c", script, &root().join("python").display().to_string()])
        .env("SLO_PROBE_SHIM", "none")
        .output()
        .unwrap_or_else(|e| {
            panic!("python3 is needed to read python/slo_probe's ctypes tables: {e}")
        });
    assert!(
        out.status.success(),
        "python3 could not import slo_probe: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut m = BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        assert!(w.len() >= 4, "bad line from python: {line}");
        let args = w[4..].iter().map(|s| s.to_string()).collect();
        let dup = m.insert(
            w[0].to_owned(),
            (w[3].to_owned(), args, w[2] == "1", w[1] == "1"),
        );
        assert!(dup.is_none(), "{} is in both _ABI and _OPTIONAL_ABI", w[0]);
    }
    m
}

/// The names ctypes gives a C type (its aliases differ by platform: c_uint64 is c_ulong on
/// LP64 Linux).
fn ctypes_names(c: &str) -> &'static [&'static str] {
    match c {
        "void" => &["None"],
        "int32_t" => &["c_int", "c_int32"],
        "uint32_t" => &["c_uint", "c_uint32"],
        "uint64_t" | "size_t" => &["c_ulong", "c_uint64", "c_ulonglong", "c_size_t"],
        "const char*" => &["c_char_p"],
        "uint64_t*" => &["LP_c_ulong", "LP_c_uint64", "LP_c_ulonglong"],
        _ => panic!("no ctypes mapping for {c}"),
    }
}

fn header() -> BTreeMap<String, (Sig, String)> {
    let h = c_functions(
        &read("cupti-shim/include/slo_probe_shim.h"),
        "slo_probe_shim.h",
        false,
    );
    assert!(
        h.len() > 5,
        "the header parser found only {h:?}: the parser or the header is broken"
    );
    for (name, (_, comment)) in &h {
        assert!(
            !comment.is_empty(),
            "slo_probe_shim.h: {name} needs a one-line comment above it"
        );
    }
    h
}

#[test]
fn header_matches_the_shim() {
    let h = header();
    let rust = rust_functions(&read("cupti-shim/src/lib.rs"));
    for (name, sig) in &rust {
        let Some((decl, _)) = h.get(name) else {
            panic!("cupti-shim/src/lib.rs exports {name} ({sig}), which slo_probe_shim.h lacks");
        };
        assert_eq!(decl, sig, "{name}: header says {decl}, lib.rs has {sig}");
    }
    for name in h.keys() {
        assert!(
            rust.contains_key(name),
            "slo_probe_shim.h declares {name}, which cupti-shim/src/lib.rs does not export"
        );
    }
}

#[test]
fn header_matches_the_python_table() {
    let h = header();
    let py = python_table();
    for (name, (sig, comment)) in h
        .iter()
        .filter(|(n, _)| n.as_str() != "InitializeInjection")
    {
        let Some((res, args, blocking, _)) = py.get(name) else {
            panic!("python/slo_probe: {name} ({sig}) is in the header but in neither _ABI nor _OPTIONAL_ABI");
        };
        assert!(
            ctypes_names(&sig.ret).contains(&res.as_str()),
            "python/slo_probe: {name} restype {res}, the header returns {}",
            sig.ret
        );
        assert_eq!(
            args.len(),
            sig.args.len(),
            "python/slo_probe: {name} takes {} arguments in the header, {} in argtypes",
            sig.args.len(),
            args.len()
        );
        for (i, (c, p)) in sig.args.iter().zip(args).enumerate() {
            assert!(
                ctypes_names(c).contains(&p.as_str()),
                "python/slo_probe: {name} argument {i} is {p}, the header says {c}"
            );
        }
        let header_blocks = comment.contains("Blocks.");
        assert_eq!(
            *blocking,
            header_blocks,
            "python/slo_probe: {name} blocking={blocking}, the header comment {} \"Blocks.\"",
            if header_blocks {
                "says"
            } else {
                "does not say"
            }
        );
    }
    for name in py.keys() {
        assert!(
            h.contains_key(name),
            "python/slo_probe declares {name}, which slo_probe_shim.h does not"
        );
    }
}

#[test]
fn header_matches_the_c_stub() {
    let h = header();
    let stub = c_functions(&read("python/tests/stub_shim.c"), "stub_shim.c", true);
    for (name, (sig, _)) in &h {
        let Some((def, _)) = stub.get(name) else {
            panic!("python/tests/stub_shim.c does not define {name} ({sig})");
        };
        assert_eq!(
            def, sig,
            "stub_shim.c: {name} is {def}, the header says {sig}"
        );
    }
    for name in stub.keys() {
        assert!(
            h.contains_key(name),
            "python/tests/stub_shim.c defines {name}, which slo_probe_shim.h does not declare"
        );
    }
}

/// The parsers themselves: a function added to one file only is caught.
#[test]
fn parsers_see_what_they_must() {
    let c = c_functions(
        "/* x */\nuint32_t slo_probe_a(const char *name, uint64_t *out);\n/* Blocks. */\nvoid slo_probe_b(void);\n",
        "t.h",
        false,
    );
    assert_eq!(
        c["slo_probe_a"].0,
        Sig {
            ret: "uint32_t".into(),
            args: vec!["const char*".into(), "uint64_t*".into()]
        }
    );
    assert!(c["slo_probe_b"].1.contains("Blocks."));
    let d = c_functions(
        "static int say(int x) { return slo_probe_c(); }\nint32_t slo_probe_c(void) { return 1; }\n",
        "t.c",
        true,
    );
    assert_eq!(d.keys().collect::<Vec<_>>(), ["slo_probe_c"]);
    let r = rust_functions(
        "#[no_mangle]\npub unsafe extern \"C\" fn slo_probe_x(out: *mut u64, n: usize) -> usize {\n}\n",
    );
    assert_eq!(
        r["slo_probe_x"],
        Sig {
            ret: "size_t".into(),
            args: vec!["uint64_t*".into(), "size_t".into()]
        }
    );
}
