//! The operator's decisions stay pure, read from the sources: no file of `src/decide` (its own
//! test folders aside) names the Kubernetes client or its types (`kube`, `k8s_openapi`), nor one
//! of brink's API objects as a whole (`Model`, `ModelDeployment`, ...: a kube resource with its
//! metadata). The controllers map those into the views of `decide::inputs`.

use std::path::{Path, PathBuf};

/// brink's kinds: the `CustomResource` structs of `brink_api::crd` (their specs and statuses are
/// plain data and may be named).
const KINDS: &[&str] = &["SparkNode", "Model", "ModelDeployment", "ModelReplica", "RegressionSweep", "SweepRun", "SweepResult"];

fn production_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n != "tests") {
                production_files(&path, out);
            }
        } else if path.extension().is_some_and(|e| e == "rs") && path.file_name().is_some_and(|n| n != "tests.rs") {
            out.push(path);
        }
    }
}

/// The text before an inline `#[cfg(test)]` module: tests may build API objects to compare with.
fn production_part(text: &str) -> &str {
    text.find("#[cfg(test)]").map_or(text, |i| &text[..i])
}

/// What a source text names that a pure module must not: each as `line: what`.
fn kube_names(text: &str) -> Vec<String> {
    let mut bad = Vec::new();
    for (n, line) in production_part(text).lines().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        for krate in ["kube::", "kube_runtime::", "k8s_openapi::"] {
            if code.match_indices(krate).any(|(i, _)| !code[..i].ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_')) {
                bad.push(format!("{}: {krate}", n + 1));
            }
        }
        // `crd::Model`, `crd::{Model, ModelSpec}`: the names right after `crd::`.
        for (i, _) in code.match_indices("crd::") {
            let rest = &code[i + "crd::".len()..];
            let names: Vec<&str> = match rest.strip_prefix('{') {
                Some(group) => group.split('}').next().unwrap_or("").split(',').map(str::trim).collect(),
                None => vec![rest],
            };
            for name in names {
                let ident: String = name.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
                if KINDS.contains(&ident.as_str()) {
                    bad.push(format!("{}: crd::{ident}", n + 1));
                }
            }
        }
    }
    bad
}

#[test]
fn decisions_name_no_kube_types() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/decide");
    let mut files = Vec::new();
    production_files(&dir, &mut files);
    assert!(files.len() > 10, "only {} files under {}", files.len(), dir.display());
    let mut bad = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        bad.extend(kube_names(&text).into_iter().map(|b| format!("{}:{b}", f.display())));
    }
    assert!(bad.is_empty(), "decide/ must stay free of kube types (map them in the controllers):\n{}", bad.join("\n"));
}

#[test]
fn the_scanner_flags_what_it_is_for() {
    let text = "use kube::Api;\n// kube::Api in a comment\nuse brink_api::crd::{ModelSpec, Model};\nlet t: k8s_openapi::jiff::Timestamp;\n\
                let m = brink_api::crd::ModelDeployment::new();\nuse brink_api::crd::ModelSpec;\nlet x = my_kube::f();\n\
                #[cfg(test)]\nmod tests { use kube::Api; }";
    assert_eq!(kube_names(text), ["1: kube::", "3: crd::Model", "4: k8s_openapi::", "5: crd::ModelDeployment"]);
}
