//! The layout's rules, checked on the sources: the core modules never name a runtime
//! (they ask the backend), modules import each other without cycles, every CUDA op is
//! one file registered in one list, and docs/api.md's knobs are the declared ones.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The library's modules (`backend::host`, `cuda::ops::mask`, ...) and their files; the
/// crate root is "".
fn modules() -> BTreeMap<String, PathBuf> {
    fn walk(dir: &Path, found: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, found);
            } else if path.extension().is_some_and(|e| e == "rs") {
                found.push(path);
            }
        }
    }
    let src = crate::common::root().join("src");
    let mut files = vec![];
    walk(&src, &mut files);
    files
        .into_iter()
        .filter(|f| !f.starts_with(src.join("bin")))
        .map(|f| {
            let rel = f.strip_prefix(&src).unwrap().with_extension("");
            let mut parts: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().to_string())
                .collect();
            if matches!(parts.last().map(|s| s.as_str()), Some("mod" | "lib")) {
                parts.pop();
            }
            (parts.join("::"), f)
        })
        .collect()
}

/// A file's code: comments and the test module left out.
fn code(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    let text = text.split("#[cfg(test)]").next().unwrap_or_default();
    text.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The module paths a file's code names after `prefix` (`crate::` or `super::`).
fn paths_after<'a>(code: &'a str, prefix: &'a str) -> impl Iterator<Item = String> + 'a {
    code.match_indices(prefix).filter_map(move |(at, _)| {
        let before = code[..at].chars().last();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            return None;
        }
        let rest = &code[at + prefix.len()..];
        let path: String = rest
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_' || *c == ':')
            .collect();
        let path = path.trim_end_matches(':').to_string();
        (!path.is_empty()).then_some(path)
    })
}

/// The longest module that `path` starts with.
fn resolve(modules: &BTreeMap<String, PathBuf>, path: &str) -> String {
    let parts: Vec<&str> = path.split("::").collect();
    (1..=parts.len())
        .rev()
        .map(|k| parts[..k].join("::"))
        .find(|m| modules.contains_key(m))
        .unwrap_or_default()
}

fn related(a: &str, b: &str) -> bool {
    a.is_empty()
        || b.is_empty()
        || a.starts_with(&format!("{b}::"))
        || b.starts_with(&format!("{a}::"))
}

/// Which modules each module imports, but for its ancestors and descendants (a parent
/// declares and re-exports its children, children use their parent's helpers).
fn imports() -> BTreeMap<String, BTreeSet<String>> {
    let modules = modules();
    modules
        .iter()
        .map(|(name, path)| {
            let code = code(path);
            let parent = name.rsplit_once("::").map(|(p, _)| p).unwrap_or("");
            let mut targets: BTreeSet<String> = paths_after(&code, "crate::")
                .map(|p| resolve(&modules, &p))
                .collect();
            targets.extend(paths_after(&code, "super::").map(|p| {
                let full = if parent.is_empty() {
                    p
                } else {
                    format!("{parent}::{p}")
                };
                resolve(&modules, &full)
            }));
            targets.retain(|t| t != name && !related(name, t));
            (name.clone(), targets)
        })
        .collect()
}

#[test]
fn modules_import_each_other_without_cycles() {
    let imports = imports();
    // Depth-first: a module met again while still on the path closes a cycle.
    fn visit(
        m: &str,
        imports: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) {
        if let Some(at) = path.iter().position(|p| p == m) {
            panic!("import cycle: {} -> {m}", path[at..].join(" -> "));
        }
        if done.contains(m) {
            return;
        }
        path.push(m.to_string());
        for next in imports.get(m).into_iter().flatten() {
            visit(next, imports, path, done);
        }
        path.pop();
        done.insert(m.to_string());
    }
    let mut done = BTreeSet::new();
    for m in imports.keys() {
        visit(m, &imports, &mut vec![], &mut done);
    }
    // The check sees imports: these are known to be there.
    assert!(imports["schedule"].contains("runnable"), "{imports:?}");
    assert!(imports["cuda::backend"].contains("backend"), "{imports:?}");
}

/// The core modules: what every runtime shares. They ask the backend; they never name a
/// runtime, look at its name, or reach into one. (`options` names the devices a user
/// picks from: it is where a name becomes a runtime.)
#[test]
fn core_modules_name_no_runtime() {
    let core = [
        "backend",
        "batch",
        "elementwise",
        "load",
        "memory",
        "model",
        "ops",
        "profile",
        "reference",
        "run",
        "runnable",
        "samples",
        "schedule",
        "segment",
        "spec",
        "transform",
    ];
    for (name, path) in modules() {
        if !core
            .iter()
            .any(|c| name == *c || name.starts_with(&format!("{c}::")))
        {
            continue;
        }
        let code = code(&path);
        for (at, line) in code.lines().enumerate() {
            let lower = line.to_lowercase();
            for banned in [
                "cuda",
                "\"cpu\"",
                ".name() ==",
                ".name() !=",
                "runtime_for_name",
            ] {
                assert!(
                    !lower.contains(banned),
                    "{} (code line {}) names a runtime ({banned}): {line}",
                    path.display(),
                    at + 1
                );
            }
        }
    }
}

/// Each CUDA op is one file of `src/cuda/ops/` holding one op (a `device_op!`), registered
/// once in `TRANSLATORS` (the fused op, made by the fusion pass, is the one not translated from a
/// host node).
#[test]
fn cuda_ops_are_one_file_each_and_registered_once() {
    let modules = modules();
    let registry = code(&modules["cuda::ops"]);
    let translators = registry
        .split("TRANSLATORS")
        .nth(1)
        .expect("cuda/ops/mod.rs declares TRANSLATORS");
    for (name, path) in &modules {
        let Some(op) = name.strip_prefix("cuda::ops::") else {
            continue;
        };
        let code = code(path);
        let ops = code.matches("device_op!(").count() + code.matches("impl EvalOp for").count();
        assert!(ops <= 1, "{} holds {ops} ops", path.display());
        if op.contains("::") || op == "fused_elementwise" {
            continue;
        }
        assert_eq!(ops, 1, "{} holds no op", path.display());
        let entry = format!("{op}::translate");
        let registered = translators
            .match_indices(&entry)
            .filter(|(at, _)| {
                !translators[..*at]
                    .chars()
                    .last()
                    .is_some_and(|c| c.is_alphanumeric() || c == '_')
            })
            .count();
        assert_eq!(registered, 1, "{op} is not registered once in TRANSLATORS");
    }
}

/// docs/api.md's table of knobs is the one the declarations write
/// (`tract_ragged::knobs::table()`): a knob added, renamed or redocumented shows there.
#[cfg(feature = "cuda")]
#[test]
fn the_api_doc_lists_every_knob_as_declared() {
    let doc = std::fs::read_to_string(crate::common::root().join("docs/api.md")).unwrap();
    let table = tract_ragged::knobs::table();
    assert!(
        doc.contains(&table),
        "docs/api.md's knobs table is not the declarations' one; put this there:\n{table}"
    );
}
