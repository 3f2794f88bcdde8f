//! The node's verdict for a shape class from its two suites (the kernel self-test and the
//! model-level threshold test), and the serving envelope it allows. Pure.
//!
//! The rules are the design's, applied across both suites: a failure below a passing count in
//! either suite disqualifies; otherwise the node serves with batch and chunk clamped under the
//! lowest first failure of either. Without a GPU the kernels run nothing: the model test (on
//! the CPU backend) can still clamp or disqualify, but its passing alone qualifies no GPU, so
//! the verdict stays "not qualified" and nothing is clamped.

use brink_api::{Envelope, ServingParams, Verdict};

/// Both suites together.
pub fn combine(kernels: &Verdict, model: &Verdict) -> Verdict {
    use Verdict::*;
    let disqualified: Vec<String> = [("kernels", kernels), ("model test", model)]
        .iter()
        .filter_map(|(suite, v)| match v {
            Disqualified { reason } => Some(format!("{suite}: {reason}")),
            _ => None,
        })
        .collect();
    if !disqualified.is_empty() {
        return Disqualified { reason: disqualified.join("; ") };
    }
    // Cases that pass prove nothing unless the controls were shown to fail.
    for (suite, v) in [("kernels", kernels), ("model test", model)] {
        if let ProofIncomplete { reason } = v {
            return ProofIncomplete { reason: format!("{suite}: {reason}") };
        }
    }
    match (kernels, model) {
        (NotQualified { reason: k }, NotQualified { reason: m }) => NotQualified { reason: format!("kernels: {k}; model test: {m}") },
        (NotQualified { .. }, Clamped { max_tokens, first_failure }) => Clamped { max_tokens: *max_tokens, first_failure: *first_failure },
        (NotQualified { reason }, Qualified { max_tokens }) => {
            NotQualified { reason: format!("{reason}; the model test passed on this backend up to {max_tokens} tokens per batch") }
        }
        (executed, NotQualified { .. }) => executed.clone(),
        (a, b) => {
            let (max_a, fail_a) = limits(a);
            let (max_b, fail_b) = limits(b);
            let max_tokens = max_a.min(max_b);
            match (fail_a, fail_b) {
                (None, None) => Qualified { max_tokens },
                (f, g) => Clamped { max_tokens, first_failure: f.into_iter().chain(g).min().unwrap_or(max_tokens + 1) },
            }
        }
    }
}

/// (largest validated count, first failure) of an executed suite's verdict.
fn limits(v: &Verdict) -> (u64, Option<u64>) {
    match v {
        Verdict::Qualified { max_tokens } => (*max_tokens, None),
        Verdict::Clamped { max_tokens, first_failure } => (*max_tokens, Some(*first_failure)),
        Verdict::Disqualified { .. } | Verdict::NotQualified { .. } | Verdict::ProofIncomplete { .. } => (u64::MAX, None),
    }
}

/// Why a verdict allows no serving envelope (the node may not serve the class).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("the self-tests validated no batch size (0 tokens)")]
    NothingValidated,
    #[error("disqualified: {0}")]
    Disqualified(String),
    /// The negative controls were not shown to fail (`Verdict::ProofIncomplete`).
    #[error("not qualified: {0}")]
    ProofIncomplete(String),
}

