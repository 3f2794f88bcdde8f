//! What a `Model` asks for, as the cache takes it: files over http(s) (one, or the parts of a
//! split GGUF, each with its sha256) with optional credentials, or a file already on the node.

use std::fmt;
use std::path::PathBuf;

use super::error::CacheError;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModelSource {
    Http {
        parts: Vec<HttpPart>,
        credentials: Option<Credentials>,
    },
    /// A node path or a mounted PVC: verified and used in place, never copied (a model is tens of
    /// GB; a second copy would halve what the node can hold) and never evicted (not ours).
    Local {
        path: PathBuf,
        sha256: String,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpPart {
    pub url: String,
    /// Lowercase or uppercase hex; compared lowercase.
    pub sha256: String,
}

/// Credentials from the `Model`'s Secret, passed in as values.
#[derive(Clone, PartialEq, Eq)]
pub enum Credentials {
    Bearer(String),
    Basic { user: String, password: String },
}

// Never print a secret: logs and errors may carry the source.
impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Credentials::Bearer(_) => f.write_str("Bearer(<redacted>)"),
            Credentials::Basic { user, .. } => write!(f, "Basic({user}, <redacted>)"),
        }
    }
}

impl ModelSource {
    /// The cache key: the (first) file's sha256, lowercase. Checks every digest's form.
    pub fn key(&self) -> Result<String, CacheError> {
        match self {
            ModelSource::Http { parts, .. } => {
                for (i, p) in parts.iter().enumerate() {
                    normalize_sha256(&format!("parts[{i}].sha256"), &p.sha256)?;
                }
                let first = parts.first().ok_or(CacheError::NoParts)?;
                normalize_sha256("parts[0].sha256", &first.sha256)
            }
            ModelSource::Local { sha256, .. } => normalize_sha256("sha256", sha256),
        }
    }
}

/// `value` lowercase when it is 64 hex digits; otherwise an error naming `field`.
pub fn normalize_sha256(field: &str, value: &str) -> Result<String, CacheError> {
    if value.len() == 64 && value.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(value.to_ascii_lowercase())
    } else {
        Err(CacheError::BadSha256 { field: field.to_string(), value: value.to_string() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_bad_digests() {
        let good = "AB".repeat(32);
        let part = |sha: &str| HttpPart { url: "http://h/m.gguf".into(), sha256: sha.into() };
        let src = ModelSource::Http { parts: vec![part(&good), part(&"cd".repeat(32))], credentials: None };
        assert_eq!(src.key().unwrap(), "ab".repeat(32));
        let bad = ModelSource::Http { parts: vec![part(&good), part("xyz")], credentials: None };
        let e = bad.key().unwrap_err().to_string();
        assert!(e.contains("parts[1].sha256") && e.contains("xyz"), "{e}");
        let none = ModelSource::Http { parts: vec![], credentials: None };
        assert!(matches!(none.key(), Err(CacheError::NoParts)));
        let short = ModelSource::Local { path: "/m.gguf".into(), sha256: "ab".repeat(31) };
        assert!(short.key().unwrap_err().to_string().starts_with("sha256:"));
    }

    #[test]
    fn credentials_never_print() {
        let s =
            format!("{:?} {:?}", Credentials::Bearer("tok123".into()), Credentials::Basic { user: "u".into(), password: "pw456".into() });
        assert!(!s.contains("tok123") && !s.contains("pw456"), "{s}");
    }
}
