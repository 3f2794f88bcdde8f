//! Everything the double keeps behind one lock: kinds, objects, the clock, injected faults and the
//! request log.

use jiff::{SignedDuration, Timestamp};
use serde_json::Value;

use crate::error::ApiError;
use crate::kinds::KindRegistry;
use crate::store::Store;

/// Timestamps from tokio's clock (so a paused test clock drives them), starting at a fixed instant.
#[derive(Debug, Clone)]
pub struct Clock {
    base: Timestamp,
    start: tokio::time::Instant,
}

impl Default for Clock {
    fn default() -> Self {
        Self { base: Timestamp::from_second(1_767_225_600).unwrap_or(Timestamp::UNIX_EPOCH), start: tokio::time::Instant::now() }
    }
}

impl Clock {
    /// A clock that reads `at` now and advances with tokio's clock from here.
    pub fn starting_at(at: Timestamp) -> Self {
        Self { base: at, start: tokio::time::Instant::now() }
    }

    /// RFC 3339 with second precision, as `metav1.Time` serialises.
    pub fn now(&self) -> String {
        let elapsed = SignedDuration::try_from(self.start.elapsed()).unwrap_or(SignedDuration::ZERO);
        let t = self.base.checked_add(elapsed).unwrap_or(self.base);
        t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
    }
}

/// An injected failure: the next `remaining` requests that match get `error` instead of being served.
#[derive(Debug, Clone)]
pub struct Fault {
    /// `None`: any method.
    pub method: Option<http::Method>,
    /// Matches when the request path (without the query) contains this.
    pub path_contains: String,
    pub remaining: u32,
    pub error: ApiError,
}

/// One request as the double received it.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedRequest {
    pub method: http::Method,
    pub path: String,
    pub query: String,
    pub content_type: Option<String>,
    /// The body, parsed as JSON (or YAML for apply patches); `None` when empty.
    pub body: Option<Value>,
}

impl RecordedRequest {
    /// `PATCH /apis/brink.dev/v1alpha1/sparknodes/n/status?fieldManager=agent`.
    pub fn line(&self) -> String {
        if self.query.is_empty() {
            format!("{} {}", self.method, self.path)
        } else {
            format!("{} {}?{}", self.method, self.path, self.query)
        }
    }

    pub fn query_param(&self, name: &str) -> Option<String> {
        form_urlencoded::parse(self.query.as_bytes()).find(|(k, _)| k == name).map(|(_, v)| v.into_owned())
    }
}

#[derive(Default)]
pub struct State {
    pub registry: KindRegistry,
    pub store: Store,
    pub clock: Clock,
    pub uid_seq: u64,
    pub name_seq: u64,
    pub faults: Vec<Fault>,
    pub log: Vec<RecordedRequest>,
}

impl State {
    pub fn new(registry: KindRegistry) -> Self {
        Self { registry, ..Self::default() }
    }

    /// Deterministic UUID-shaped uids.
    pub fn next_uid(&mut self) -> String {
        self.uid_seq += 1;
        format!("00000000-0000-4000-8000-{:012x}", self.uid_seq)
    }

    /// The 5-character suffix `generateName` gets (from the API server's alphabet, without vowels).
    pub fn next_name_suffix(&mut self) -> String {
        const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
        self.name_seq += 1;
        let mut n = self.name_seq.wrapping_mul(2_654_435_761);
        (0..5)
            .map(|_| {
                let c = ALPHABET[(n % ALPHABET.len() as u64) as usize] as char;
                n /= ALPHABET.len() as u64;
                c
            })
            .collect()
    }

    /// The first fault matching this request, consumed once.
    pub fn take_fault(&mut self, method: &http::Method, path: &str) -> Option<ApiError> {
        let f = self
            .faults
            .iter_mut()
            .find(|f| f.remaining > 0 && f.method.as_ref().is_none_or(|m| m == method) && path.contains(&f.path_contains))?;
        f.remaining -= 1;
        let err = f.error.clone();
        self.faults.retain(|f| f.remaining > 0);
        Some(err)
    }
}
