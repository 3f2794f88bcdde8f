//! Judging what the engine answered: each case's result (the kernel self-test's
//! `CaseReport`), the bisection that pins a clamp to one token, and the verdict. Pure.
//!
//! A 5xx (or any other refusal of a prompt that fits), a request past its deadline, a dropped
//! connection, an answer that is not an OpenAI completion, one with nothing generated or with
//! non-finite log-probabilities, and a prompt the engine counted at another length than it was
//! built for are each a failure naming the case and the request.

use brink_api::selftest::{CaseReport, CaseResult, Verdict, threshold_verdict};

use super::plan::{HttpCase, Request};

/// What one request got back.
#[derive(Clone, Debug, PartialEq)]
pub enum Answer {
    /// A completion: the engine's counts, the text's length, and whether its log-probabilities
    /// were finite (`None` when the engine gave none).
    Completion { prompt_tokens: u64, completion_tokens: u64, text_chars: usize, finite: Option<bool> },
    /// A non-2xx status and what the body said.
    Status { status: u16, body: String },
    /// No answer within the deadline.
    Timeout { after_s: f64 },
    /// The connection could not be made, or broke before the answer was complete.
    Dropped(String),
    /// A 2xx answer that is not an OpenAI completion.
    Malformed(String),
    /// The prompt could not be built at its length (the tokenizer endpoint disagreed).
    Unsized(String),
}

/// One line on what went wrong with `answer` to a request of `req`, if anything; and whether it
/// was a length mismatch.
pub fn problem(req: &Request, answer: &Answer) -> Option<(String, bool)> {
    let n = req.prompt_tokens;
    let p = match answer {
        Answer::Completion { prompt_tokens, .. } if *prompt_tokens != n => {
            return Some((format!("built for {n} prompt tokens, the engine counted {prompt_tokens}"), true));
        }
        Answer::Completion { completion_tokens: 0, .. } => format!("{n}-token prompt: empty answer (0 tokens generated)"),
        Answer::Completion { finite: Some(false), .. } => format!("{n}-token prompt: non-finite log-probabilities in the answer"),
        Answer::Completion { .. } => return None,
        Answer::Status { status, body } => format!("{n}-token prompt: HTTP {status}: {body}"),
        Answer::Timeout { after_s } => format!("{n}-token prompt: no answer within its deadline of {after_s:.1} s"),
        Answer::Dropped(e) => format!("{n}-token prompt: connection dropped: {e}"),
        Answer::Malformed(e) => format!("{n}-token prompt: not an OpenAI completion: {e}"),
        Answer::Unsized(e) => return Some((format!("{n}-token prompt could not be built: {e}"), true)),
    };
    Some((p, false))
}

/// The report line of `case`, from its requests' answers (in the order of `case.requests`).
pub fn judge(case: &HttpCase, answers: &[Answer], wall_ms: f64) -> CaseReport {
    let problems: Vec<String> = case.requests.iter().zip(answers).filter_map(|(r, a)| problem(r, a)).map(|(p, _)| p).collect();
    let hung = answers.iter().any(|a| matches!(a, Answer::Timeout { .. }));
    let result = match (problems.is_empty(), hung) {
        (true, _) => CaseResult::Passed,
        (false, true) => CaseResult::Hung,
        (false, false) => CaseResult::Failed,
    };
    let detail = if problems.is_empty() {
        format!("{} request(s) answered in {:.0} ms", case.requests.len(), wall_ms)
    } else {
        let more = if problems.len() > 2 { format!(" (and {} more)", problems.len() - 2) } else { String::new() };
        format!("{}{more}", problems.iter().take(2).cloned().collect::<Vec<_>>().join("; "))
    };
    report(case, result, detail, wall_ms)
}

/// Requests of `answers` whose prompt was not the length it was built for.
pub fn mismatches(case: &HttpCase, answers: &[Answer]) -> u64 {
    case.requests.iter().zip(answers).filter(|(r, a)| problem(r, a).is_some_and(|(_, m)| m)).count() as u64
}

