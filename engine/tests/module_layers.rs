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
