//! The built-in demo model: the synthetic `demo` preset (a small qwen3moe with a real BPE
//! vocabulary), generated deterministically on first use and cached under the state directory,
//! so `up` works on any machine without a download.

use std::path::{Path, PathBuf};

use brink_engine::synth::{self, Preset, SynthSpec};

use crate::error::Error;

/// Where the demo model of this agent build lives: the generator can change between builds,
/// so each build has its own file.
pub fn path(state_dir: &Path) -> PathBuf {
    state_dir.join("models").join(format!("brink-demo-{}.gguf", env!("CARGO_PKG_VERSION")))
}

/// The demo model's path, generating it first when it is missing or does not open as GGUF.
/// Written to a temporary file and renamed, so an interrupted run never leaves half a model.
pub fn ensure(state_dir: &Path) -> Result<(PathBuf, bool), Error> {
    let path = path(state_dir);
    if path.exists() {
        match brink_engine::gguf::GgufFile::open(&path) {
            Ok(_) => return Ok((path, false)),
            Err(e) => eprintln!("brink up: {}: {e}; generating it again", path.display()),
        }
    }
    let dir = path.parent().unwrap_or(state_dir);
    std::fs::create_dir_all(dir).map_err(|source| Error::Write {
        flag: None,
        path: dir.to_path_buf(),
        what: "the model directory",
        source,
    })?;
    let tmp = dir.join(format!(".brink-demo-{}.gguf.tmp", std::process::id()));
    synth::generate(&SynthSpec::from_preset(Preset::Demo), &tmp, |_, _| {}).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        Error::content(None, &tmp, format!("generating the demo model: {e}"))
    })?;
    std::fs::rename(&tmp, &path).map_err(|source| Error::Write { flag: None, path: path.clone(), what: "the demo model", source })?;
    Ok((path, true))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_once_then_reused_and_regenerated_when_damaged() {
        let dir = tempfile::tempdir().unwrap();
        let (p, fresh) = ensure(dir.path()).unwrap();
        assert!(fresh && p.starts_with(dir.path().join("models")));
        let bytes = std::fs::read(&p).unwrap();
        let (p2, fresh) = ensure(dir.path()).unwrap();
        assert!(!fresh && p2 == p);
        // Deterministic: a damaged file is regenerated to the same bytes.
        std::fs::write(&p, b"not a gguf").unwrap();
        let (_, fresh) = ensure(dir.path()).unwrap();
        assert!(fresh);
        assert!(std::fs::read(&p).unwrap() == bytes, "the demo model is not deterministic");
        let names: Vec<_> = std::fs::read_dir(p.parent().unwrap()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names.len(), 1, "a temporary file was left behind: {names:?}");
    }

    #[test]
    fn a_state_directory_that_cannot_hold_models_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("state");
        std::fs::write(&file, b"a file, not a folder").unwrap();
        let e = ensure(&file).unwrap_err();
        assert!(matches!(&e, Error::Write { what: "the model directory", .. }), "{e:?}");
        assert!(e.to_string().starts_with(&format!("{}: cannot write the model directory: ", file.join("models").display())), "{e}");
    }
}
