#![allow(dead_code)] // each layer test uses part of it
//! Which modules a crate's source files name, read from the text: every `crate::…` and
//! `super::…` path outside comments, resolved to the module it starts in. The layer tests
//! (`module_layers.rs` of the kernels and of the engine) assert on it, so an import cycle that
//! was broken cannot come back unnoticed.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module's path below the crate root, e.g. `["ops", "attention", "cpu"]`.
pub type ModPath = Vec<String>;

/// Every `.rs` file under `src` (the crate's `src/`), with its module path.
pub fn modules(src: &Path) -> Vec<(ModPath, PathBuf)> {
    let mut out = Vec::new();
    walk(src, src, &mut out);
    out.sort();
    out
}

fn walk(root: &Path, dir: &Path, out: &mut Vec<(ModPath, PathBuf)>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        if path.is_dir() {
            walk(root, &path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let rel = path.strip_prefix(root).unwrap().with_extension("");
            let mut m: ModPath = rel.iter().map(|c| c.to_string_lossy().into_owned()).collect();
            if matches!(m.last().map(String::as_str), Some("mod" | "lib" | "main")) {
                m.pop();
            }
            out.push((m, path));
        }
    }
}

/// The absolute module paths a file's code names (`crate::a::b::C` gives `["a", "b", "C"]`;
/// `super::x` from `ops/add.rs` gives `["ops", "x"]`; a group, `super::{x, y::{self, Z}}`, gives
/// each path in it, across lines). Comments are skipped: doc links are not imports.
pub fn named_paths(module: &ModPath, text: &str) -> Vec<ModPath> {
    let code: Vec<&str> = text
        .lines()
        .map(|line| {
            let code = line.trim_start();
            if code.starts_with("//") { "" } else { code.split("//").next().unwrap_or("") }
        })
        .collect();
    let code = code.join("\n");
    let bytes = code.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < code.len() {
        let rest = &code[i..];
        let starts_word = i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_' || bytes[i - 1] == b':');
        if starts_word && (rest.starts_with("crate::") || rest.starts_with("super::")) {
            let end = path_end(rest);
            let segs: Vec<&str> = rest[..end].split("::").filter(|s| !s.is_empty()).collect();
            let base = resolve(module, &segs);
            let mut used = end.max(1);
            if rest[end..].starts_with('{') {
                let (items, len) = group(&rest[end..]);
                used = end + len;
                if let Some(base) = &base {
                    for item in items {
                        let mut p = base.clone();
                        p.extend(item.into_iter().filter(|s| s != "self"));
                        out.push(p);
                    }
                }
            } else if let Some(p) = base {
                out.push(p);
            }
            i += used;
        } else {
            i += rest.chars().next().map_or(1, char::len_utf8);
        }
    }
    out
}

/// Where a path (`a::b::`, letters, digits, `_` and `:`) that starts `s` ends.
fn path_end(s: &str) -> usize {
    s.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':')).unwrap_or(s.len())
}

/// The paths of a `{...}` group that starts `s` (relative to the path before it; nested groups
/// flattened, `x as y` named as `x`), and the group's length.
fn group(s: &str) -> (Vec<Vec<String>>, usize) {
    let mut out: Vec<Vec<String>> = Vec::new();
    let mut item: Vec<String> = Vec::new();
    let mut alias = false;
    let mut i = 1;
    while i < s.len() {
        let rest = &s[i..];
        let c = rest.chars().next().unwrap_or(' ');
        if c == '}' || c == ',' {
            if !item.is_empty() {
                out.push(std::mem::take(&mut item));
            }
            alias = false;
            i += 1;
            if c == '}' {
                return (out, i);
            }
        } else if c == '{' {
            let (inner, len) = group(rest);
            out.extend(inner.into_iter().map(|p| item.iter().cloned().chain(p).collect()));
            item.clear();
            i += len;
        } else if c.is_ascii_alphanumeric() || c == '_' || c == ':' {
            let end = path_end(rest);
            let token = &rest[..end];
            if token == "as" && !item.is_empty() {
                alias = true;
            } else if !alias {
                item.extend(token.split("::").filter(|s| !s.is_empty()).map(String::from));
            }
            i += end;
        } else {
            i += c.len_utf8();
        }
    }
    if !item.is_empty() {
        out.push(item);
    }
    (out, s.len())
}

fn resolve(module: &ModPath, segs: &[&str]) -> Option<ModPath> {
    let (mut base, mut rest) = match segs.first() {
        Some(&"crate") => (ModPath::new(), &segs[1..]),
        // `super` is the parent of the file's module (of `ops` for `ops/add.rs` and for
        // `ops/attention/mod.rs` alike). Inline modules (`mod tests`) are not followed: their
        // `super` is the file's own module, which adds no edge.
        Some(&"super") => (module.clone(), segs),
        _ => return None,
    };
    while let Some(&"super") = rest.first() {
        base.pop()?;
        rest = &rest[1..];
    }
    base.extend(rest.iter().map(|s| s.to_string()));
    Some(base)
}

/// Edges between the children of `parent` (e.g. `["server"]`): `a -> b` when a file in
/// `parent::a` names something in `parent::b`.
pub fn edges_among(src: &Path, parent: &[&str]) -> BTreeMap<String, BTreeSet<String>> {
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (module, path) in modules(src) {
        if module.len() <= parent.len() || module[..parent.len()] != *parent {
            continue;
        }
        let from = module[parent.len()].clone();
        let text = std::fs::read_to_string(&path).unwrap();
        let entry = edges.entry(from.clone()).or_default();
        for p in named_paths(&module, &text) {
            if p.len() > parent.len() && p[..parent.len()] == *parent && p[parent.len()] != from {
                entry.insert(p[parent.len()].clone());
            }
        }
    }
    edges
}

/// A cycle in `edges`, if there is one (as the list of modules around it).
pub fn find_cycle(edges: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(n.to_string(), 1);
        stack.push(n.to_string());
        for m in edges.get(n).into_iter().flatten() {
            match state.get(m.as_str()).copied().unwrap_or(0) {
                1 => {
                    let at = stack.iter().position(|s| s == m).unwrap();
                    let mut cycle = stack[at..].to_vec();
                    cycle.push(m.clone());
                    return Some(cycle);
                }
                0 => {
                    if let Some(c) = visit(m, edges, state, stack) {
                        return Some(c);
                    }
                }
                _ => {}
            }
        }
        stack.pop();
        state.insert(n.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for n in edges.keys() {
        if state.get(n.as_str()).copied().unwrap_or(0) == 0
            && let Some(c) = visit(n, edges, &mut state, &mut Vec::new())
        {
            return Some(c);
        }
    }
    None
}
