//! The repository stands alone: no tracked file refers to folders outside it, to issue numbers
//! (an issue tracker is not part of the checkout), to branch markers, or to a document or script
//! of the repository that does not exist. Lives in the smallest crate so that it builds first.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace root").to_path_buf()
}

/// This file, which names what it looks for.
const OWN: &str = "api/tests/repository_references.rs";

/// Every tracked file but this one, with its text (files that are not UTF-8 are skipped: no
/// prose in them).
fn tracked_texts() -> Vec<(String, String)> {
    let root = root();
    let out = Command::new("git")
        .arg("-C")
        .arg(&root)
        .args(["ls-files", "-z"])
        .output()
        .unwrap_or_else(|e| panic!("cannot run `git ls-files` in {}: {e}", root.display()));
    assert!(out.status.success(), "git ls-files in {}: {}", root.display(), String::from_utf8_lossy(&out.stderr));
    let names = String::from_utf8(out.stdout).expect("git ls-files prints UTF-8 paths");
    let files: Vec<(String, String)> = names
        .split('\0')
        .filter(|n| !n.is_empty() && *n != "Cargo.lock" && *n != OWN)
        .filter_map(|n| std::fs::read_to_string(root.join(n)).ok().map(|t| (n.to_string(), t)))
        .collect();
    assert!(files.len() > 100, "only {} tracked text files found under {}", files.len(), root.display());
    files
}

/// Where `needle` (ASCII, matched case-insensitively) starts in `text`.
fn find_all(text: &str, needle: &str) -> Vec<usize> {
    let (hay, needle) = (text.to_ascii_lowercase(), needle.to_ascii_lowercase());
    hay.match_indices(&needle).map(|(i, _)| i).collect()
}

fn line_of(text: &str, at: usize) -> usize {
    text[..at].matches('\n').count() + 1
}

/// "issue 6", "Issue #12", "issues 3 and 4": an issue number.
fn issue_references(text: &str) -> Vec<usize> {
    find_all(text, "issue")
        .into_iter()
        .filter(|&i| {
            let rest = text[i + "issue".len()..].trim_start_matches('s');
            let rest = rest.strip_prefix(' ').unwrap_or(rest);
            let rest = rest.strip_prefix('#').unwrap_or(rest);
            rest.starts_with(|c: char| c.is_ascii_digit())
        })
        .collect()
}

/// The paths under `dir/` a text names (`docs/install.md`, `scripts/test`), trailing punctuation cut.
fn named_paths<'a>(text: &'a str, dir: &str) -> Vec<(usize, &'a str)> {
    let mut found = Vec::new();
    for (i, _) in text.match_indices(dir) {
        // `dir` must start a path: not the tail of another name (`my-docs/`, `/x/scripts/`).
        if text[..i].ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '/' || c == '.') {
            continue;
        }
        let len = text[i..].find(|c: char| !(c.is_ascii_alphanumeric() || "_-./".contains(c))).unwrap_or(text.len() - i);
        let path = text[i..i + len].trim_end_matches(['.', '/']);
        if path.len() > dir.len() {
            found.push((i, path));
        }
    }
    found
}

#[test]
fn no_file_refers_outside_the_repository_or_to_issue_numbers() {
    let mut bad = Vec::new();
    for (name, text) in &tracked_texts() {
        for needle in ["../shared", "/work/shared", "/work/wt/", "AWAITS h/"] {
            for i in find_all(text, needle) {
                bad.push(format!("{name}:{}: `{needle}`", line_of(text, i)));
            }
        }
        for i in issue_references(text) {
            let end = text[i..].find('\n').map_or(text.len(), |e| i + e).min(i + 24);
            bad.push(format!("{name}:{}: an issue number (`{}`)", line_of(text, i), &text[i..end]));
        }
    }
    assert!(bad.is_empty(), "references that only make sense outside this repository:\n{}", bad.join("\n"));
}

#[test]
fn every_named_doc_and_script_exists() {
    let root = root();
    let mut missing = Vec::new();
    for (name, text) in tracked_texts() {
        for dir in ["docs/", "scripts/"] {
            for (i, path) in named_paths(&text, dir) {
                // Only the docs' markdown pages are named as files; `docs/` alone is the folder.
                if dir == "docs/" && !path.ends_with(".md") {
                    continue;
                }
                if !root.join(path).exists() {
                    missing.push(format!("{name}:{}: {path}", line_of(&text, i)));
                }
            }
        }
    }
    assert!(missing.is_empty(), "files named but not in the repository:\n{}", missing.join("\n"));
}

#[test]
fn every_relative_markdown_link_resolves() {
    let root = root();
    let mut broken = Vec::new();
    for (name, text) in tracked_texts().iter().filter(|(n, _)| n.ends_with(".md")) {
        let dir = Path::new(name).parent().unwrap_or(Path::new(""));
        for (i, _) in text.match_indices("](") {
            let target = &text[i + 2..];
            let Some(end) = target.find(')') else { continue };
            let target = target[..end].split('#').next().unwrap_or("");
            if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            if !root.join(dir).join(target).exists() {
                broken.push(format!("{name}:{}: ({target})", line_of(text, i)));
            }
        }
    }
    assert!(broken.is_empty(), "markdown links to files that do not exist:\n{}", broken.join("\n"));
}

#[test]
fn the_checks_catch_what_they_are_for() {
    // Negative controls of the scanners themselves: each would flag these lines.
    assert_eq!(issue_references("see issue 6, \"Tests\"").len(), 1);
    assert_eq!(issue_references("Flow (Issue #7): x").len(), 1);
    assert_eq!(issue_references("issues 3 and 4").len(), 1);
    assert!(issue_references("all loads are issued before use; an issue with it").is_empty());
    assert_eq!(named_paths("(see docs/kernels.md).", "docs/"), vec![(5, "docs/kernels.md")]);
    assert_eq!(named_paths("run `scripts/gpu-bench`.", "scripts/"), vec![(5, "scripts/gpu-bench")]);
    assert!(named_paths("~/x/docs/a.md my-scripts/b", "docs/").is_empty());
    assert!(!root().join("docs/kernels.md").exists() && root().join("docs/architecture.md").exists());
}