/// The limits `requested` are served under, or why this node may not serve the class.
pub fn envelope(verdict: &Verdict, requested: ServingParams) -> Result<Envelope, Refusal> {
    let clamp = |max: u64, first_failure| Envelope {
        validated: true,
        validated_tokens: Some(max),
        first_failure,
        max_batch_tokens: requested.max_batch_tokens.min(max),
        prefill_chunk: requested.prefill_chunk.min(max),
    };
    match verdict {
        Verdict::Qualified { max_tokens } | Verdict::Clamped { max_tokens, .. } if *max_tokens == 0 => Err(Refusal::NothingValidated),
        Verdict::Qualified { max_tokens } => Ok(clamp(*max_tokens, None)),
        Verdict::Clamped { max_tokens, first_failure } => Ok(clamp(*max_tokens, Some(*first_failure))),
        Verdict::NotQualified { .. } => Ok(Envelope {
            validated: false,
            validated_tokens: None,
            first_failure: None,
            max_batch_tokens: requested.max_batch_tokens,
            prefill_chunk: requested.prefill_chunk,
        }),
        Verdict::Disqualified { reason } => Err(Refusal::Disqualified(reason.clone())),
        Verdict::ProofIncomplete { reason } => Err(Refusal::ProofIncomplete(reason.clone())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Verdict::*;

    fn q(max: u64) -> Verdict {
        Qualified { max_tokens: max }
    }
    fn c(max: u64, fail: u64) -> Verdict {
        Clamped { max_tokens: max, first_failure: fail }
    }
    fn d(why: &str) -> Verdict {
        Disqualified { reason: why.into() }
    }
    fn nq(why: &str) -> Verdict {
        NotQualified { reason: why.into() }
    }
    fn pi(why: &str) -> Verdict {
        ProofIncomplete { reason: why.into() }
    }

    #[test]
    fn both_suites_decide_together() {
        let table: Vec<(Verdict, Verdict, Verdict)> = vec![
            // Both pass: the smaller validated count bounds the envelope.
            (q(2_097_152), q(16_384), q(16_384)),
            // A failure above every pass in one suite clamps; the lowest failure wins.
            (c(8191, 8192), q(16_384), c(8191, 8192)),
            (q(2_097_152), c(4095, 4096), c(4095, 4096)),
            (c(8191, 8192), c(4095, 4096), c(4095, 4096)),
            // No GPU: the CPU model test alone qualifies nothing, but it can clamp.
            (nq("no GPU"), q(1024), nq("no GPU; the model test passed on this backend up to 1024 tokens per batch")),
            (nq("no GPU"), c(299, 300), c(299, 300)),
            (nq("a"), nq("b"), nq("kernels: a; model test: b")),
            // A model test that could not run leaves the kernels' verdict.
            (c(8191, 8192), nq("no model"), c(8191, 8192)),
            // Kernel cases never shown able to fail: nothing qualifies, whatever the model test says.
            (pi("controls not run"), q(16_384), pi("kernels: controls not run")),
            (pi("controls not run"), c(4095, 4096), pi("kernels: controls not run")),
        ];
        for (k, m, want) in table {
            assert_eq!(combine(&k, &m), want, "{k:?} + {m:?}");
        }
    }

    #[test]
    fn a_failure_below_a_pass_in_either_suite_disqualifies() {
        let tail = "attention fails at 63 tokens but 64 pass";
        assert_eq!(combine(&d(tail), &q(16_384)), d(&format!("kernels: {tail}")));
        assert_eq!(combine(&q(16_384), &d("model/mixed fails at 5")), d("model test: model/mixed fails at 5"));
        assert_eq!(combine(&nq("no GPU"), &d("x")), d("model test: x"));
        assert_eq!(combine(&d("a"), &d("b")), d("kernels: a; model test: b"));
    }

    const ASKED: ServingParams = ServingParams { max_batch_tokens: 16_384, prefill_chunk: 4096, context: 32_768, full_window_kv: false };

    #[test]
    fn the_envelope_clamps_under_the_first_failure() {
        let e = envelope(&c(8191, 8192), ASKED).unwrap();
        assert_eq!((e.validated, e.validated_tokens, e.first_failure), (true, Some(8191), Some(8192)));
        assert_eq!((e.max_batch_tokens, e.prefill_chunk), (8191, 4096));
        let e = envelope(&c(1023, 1024), ASKED).unwrap();
        assert_eq!((e.max_batch_tokens, e.prefill_chunk), (1023, 1023));
        let e = envelope(&q(2_097_152), ASKED).unwrap();
        assert_eq!((e.max_batch_tokens, e.prefill_chunk, e.first_failure), (16_384, 4096, None));
    }

    #[test]
    fn an_incomplete_proof_refuses_to_serve() {
        let e = envelope(&pi("negative controls not run"), ASKED).unwrap_err();
        assert_eq!(e, Refusal::ProofIncomplete("negative controls not run".into()));
        assert!(e.to_string().contains("not qualified: negative controls not run"), "{e}");
    }

    #[test]
    fn no_gpu_clamps_nothing_and_disqualified_refuses() {
        let e = envelope(&nq("no GPU"), ASKED).unwrap();
        assert!(!e.validated);
        assert_eq!((e.max_batch_tokens, e.prefill_chunk), (16_384, 4096));
        assert_eq!(envelope(&d("tail at 5"), ASKED).unwrap_err().to_string(), "disqualified: tail at 5");
        assert_eq!(envelope(&q(0), ASKED).unwrap_err(), Refusal::NothingValidated);
        assert!(envelope(&q(0), ASKED).unwrap_err().to_string().contains("0 tokens"));
    }
}
