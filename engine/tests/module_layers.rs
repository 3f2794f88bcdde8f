//! The server's modules import each other without a cycle (read from the sources): the shared
//! counters live in `server::state`, below the handlers, the jobs and the telemetry.

#[path = "../../kernels/tests/module_graph/mod.rs"]
mod module_graph;

use std::path::Path;

use module_graph::{edges_among, find_cycle};

#[test]
fn server_modules_import_each_other_without_a_cycle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let edges = edges_among(&src, &["server"]);
    for m in ["http", "jobs", "state", "telemetry", "supervisor"] {
        assert!(edges.contains_key(m), "no server::{m} found: {edges:?}");
    }
    assert!(edges["http"].contains("state"), "the scanner must see http's imports: {edges:?}");
    if let Some(cycle) = find_cycle(&edges) {
        panic!("an import cycle among engine/src/server: {}\n{edges:#?}", cycle.join(" -> "));
    }
}

#[test]
fn the_telemetry_store_and_the_state_import_no_other_server_module() {
    let edges = edges_among(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), &["server"]);
    assert!(edges["telemetry"].is_empty(), "telemetry: {:?}", edges["telemetry"]);
    let state: Vec<&String> = edges["state"].iter().filter(|m| *m != "telemetry").collect();
    assert!(state.is_empty(), "state may only use the telemetry store: {state:?}");
}

/// Top-level module names that collide: one a backend's name (`backend::cpu` beside a top-level
/// `cpu`), or one the start of another (`serve` beside `server`). Each pair reads as one module.
fn colliding_names(top: &[String], backends: &[String]) -> Vec<String> {
    let mut bad = Vec::new();
    for a in top {
        if backends.contains(a) {
            bad.push(format!("`{a}` is also backend::{a}"));
        }
        for b in top {
            if a != b && b.starts_with(a.as_str()) {
                bad.push(format!("`{a}` is the start of `{b}`"));
            }
        }
    }
    bad
}

/// The child modules of `dir` (files and folders, `mod.rs` and `lib.rs` left out).
fn children(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir() || p.extension().is_some_and(|x| x == "rs"))
        .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
        .filter(|n| n != "mod" && n != "lib" && n != "bin")
        .collect();
    names.sort();
    names.dedup();
    names
}

#[test]
fn top_level_module_names_do_not_collide() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let (top, backends) = (children(&src), children(&src.join("backend")));
    assert!(top.contains(&"server".to_string()) && backends.contains(&"cpu".to_string()), "{top:?} / {backends:?}");
    let bad = colliding_names(&top, &backends);
    assert!(bad.is_empty(), "engine/src module names that read as one another:\n{}", bad.join("\n"));
    // The check flags the names it is for.
    let names = |s: &[&str]| s.iter().map(|n| n.to_string()).collect::<Vec<_>>();
    assert_eq!(colliding_names(&names(&["cpu", "serve", "server"]), &names(&["cpu", "cuda"])).len(), 2);
}
