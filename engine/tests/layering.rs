//! The engine's module layering, checked on the sources: the model core (`model/`) imports
//! neither the architectures nor the residency machinery, the residency machinery (`cache/`)
//! never imports the architectures (so `arch/` ↔ `cache/` cannot become a circle again), and
//! the kernels (`kernels/`) never call back into the backend that dispatches to them.

use std::path::{Path, PathBuf};

/// `(module directory, paths it must not name)`.
const RULES: &[(&str, &[&str])] = &[
    (
        "model",
        &[
            "crate::arch",
            "crate::cache",
            "crate::scheduler",
            "crate::backend::current",
        ],
    ),
    ("cache", &["crate::arch"]),
    (
        "kernels",
        &["crate::backend", "crate::model", "crate::arch", "crate::cache"],
    ),
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Every `(line number, line)` of `source` that names one of `forbidden` (comments included:
/// a doc link is a dependency too).
fn violations(source: &str, forbidden: &[&str]) -> Vec<(usize, String)> {
    source
        .lines()
        .enumerate()
        .filter(|(_, line)| forbidden.iter().any(|f| line.contains(f)))
        .map(|(i, line)| (i + 1, line.trim().to_string()))
        .collect()
}

#[test]
fn the_checker_finds_an_import_in_code_and_in_docs() {
    let src = "use crate::cache::store::ExpertStore;\n//! see [`crate::arch::Model`]\nfn f() {}\n";
    assert_eq!(violations(src, &["crate::arch", "crate::cache"]).len(), 2);
    assert!(violations("use crate::kernels::Matrix;\n", &["crate::arch"]).is_empty());
}

#[test]
fn no_module_imports_a_layer_above_it() {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut found = Vec::new();
    for (module, forbidden) in RULES {
        let mut files = Vec::new();
        rust_files(&src.join(module), &mut files);
        assert!(!files.is_empty(), "src/{module} has no sources");
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            for (line, code) in violations(&text, forbidden) {
                found.push(format!("{}:{line}: {code}", file.display()));
            }
        }
    }
    assert!(found.is_empty(), "layering violations:\n{}", found.join("\n"));
}
