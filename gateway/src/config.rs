//! What a gateway runs with, already checked (the CLI builds it from flags; tests directly).

use std::time::Duration;

use crate::pick::DEFAULT_LOAD_BOUND;

#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// Replica base URLs, `http://host:port` without a trailing slash, in `--upstream` order
    /// (the order ties in load are broken by).
    pub upstreams: Vec<String>,
    /// Client keys; empty: none required.
    pub api_keys: Vec<String>,
    /// Sent to replicas as `Authorization: Bearer`.
    pub upstream_api_key: Option<String>,
    pub per_key_concurrency: Option<usize>,
    /// Extra tries after the first, on other replicas.
    pub retry_budget: usize,
    pub poll_interval: Duration,
    /// Characters of the prompt that make its affinity key; 0 turns affinity off.
    pub affinity_prefix_chars: usize,
    /// With a replica's slots unknown: how many requests more than the least loaded replica a
    /// prompt's home may carry and still take the prompt.
    pub load_bound: f64,
    /// Sequences each `--upstream` replica runs at once (its `--slots`), when given: a prompt's
    /// home takes it only with a slot free. Replicas found in a cluster use their deployment's
    /// `serving.concurrency` instead.
    pub upstream_slots: Option<u64>,
    /// Replicas come from the cluster's API (watched), not from `upstreams`.
    pub kubernetes: bool,
    /// With `kubernetes`: the namespaces whose replicas are routed to (empty: all).
    pub namespaces: Vec<String>,
}

impl Config {
    /// The defaults of every flag, for `upstreams`.
    pub fn new(upstreams: Vec<String>) -> Config {
        Config {
            upstreams,
            api_keys: Vec::new(),
            upstream_api_key: None,
            per_key_concurrency: None,
            retry_budget: 2,
            poll_interval: Duration::from_millis(1000),
            affinity_prefix_chars: 2048,
            load_bound: DEFAULT_LOAD_BOUND,
            upstream_slots: None,
            kubernetes: false,
            namespaces: Vec::new(),
        }
    }
}
