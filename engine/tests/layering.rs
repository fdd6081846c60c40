//! The engine's module layering, read from the real import graph of `engine/src`: every path
//! that leaves a top-level module (`crate::m::…`, `use crate::{m::…, …}`, or `super::` chains
//! that climb past the module's root) is an edge `from → m`. Comments, doc comments and string
//! literals are not code and are dropped first; so is test-only code (`#[cfg(test)]` items and
//! the files they declare).
//!
//! Two checks: no cycle between top-level modules (any strongly connected component of more than
//! one module fails, with the lines that make it), and the declared layer rules below (the
//! kernels never call into the backend that dispatches to them; the model core imports neither
//! the architectures nor the residency machinery; the residency machinery never imports the
//! architectures).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// `(module, modules it must not import)` beyond "no cycles".
const RULES: &[(&str, &[&str])] = &[
    ("kernels", &["backend", "model", "arch", "cache", "state"]),
    ("state", &["model", "arch", "generate", "scheduler", "spec"]),
    ("model", &["arch", "cache", "scheduler", "generate"]),
    ("cache", &["arch", "generate", "scheduler"]),
];

/// One import edge and where it was seen.
#[derive(Debug, Clone)]
struct Edge {
    to: String,
    at: String,
}

/// `module → edges`, over every top-level module of a source tree.
type Graph = BTreeMap<String, Vec<Edge>>;

/// `text` with comments and string/char literals blanked (newlines kept, so line numbers hold).
fn code_only(text: &str) -> String {
    let b: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        let next = b.get(i + 1).copied();
        if b[i] == '/' && next == Some('/') {
            while i < b.len() && b[i] != '\n' {
                i += 1;
            }
        } else if b[i] == '/' && next == Some('*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == '/' && b.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if b[i] == '*' && b.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(if b[i] == '\n' { '\n' } else { ' ' });
                    i += 1;
                }
            }
        } else if b[i] == 'r' && (next == Some('"') || (next == Some('#') && raw_string_at(&b, i))) {
            i = skip_raw_string(&b, i, &mut out);
        } else if b[i] == '"' {
            i += 1;
            while i < b.len() && b[i] != '"' {
                if b[i] == '\\' {
                    i += 1;
                }
                if b.get(i) == Some(&'\n') {
                    out.push('\n');
                }
                i += 1;
            }
            i += 1;
            out.push_str("\"\"");
        } else if b[i] == '\'' && is_char_literal(&b, i) {
            i += if next == Some('\\') { 2 } else { 1 };
            while i < b.len() && b[i] != '\'' {
                i += 1;
            }
            i += 1;
            out.push_str("' '");
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

fn raw_string_at(b: &[char], i: usize) -> bool {
    let mut j = i + 1;
    while b.get(j) == Some(&'#') {
        j += 1;
    }
    b.get(j) == Some(&'"') && (i == 0 || !(b[i - 1].is_alphanumeric() || b[i - 1] == '_'))
}

fn skip_raw_string(b: &[char], i: usize, out: &mut String) -> usize {
    let mut j = i + 1;
    let mut hashes = 0;
    while b.get(j) == Some(&'#') {
        hashes += 1;
        j += 1;
    }
    j += 1;
    loop {
        if j >= b.len() {
            return j;
        }
        if b[j] == '\n' {
            out.push('\n');
        }
        if b[j] == '"' && (1..=hashes).all(|k| b.get(j + k) == Some(&'#')) {
            return j + 1 + hashes;
        }
        j += 1;
    }
}

/// A `'` that opens a char literal (not a lifetime or label).
fn is_char_literal(b: &[char], i: usize) -> bool {
    matches!(
        (b.get(i + 1), b.get(i + 2)),
        (Some('\\'), _) | (Some(_), Some('\''))
    )
}

/// `code` with every `#[cfg(test)]` item removed (a braced item through its closing brace, or
/// up to its `;`), and the names of the test-only module files it declares (`mod x;`).
fn drop_test_items(code: &str) -> (String, Vec<String>) {
    let mut out = code.to_string();
    let mut files = Vec::new();
    while let Some(at) = out.find("#[cfg(test)]") {
        let rest = &out[at..];
        let brace = rest.find('{');
        let semi = rest.find(';');
        let end = match (brace, semi) {
            (Some(b), Some(s)) if s > b => at + b + matching_brace(&rest[b..]),
            (Some(b), None) => at + b + matching_brace(&rest[b..]),
            (_, Some(s)) => {
                let item = rest[..s].split_whitespace().collect::<Vec<_>>();
                if let Some(p) = item.iter().position(|w| *w == "mod") {
                    files.push(item[p + 1].to_string());
                }
                at + s + 1
            }
            (None, None) => out.len(),
        };
        let blank: String = out[at..end]
            .chars()
            .map(|c| if c == '\n' { '\n' } else { ' ' })
            .collect();
        out.replace_range(at..end, &blank);
    }
    (out, files)
}

/// Length through the brace that closes the one `s` starts with.
fn matching_brace(s: &str) -> usize {
    let mut depth = 0;
    for (i, c) in s.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
    }
    s.len()
}

