//! A replica's revision: a stable hash of what it serves (the model's bytes, named by their
//! checksums) and what serves it (the engine build). Rollouts compare revisions. The source's
//! location is left out on purpose: moving the same bytes to another URL is not a new revision.

use brink_api::crd::{EngineBuild, ModelSpec};
use sha2::{Digest, Sha256};

/// Hex digits kept: 80 bits, far from collisions among one deployment's revisions and short
/// enough for `spec.revision` (at most 128) and labels (at most 63).
const REVISION_HEX: usize = 20;

/// The revision of `model` served by `engine`: the same inputs give the same string on every
/// operator build (checksums are compared case-insensitively, as the cache keys them).
pub fn revision(model: &ModelSpec, engine: &EngineBuild) -> String {
    let mut h = Sha256::new();
    // Each field length-prefixed, so that no two different inputs hash the same bytes.
    let mut field = |s: &str| {
        h.update((s.len() as u64).to_le_bytes());
        h.update(s.as_bytes());
    };
    field("brink.dev/revision/v1");
    if let Some(sha) = &model.sha256 {
        field("sha256");
        field(&sha.to_ascii_lowercase());
    }
    for part in model.parts.iter().flatten() {
        field("part");
        field(&part.sha256.to_ascii_lowercase());
    }
    field(&engine.image);
    field(&engine.version);
    // Added only when set, so that a brink deployment keeps the revision it had before engine
    // kinds existed (an operator upgrade must not roll every deployment).
    if !engine.kind.is_brink() {
        field("kind");
        field(engine.kind.as_str());
    }
    for arg in &engine.args {
        field("arg");
        field(arg);
    }
    if let Some(port) = engine.port {
        field("port");
        field(&port.to_string());
    }
    let digest = h.finalize();
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    hex[..REVISION_HEX].to_string()
}

#[cfg(test)]
mod tests {
    use brink_api::crd::{ModelFormat, ModelPart, ModelSource, NodePathSource};

    use super::*;

    fn model(sha: &str) -> ModelSpec {
        ModelSpec {
            source: ModelSource { https: None, node_path: Some(NodePathSource { path: "/m/a.gguf".into() }), pvc: None },
            sha256: Some(sha.into()),
            format: ModelFormat::Gguf,
            parts: None,
        }
    }

    fn engine(image: &str, version: &str) -> EngineBuild {
        EngineBuild { image: image.into(), version: version.into(), ..Default::default() }
    }

    #[test]
    fn revision_follows_bytes_and_engine_not_location() {
        let a = "ab".repeat(32);
        let base = revision(&model(&a), &engine("img:1", "0.1"));
        assert_eq!(base.len(), REVISION_HEX);
        assert!(base.bytes().all(|b| b.is_ascii_hexdigit()));
        // Stable: a fixed value, so that an operator upgrade does not roll every deployment.
        assert_eq!(base, revision(&model(&a), &engine("img:1", "0.1")));
        assert_eq!(base, revision(&model(&a.to_ascii_uppercase()), &engine("img:1", "0.1")));
        let mut moved = model(&a);
        moved.source.node_path = Some(NodePathSource { path: "/elsewhere/a.gguf".into() });
        assert_eq!(base, revision(&moved, &engine("img:1", "0.1")));
        assert_ne!(base, revision(&model(&"cd".repeat(32)), &engine("img:1", "0.1")));
        assert_ne!(base, revision(&model(&a), &engine("img:2", "0.1")));
        assert_ne!(base, revision(&model(&a), &engine("img:1", "0.2")));
        // Length prefixes: moving a character between image and version changes the hash.
        assert_ne!(revision(&model(&a), &engine("img:1a", "b")), revision(&model(&a), &engine("img:1", "ab")));
        let mut split = model(&a);
        split.sha256 = None;
        split.parts =
            Some(vec![ModelPart { file: "a-1.gguf".into(), sha256: a.clone() }, ModelPart { file: "a-2.gguf".into(), sha256: a.clone() }]);
        assert_ne!(base, revision(&split, &engine("img:1", "0.1")));
        // The engine's kind, arguments and port are part of what serves.
        let other = |f: &dyn Fn(&mut EngineBuild)| {
            let mut e = engine("img:1", "0.1");
            f(&mut e);
            revision(&model(&a), &e)
        };
        let kinds = [other(&|e| e.kind = brink_api::crd::EngineKind::Vllm), other(&|e| e.kind = brink_api::crd::EngineKind::Llamacpp)];
        assert!(kinds.iter().all(|r| *r != base) && kinds[0] != kinds[1]);
        assert_ne!(base, other(&|e| e.args = vec!["--enforce-eager".into()]));
        assert_ne!(base, other(&|e| e.port = Some(9000)));
        assert_ne!(other(&|e| e.args = vec!["a".into(), "b".into()]), other(&|e| e.args = vec!["ab".into()]));
    }
}
