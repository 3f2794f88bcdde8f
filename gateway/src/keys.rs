//! Client API keys: which requests may pass, and how many of one key's requests may be in
//! flight at once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::http::{HeaderMap, header};

/// Why a request's key was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyRefusal {
    Missing,
    Invalid,
    /// The key already has `limit` requests in flight.
    Busy {
        limit: usize,
    },
}

impl KeyRefusal {
    pub fn message(&self) -> String {
        match self {
            KeyRefusal::Missing => "missing API key: send `Authorization: Bearer KEY` or `x-api-key: KEY`".into(),
            KeyRefusal::Invalid => "invalid API key".into(),
            KeyRefusal::Busy { limit } => {
                format!("this API key already has {limit} requests in flight (--per-key-concurrency); retry later")
            }
        }
    }
}

pub struct Keys {
    /// Empty: no key is required.
    known: Vec<String>,
    per_key_limit: Option<usize>,
    in_flight: Arc<Mutex<HashMap<String, usize>>>,
}

/// Holds one of a key's concurrency slots; the slot frees when this drops (the response's body
/// is done or the client went away).
pub struct KeySlot {
    key: String,
    in_flight: Arc<Mutex<HashMap<String, usize>>>,
}

impl Drop for KeySlot {
    fn drop(&mut self) {
        let mut m = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = m.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.key);
            }
        }
    }
}

impl Keys {
    pub fn new(known: Vec<String>, per_key_limit: Option<usize>) -> Keys {
        Keys { known, per_key_limit, in_flight: Arc::default() }
    }

    /// Whether requests must carry one of the configured keys.
    pub fn checks_keys(&self) -> bool {
        !self.known.is_empty()
    }

    /// Reads a key file: one key per line; blank lines and `#` comments are skipped.
    pub fn parse_file(text: &str) -> Vec<String> {
        text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).map(String::from).collect()
    }

    /// Checks the request's key (when keys are configured), then takes one of its slots (when a
    /// per-key limit is set). Without configured keys the limit applies per presented key, and
    /// requests without one share the empty key's slots.
    pub fn admit(&self, headers: &HeaderMap) -> Result<Option<KeySlot>, KeyRefusal> {
        self.admit_without_slot(headers)?;
        let Some(limit) = self.per_key_limit else {
            return Ok(None);
        };
        let key = presented_key(headers).unwrap_or("").to_string();
        let mut m = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        let n = m.entry(key.clone()).or_insert(0);
        if *n >= limit {
            return Err(KeyRefusal::Busy { limit });
        }
        *n += 1;
        Ok(Some(KeySlot { key, in_flight: self.in_flight.clone() }))
    }

    /// The key check alone (for requests that hold no slot: the model list).
    pub fn admit_without_slot(&self, headers: &HeaderMap) -> Result<(), KeyRefusal> {
        if self.known.is_empty() {
            return Ok(());
        }
        match presented_key(headers) {
            None => Err(KeyRefusal::Missing),
            Some(k) if self.known.iter().any(|known| constant_time_eq(known.as_bytes(), k.as_bytes())) => Ok(()),
            Some(_) => Err(KeyRefusal::Invalid),
        }
    }
}

/// The key a request carries: `x-api-key: K` (Anthropic's) or `Authorization: Bearer K`.
fn presented_key(headers: &HeaderMap) -> Option<&str> {
    if let Some(v) = headers.get("x-api-key").and_then(|v| v.to_str().ok()) {
        return Some(v.trim());
    }
    let auth = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, key) = auth.trim().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| key.trim())
}

/// Compares keys without stopping at the first differing byte (no timing hint of a prefix).
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn keys_are_checked_in_either_header() {
        let keys = Keys::new(vec!["k1".into(), "k2".into()], None);
        assert!(keys.admit(&headers(&[("authorization", "Bearer k1")])).is_ok());
        assert!(keys.admit(&headers(&[("x-api-key", "k2")])).is_ok());
        assert_eq!(keys.admit(&headers(&[])).err(), Some(KeyRefusal::Missing));
        assert_eq!(keys.admit(&headers(&[("authorization", "Bearer nope")])).err(), Some(KeyRefusal::Invalid));
        assert_eq!(keys.admit(&headers(&[("authorization", "Basic k1")])).err(), Some(KeyRefusal::Missing));
        assert!(Keys::new(Vec::new(), None).admit(&headers(&[])).is_ok());
    }

    #[test]
    fn the_limit_is_per_key_and_slots_free_on_drop() {
        let keys = Keys::new(vec!["a".into(), "b".into()], Some(2));
        let a = headers(&[("x-api-key", "a")]);
        let first = keys.admit(&a).unwrap();
        let _second = keys.admit(&a).unwrap();
        assert_eq!(keys.admit(&a).err(), Some(KeyRefusal::Busy { limit: 2 }));
        assert!(keys.admit(&headers(&[("x-api-key", "b")])).is_ok(), "another key has its own slots");
        drop(first);
        assert!(keys.admit(&a).is_ok());
    }

    #[test]
    fn key_files_skip_blanks_and_comments() {
        assert_eq!(Keys::parse_file("# keys\nk1\n\n  k2  \n"), vec!["k1".to_string(), "k2".to_string()]);
    }
}