fn ident_at(s: &str) -> &str {
    let end = s
        .char_indices()
        .find(|(_, c)| !(c.is_alphanumeric() || *c == '_'))
        .map_or(s.len(), |(i, _)| i);
    &s[..end]
}

/// The top-level modules a file's code names, each with its line. `module_path`: the file's
/// module path below the crate root (`["arch", "gqa_moe"]`), for resolving `super::` chains.
fn imports(code: &str, module_path: &[String]) -> Vec<(String, usize)> {
    let mut found = Vec::new();
    let line_of = |at: usize| code[..at].matches('\n').count() + 1;
    for (at, _) in code.match_indices("crate::") {
        if at > 0 && code[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_' || c == '$') {
            continue;
        }
        let rest = code[at + 7..].trim_start();
        if let Some(group) = rest.strip_prefix('{') {
            let body = &group[..matching_brace(rest) - 2];
            for item in split_top_level(body) {
                let name = ident_at(item.trim_start());
                if !name.is_empty() && name != "self" {
                    found.push((name.to_string(), line_of(at)));
                }
            }
        } else {
            found.push((ident_at(rest).to_string(), line_of(at)));
        }
    }
    for (at, _) in code.match_indices("super::") {
        if at > 0 && code[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        let mut rest = &code[at..];
        let mut depth = 0;
        while let Some(r) = rest.strip_prefix("super::") {
            depth += 1;
            rest = r.trim_start();
        }
        if depth >= module_path.len() && !module_path.is_empty() {
            found.push((ident_at(rest).to_string(), line_of(at)));
        }
    }
    found
}

/// The comma-separated items of a `{…}` group body, not splitting inside nested groups.
fn split_top_level(body: &str) -> Vec<&str> {
    let (mut items, mut depth, mut start) = (Vec::new(), 0, 0);
    for (i, c) in body.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&body[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&body[start..]);
    items
}

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

/// The module path of `file` below `src` (`arch/mod.rs` → `[arch]`, `lib.rs` → `[]`).
fn module_path(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap();
    let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    let last = parts.pop().unwrap();
    let stem = last.trim_end_matches(".rs");
    if !matches!(stem, "mod" | "lib") {
        parts.push(stem.to_string());
    }
    parts
}

/// The import graph between the top-level modules of the crate in `src`.
fn graph(src: &Path) -> Graph {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    files.sort();
    let mut test_only = BTreeSet::new();
    let mut parsed = Vec::new();
    for file in &files {
        let (code, test_mods) = drop_test_items(&code_only(&std::fs::read_to_string(file).unwrap()));
        let dir = match file.file_stem().unwrap().to_str().unwrap() {
            "mod" | "lib" => file.parent().unwrap().to_path_buf(),
            stem => file.parent().unwrap().join(stem),
        };
        for m in test_mods {
            test_only.insert(dir.join(format!("{m}.rs")));
            test_only.insert(dir.join(&m));
        }
        parsed.push((file.clone(), code));
    }
    let tops: BTreeSet<String> = files
        .iter()
        .filter_map(|f| module_path(src, f).first().cloned())
        .collect();
    let mut g = Graph::new();
    for (file, code) in parsed {
        if test_only.iter().any(|t| file.starts_with(t)) {
            continue;
        }
        let path = module_path(src, &file);
        let Some(from) = path.first().cloned() else {
            continue;
        };
        let edges = g.entry(from.clone()).or_default();
        for (to, line) in imports(&code, &path) {
            if to != from && tops.contains(&to) {
                let at = format!("{}:{line}", file.strip_prefix(src).unwrap().display());
                edges.push(Edge { to, at });
            }
        }
    }
    g
}

/// Strongly connected components of more than one module (Tarjan), each sorted.
fn cycles(g: &Graph) -> Vec<Vec<String>> {
    struct Walk<'a> {
        g: &'a Graph,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        found: Vec<Vec<String>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, v: &'a str) {
            let i = self.index.len();
            self.index.insert(v, i);
            self.low.insert(v, i);
            self.stack.push(v);
            for e in self.g.get(v).into_iter().flatten() {
                let w = e.to.as_str();
                if !self.index.contains_key(w) {
                    self.visit(w);
                    self.low.insert(v, self.low[v].min(self.low[w]));
                } else if self.stack.contains(&w) {
                    self.low.insert(v, self.low[v].min(self.index[w]));
                }
            }
            if self.low[v] == self.index[v] {
                let mut comp = Vec::new();
                while let Some(w) = self.stack.pop() {
                    comp.push(w.to_string());
                    if w == v {
                        break;
                    }
                }
                if comp.len() > 1 {
                    comp.sort();
                    self.found.push(comp);
                }
            }
        }
    }
    let mut walk = Walk {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        found: Vec::new(),
    };
    for v in g.keys() {
        if !walk.index.contains_key(v.as_str()) {
            walk.visit(v);
        }
    }
    walk.found
}

