//! The kernels' layers, read from the sources: `ops` (the families) and `check` (what they
//! share with the self-test) never name `selftest`, and `check` names neither `ops` nor
//! `selftest`. The self-test uses the families, never the other way round.

mod module_graph;

use std::path::Path;

use module_graph::{modules, named_paths};

fn violations(below: &str, forbidden: &[&str]) -> Vec<String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut bad = Vec::new();
    let files: Vec<_> = modules(&src).into_iter().filter(|(m, _)| m.first().map(String::as_str) == Some(below)).collect();
    assert!(files.len() > 1, "no files under src/{below}");
    for (module, path) in files {
        let text = std::fs::read_to_string(&path).unwrap();
        for p in named_paths(&module, &text) {
            if p.first().is_some_and(|top| forbidden.contains(&top.as_str())) {
                bad.push(format!("{} names {}", path.display(), p.join("::")));
            }
        }
    }
    bad
}

#[test]
fn kernel_families_do_not_import_the_self_test() {
    let bad = violations("ops", &["selftest"]);
    assert!(bad.is_empty(), "ops must not depend on selftest (move what they share to check/):\n{}", bad.join("\n"));
}

#[test]
fn the_comparison_module_is_below_families_and_self_test() {
    let bad = violations("check", &["ops", "selftest"]);
    assert!(bad.is_empty(), "check must stay below ops and selftest:\n{}", bad.join("\n"));
}

#[test]
fn the_scanner_sees_relative_and_absolute_paths() {
    let m = |s: &str| s.split("::").map(String::from).collect::<Vec<_>>();
    let text =
        "use crate::selftest::case::Case;\n// crate::selftest in a comment\nuse super::super::selftest::x;\nlet y = super::add::f();";
    let got = named_paths(&m("ops::attention::cpu"), text);
    assert_eq!(got, [m("selftest::case::Case"), m("ops::selftest::x"), m("ops::attention::add::f")]);
}

#[test]
fn the_scanner_expands_grouped_imports_across_lines() {
    let m = |s: &str| s.split("::").map(String::from).collect::<Vec<_>>();
    let text = "use super::{jobs::Job, state};\nuse crate::server::{\n    http::{self, Routes},\n    telemetry as t, // crate::x\n};\nuse crate::{a, b::c};";
    let got = named_paths(&m("server::supervisor"), text);
    let want = ["server::jobs::Job", "server::state", "server::http", "server::http::Routes", "server::telemetry", "a", "b::c"];
    assert_eq!(got, want.map(m));
}
