//! Names and labels derived from object names, kept within Kubernetes' length limits: a label
//! value and a Service name take at most 63 characters, object names 253.

use sha2::{Digest, Sha256};

pub const DEPLOYMENT_LABEL: &str = "brink.dev/deployment";
pub const REPLICA_LABEL: &str = "brink.dev/replica";
pub const REVISION_LABEL: &str = "brink.dev/revision";
/// The replica's `Model` on its Pod (dashboards and `kubectl get pods -l` select by it).
pub const MODEL_LABEL: &str = "brink.dev/model";
/// On a `ModelReplica`: the deployment's tolerations, node selector and priority class when
/// the replica was made, for its Pod (a snapshot, like the serving limits).
pub const SCHEDULING_ANNOTATION: &str = "brink.dev/pod-scheduling";
/// The hash of the desired Pod, to tell a Pod that must be recreated.
pub const POD_SPEC_ANNOTATION: &str = "brink.dev/pod-spec-hash";

fn short_hash(s: &str, hex: usize) -> String {
    Sha256::digest(s.as_bytes()).iter().map(|b| format!("{b:02x}")).collect::<String>()[..hex].to_string()
}

/// `s` cut to `max` characters with a hash of the whole appended, so that two long names that
/// share a prefix stay distinct; `s` itself when it fits. Names are ASCII (DNS), so byte
/// indices are character indices.
fn fit(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let head = s[..max - 11].trim_end_matches(['-', '.', '_']);
    format!("{head}-{}", short_hash(s, 10))
}

/// A label value for an object name.
pub fn label_value(name: &str) -> String {
    fit(name, 63)
}

/// A DNS-1035 label (Service names): at most 63, starting with a letter, no dots.
pub fn dns_label(name: &str) -> String {
    let mut cleaned = name.replace('.', "-");
    if !cleaned.starts_with(|c: char| c.is_ascii_lowercase()) {
        cleaned = format!("d-{cleaned}");
    }
    if cleaned == name {
        return fit(name, 63);
    }
    // Rewritten: a hash of the original keeps `a.b` and `a-b` apart.
    let head: String = cleaned.chars().take(52).collect();
    format!("{}-{}", head.trim_end_matches('-'), short_hash(name, 10))
}

/// The name of a deployment's replica in `slot`: the Pod takes the same name.
pub fn replica_name(deployment: &str, slot: u64) -> String {
    let suffix = format!("-{slot}");
    format!("{}{suffix}", fit(deployment, 253 - suffix.len()))
}

/// The heartbeat Lease of a node.
pub fn heartbeat_lease(node: &str) -> String {
    format!("brink-node-{node}")
}

/// The selector of a deployment's replica Pods, as `/scale` and `kubectl` read it.
pub fn selector(deployment: &str) -> String {
    format!("{DEPLOYMENT_LABEL}={}", label_value(deployment))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_fit_their_limits_and_stay_distinct() {
        assert_eq!(label_value("qwen"), "qwen");
        assert_eq!(dns_label("qwen"), "qwen");
        assert_eq!(replica_name("qwen", 3), "qwen-3");
        let long_a = format!("{}a", "x".repeat(80));
        let long_b = format!("{}b", "x".repeat(80));
        for f in [label_value, dns_label] {
            let (a, b) = (f(&long_a), f(&long_b));
            assert!(a.len() <= 63 && b.len() <= 63, "{a} {b}");
            assert_ne!(a, b);
        }
        let d = dns_label("1.model");
        assert!(d.starts_with("d-1-model-") && d.len() <= 63 && !d.contains('.'), "{d}");
        assert_ne!(dns_label("a.b"), dns_label("a-b"));
        let r = replica_name(&"y".repeat(253), 12);
        assert!(r.len() <= 253 && r.ends_with("-12"), "{}", r.len());
        assert_eq!(selector("qwen"), "brink.dev/deployment=qwen");
        assert_eq!(heartbeat_lease("spark-1"), "brink-node-spark-1");
    }
}