/// Each cycle with the first line of every edge inside it.
fn describe(g: &Graph, comps: &[Vec<String>]) -> String {
    let mut s = String::new();
    for comp in comps {
        s += &format!("cycle between {}:\n", comp.join(", "));
        for from in comp {
            let mut seen = BTreeSet::new();
            for e in &g[from] {
                if comp.contains(&e.to) && seen.insert(&e.to) {
                    s += &format!("  {from} -> {} ({})\n", e.to, e.at);
                }
            }
        }
    }
    s
}

fn engine_graph() -> Graph {
    graph(&PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src"))
}

#[test]
fn no_cycle_between_engine_modules() {
    let g = engine_graph();
    assert!(g.len() > 15, "read only {} modules", g.len());
    let comps = cycles(&g);
    assert!(comps.is_empty(), "{}", describe(&g, &comps));
}

#[test]
fn no_module_imports_a_layer_it_must_not() {
    let g = engine_graph();
    let mut found = Vec::new();
    for (module, forbidden) in RULES {
        let edges = g.get(*module).unwrap_or_else(|| panic!("no module {module}"));
        for e in edges.iter().filter(|e| forbidden.contains(&e.to.as_str())) {
            found.push(format!("{module} -> {} at {}", e.to, e.at));
        }
    }
    assert!(found.is_empty(), "layering violations:\n{}", found.join("\n"));
}

/// Writes a tiny crate to a temp dir and returns its graph.
fn graph_of(files: &[(&str, &str)]) -> Graph {
    let dir = std::env::temp_dir().join(format!("layering-{}-{}", std::process::id(), files.len()));
    let _ = std::fs::remove_dir_all(&dir);
    for (name, text) in files {
        let path = dir.join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    let g = graph(&dir);
    std::fs::remove_dir_all(&dir).unwrap();
    g
}

#[test]
fn a_deliberate_cycle_is_found_and_comments_strings_and_tests_are_not_edges() {
    let g = graph_of(&[
        ("lib.rs", "pub mod a;\npub mod b;\npub mod c;\n"),
        (
            "a/mod.rs",
            "use crate::{b::{X, Y}, c};\n// crate::c::Z in a comment\n",
        ),
        ("b.rs", "fn f() { super::c::g(); let s = \"crate::a::Q\"; }\n"),
        (
            "c/mod.rs",
            "/// [`crate::a::Doc`]\n#[cfg(test)]\nmod tests { use crate::a::T; }\n#[cfg(test)]\nmod more;\n",
        ),
        ("c/more.rs", "use crate::a::T;\n"),
    ]);
    assert!(cycles(&g).is_empty(), "{}", describe(&g, &cycles(&g)));
    let to = |m: &str| g[m].iter().map(|e| e.to.clone()).collect::<BTreeSet<_>>();
    assert_eq!(to("a"), BTreeSet::from(["b".to_string(), "c".to_string()]));
    assert_eq!(to("b"), BTreeSet::from(["c".to_string()]));
    assert!(to("c").is_empty());

    let g = graph_of(&[
        ("lib.rs", "pub mod a;\npub mod b;\npub mod c;\n"),
        ("a/mod.rs", "use crate::b::X;\n"),
        ("b.rs", "pub fn f() -> crate::c::Y { todo!() }\n"),
        ("c/inner.rs", "use super::super::a::Z;\n"),
        ("c/mod.rs", "mod inner;\n"),
    ]);
    let comps = cycles(&g);
    assert_eq!(comps, vec![vec!["a".to_string(), "b".into(), "c".into()]]);
    let text = describe(&g, &comps);
    assert!(text.contains("c -> a (c/inner.rs:1)"), "{text}");
}