/// A case that did not run.
pub fn skipped(case: &HttpCase, why: &str) -> CaseReport {
    report(case, CaseResult::Skipped, why.to_string(), 0.0)
}

fn report(case: &HttpCase, result: CaseResult, detail: String, wall_ms: f64) -> CaseReport {
    CaseReport {
        id: case.id.clone(),
        kernel: case.composition.label().into(),
        tokens: case.longest(),
        batch: case.batch(),
        reasons: case.reasons.clone(),
        expect: "pass".into(),
        result,
        detail,
        max_rel_err: None,
        tolerance: None,
        compared: case.requests.len() as u64,
        kernel_ms: None,
        wall_ms,
    }
}

fn failed(c: &CaseReport) -> bool {
    matches!(c.result, CaseResult::Failed | CaseResult::Hung)
}

/// The next prompt length to try, when every failure lies above every pass and a gap is left
/// between the longest pass and the shortest failure: its middle. Halving it until the two are
/// one token apart makes a clamp's limit the longest prompt shown to pass.
pub fn next_bisect(cases: &[CaseReport]) -> Option<u64> {
    let pass = cases.iter().filter(|c| c.result == CaseResult::Passed).map(|c| c.tokens).max()?;
    let fail = cases.iter().filter(|c| failed(c)).map(|c| c.tokens).min()?;
    (fail > pass + 1).then(|| pass + (fail - pass) / 2)
}

