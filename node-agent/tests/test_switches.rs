//! The test-only switches (`BRINK_INJECT_FAULT`, `BRINK_TEST_CLAIM_BACKEND`,
//! `BRINK_TEST_SILENT_CPU`) are compiled in only with brink-engine's `test-switches` feature.
//! This checks what cargo resolves: the feature set a release build of `brink-agent` compiles
//! (`-e no-dev`: no dev-dependency activates features, as in `cargo build --release -p
//! brink-agent`) lacks it, while a test build (dev-dependencies included) has it. What a
//! binary without the feature does with a set variable (ignores it, says so on stderr) is the
//! gate's unit test in `brink_engine::test_switches`.

use std::process::Command;

/// brink-engine's enabled features when cargo builds brink-agent with `edges`.
fn engine_features(edges: &str) -> Vec<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["tree", "--offline", "--locked", "-p", "brink-agent", "-e", edges, "--prefix", "none", "-f", "{p} [{f}]"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "cargo tree failed: {}", String::from_utf8_lossy(&out.stderr));
    let line = text.lines().find(|l| l.starts_with("brink-engine v")).unwrap_or_else(|| panic!("no brink-engine in\n{text}"));
    // A package printed before is marked ` (*)`; `-e all` also prints feature nodes
    // (`brink-engine feature "default"`), which are not the package line.
    let line = line.trim_end().trim_end_matches(" (*)");
    let list = line.rsplit_once('[').and_then(|(_, f)| f.strip_suffix(']')).unwrap_or_else(|| panic!("no feature list in {line}"));
    list.split(',').map(str::trim).filter(|f| !f.is_empty()).map(String::from).collect()
}

#[test]
fn the_release_build_has_no_test_switches_and_the_test_build_has_them() {
    let release = engine_features("no-dev");
    assert!(!release.iter().any(|f| f == "test-switches"), "a release build would honour the test switches: {release:?}");
    let test = engine_features("all");
    assert!(test.iter().any(|f| f == "test-switches"), "the tests would not get the switches: {test:?}");
    assert!(brink_engine::test_switches::COMPILED, "this test build is compiled without the switches");
}