/// The verdict: the kernel self-test's rule over the cases' longest prompts (pass; clamp under
/// the first failure when every failure lies above every pass; refuse when one lies below a
/// pass), except that an engine which stopped answering after a failure is refused (a clamp
/// cannot keep a dead engine serving), and so is one that passed nothing.
pub fn verdict(cases: &[CaseReport], engine_died: Option<&str>) -> Verdict {
    if let Some(died) = engine_died {
        return Verdict::Disqualified { reason: format!("the engine stopped answering: {died}") };
    }
    if cases.iter().all(|c| c.result == CaseResult::Skipped) {
        return Verdict::NotQualified { reason: "no case was run".into() };
    }
    if !cases.iter().any(|c| c.result == CaseResult::Passed) {
        let first = cases.iter().filter(|c| failed(c)).min_by_key(|c| c.tokens);
        let why = first.map_or(String::new(), |c| format!(": {} {}", c.id, c.detail));
        return Verdict::Disqualified { reason: format!("no case passed{why}") };
    }
    match threshold_verdict(cases) {
        Verdict::Disqualified { reason } => {
            // Name the failing case, not only the composition.
            let first = cases.iter().filter(|c| failed(c)).min_by_key(|c| c.tokens);
            Verdict::Disqualified { reason: first.map_or(reason.clone(), |c| format!("{}: {reason}", c.id)) }
        }
        v => v,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blackbox::plan::Composition;

    fn case(n: u64) -> HttpCase {
        HttpCase::single(n, vec!["r".into()])
    }

    fn ok(n: u64) -> Answer {
        Answer::Completion { prompt_tokens: n, completion_tokens: 2, text_chars: 5, finite: Some(true) }
    }

    fn line(n: u64, a: Answer) -> CaseReport {
        judge(&case(n), &[a], 1.0)
    }

    #[test]
    fn each_kind_of_answer_is_judged_and_named() {
        let table: Vec<(Answer, CaseResult, &str)> = vec![
            (ok(100), CaseResult::Passed, "answered"),
            (Answer::Status { status: 500, body: "boom".into() }, CaseResult::Failed, "HTTP 500: boom"),
            (Answer::Timeout { after_s: 2.0 }, CaseResult::Hung, "deadline of 2.0 s"),
            (Answer::Dropped("reset".into()), CaseResult::Failed, "connection dropped: reset"),
            (Answer::Malformed("no choices".into()), CaseResult::Failed, "not an OpenAI completion"),
            (
                Answer::Completion { prompt_tokens: 100, completion_tokens: 0, text_chars: 0, finite: None },
                CaseResult::Failed,
                "empty answer",
            ),
            (
                Answer::Completion { prompt_tokens: 100, completion_tokens: 2, text_chars: 3, finite: Some(false) },
                CaseResult::Failed,
                "non-finite",
            ),
            (ok(101), CaseResult::Failed, "built for 100 prompt tokens, the engine counted 101"),
        ];
        for (answer, result, needle) in table {
            let r = line(100, answer.clone());
            assert_eq!(r.result, result, "{answer:?}");
            assert!(r.detail.contains(needle), "{answer:?}: {}", r.detail);
            assert_eq!((r.tokens, r.kernel.as_str(), r.id.as_str()), (100, "http/single", "http/single/t100"));
        }
        assert_eq!(mismatches(&case(100), &[ok(101)]), 1);
        assert_eq!(mismatches(&case(100), &[ok(100)]), 0);
    }

    #[test]
    fn a_concurrent_case_fails_on_any_request_and_hangs_on_any_timeout() {
        let c = HttpCase {
            id: "http/4-concurrent/t40".into(),
            composition: Composition::FourConcurrent,
            count: 40,
            requests: vec![Request { prompt_tokens: 10, max_tokens: 2 }; 4],
            reasons: vec![],
        };
        let r = judge(&c, &[ok(10), Answer::Status { status: 503, body: "x".into() }, ok(10), Answer::Timeout { after_s: 1.0 }], 5.0);
        assert_eq!(r.result, CaseResult::Hung);
        assert!(r.detail.contains("HTTP 503") && r.detail.contains("deadline"), "{}", r.detail);
        assert_eq!((r.tokens, r.batch.len(), r.compared), (10, 4, 4));
    }

    #[test]
    fn verdicts_pass_clamp_and_refuse() {
        let pass = |n| line(n, ok(n));
        let fail = |n| line(n, Answer::Status { status: 500, body: "x".into() });
        let hang = |n| line(n, Answer::Timeout { after_s: 1.0 });
        assert_eq!(verdict(&[pass(10), pass(900)], None), Verdict::Qualified { max_tokens: 900 });
        assert_eq!(verdict(&[pass(10), pass(699), fail(700), fail(900)], None), Verdict::Clamped { max_tokens: 699, first_failure: 700 });
        // A hang at a residue with passes above it: no clamp avoids it.
        let v = verdict(&[pass(10), hang(81), pass(900)], None);
        assert!(matches!(&v, Verdict::Disqualified { reason } if reason.starts_with("http/single/t81")), "{v:?}");
        // Failures above every pass, but the engine died: refused.
        let v = verdict(&[pass(10), fail(700)], Some("after http/single/t700: connection refused"));
        assert!(matches!(&v, Verdict::Disqualified { reason } if reason.contains("stopped answering")), "{v:?}");
        assert!(matches!(verdict(&[fail(10), fail(20)], None), Verdict::Disqualified { reason } if reason.contains("no case passed")));
        let skipped = skipped(&case(5), "above the context");
        assert!(matches!(verdict(&[skipped], None), Verdict::NotQualified { .. }));
    }

    #[test]
    fn bisection_halves_the_gap_between_the_longest_pass_and_the_first_failure() {
        let pass = |n| line(n, ok(n));
        let fail = |n| line(n, Answer::Status { status: 500, body: "x".into() });
        assert_eq!(next_bisect(&[pass(10), pass(512), fail(768), fail(1000)]), Some(640));
        assert_eq!(next_bisect(&[pass(10), pass(699), fail(700)]), None);
        assert_eq!(next_bisect(&[pass(10)]), None);
        assert_eq!(next_bisect(&[fail(10)]), None);
        // Failing below a pass: nothing to bisect (refused anyway).
        assert_eq!(next_bisect(&[fail(5), pass(10)]), None);
        // Converges on the threshold.
        let threshold = 701;
        let mut cases = vec![pass(10), pass(512), fail(1000)];
        while let Some(n) = next_bisect(&cases) {
            cases.push(if n < threshold { pass(n) } else { fail(n) });
        }
        assert_eq!(verdict(&cases, None), Verdict::Clamped { max_tokens: 700, first_failure: 701 });
        assert!(cases.len() <= 3 + 10);
    }
}
