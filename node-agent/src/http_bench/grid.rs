//! The benchmark grid: every (prompt tokens, concurrency, generated tokens) point of the flags'
//! lists, and how long each point runs. Checked here, before any request, so a bad flag is named
//! in a message rather than found halfway through a long sweep.

use std::fmt;
use std::time::Duration;

/// One point of the grid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GridPoint {
    pub prompt_tokens: u64,
    pub concurrency: usize,
    pub max_tokens: u64,
}

/// How long each point runs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Budget {
    /// This many requests in all, spread over the point's clients.
    Requests(u64),
    /// This many requests per client (the default: the point's concurrency times this).
    PerClient(u64),
    /// Clients start requests until this much time has passed; the ones in flight finish.
    Duration(Duration),
}

impl Budget {
    /// The requests a point at `concurrency` runs; `None` when time decides.
    pub fn requests(self, concurrency: usize) -> Option<u64> {
        match self {
            Budget::Requests(n) => Some(n),
            Budget::PerClient(k) => Some(k.saturating_mul(concurrency as u64)),
            Budget::Duration(_) => None,
        }
    }
}

/// A flag's value that cannot make a benchmark.
#[derive(Debug, PartialEq, Eq)]
pub struct GridError {
    pub flag: &'static str,
    pub message: String,
}

impl fmt::Display for GridError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.flag, self.message)
    }
}

impl std::error::Error for GridError {}

/// More simultaneous clients than this is a typo, not a benchmark of one server.
pub const MAX_CONCURRENCY: usize = 4096;
/// Prompts longer than this are a typo (no served model has a context near 2^24 tokens).
pub const MAX_PROMPT_TOKENS: u64 = 1 << 24;

fn err(flag: &'static str, message: impl Into<String>) -> GridError {
    GridError { flag, message: message.into() }
}

/// Each value positive, at most `max`, and listed once (a repeated value would run a point twice).
fn check_list<T: Copy + PartialOrd + fmt::Display>(flag: &'static str, values: &[T], zero: T, max: T) -> Result<(), GridError> {
    if values.is_empty() {
        return Err(err(flag, "needs at least one value"));
    }
    for (i, &v) in values.iter().enumerate() {
        if v <= zero {
            return Err(err(flag, format!("{v} is not positive")));
        }
        if v > max {
            return Err(err(flag, format!("{v} is above the limit of {max}")));
        }
        if values[..i].contains(&v) {
            return Err(err(flag, format!("{v} is listed twice")));
        }
    }
    Ok(())
}

/// The grid in run order: prompt tokens outermost, then concurrency, then generated tokens.
pub fn expand(prompt_tokens: &[u64], concurrency: &[usize], max_tokens: &[u64], budget: Budget) -> Result<Vec<GridPoint>, GridError> {
    check_list("--prompt-tokens", prompt_tokens, 0, MAX_PROMPT_TOKENS)?;
    check_list("--concurrency", concurrency, 0, MAX_CONCURRENCY)?;
    check_list("--max-tokens", max_tokens, 0, MAX_PROMPT_TOKENS)?;
    match budget {
        Budget::Requests(0) => return Err(err("--requests", "0 requests measure nothing")),
        Budget::Requests(n) => {
            // Fewer requests than clients would never reach the point's concurrency.
            let most = concurrency.iter().copied().max().unwrap_or(1);
            if n < most as u64 {
                return Err(err(
                    "--requests",
                    format!("{n} is below --concurrency {most}: that point would never have {most} requests in flight"),
                ));
            }
        }
        Budget::PerClient(0) => return Err(err("--requests", "0 requests per client measure nothing")),
        Budget::PerClient(_) => {}
        Budget::Duration(d) if d.is_zero() => return Err(err("--duration", "must be more than 0 seconds")),
        Budget::Duration(_) => {}
    }
    let mut points = Vec::with_capacity(prompt_tokens.len() * concurrency.len() * max_tokens.len());
    for &p in prompt_tokens {
        for &c in concurrency {
            for &m in max_tokens {
                points.push(GridPoint { prompt_tokens: p, concurrency: c, max_tokens: m });
            }
        }
    }
    Ok(points)
}

/// `--duration` seconds as a [`Duration`], refusing what `Duration` cannot hold.
pub fn duration_flag(seconds: f64) -> Result<Duration, GridError> {
    if !seconds.is_finite() || seconds <= 0.0 {
        return Err(err("--duration", format!("{seconds} is not a positive number of seconds")));
    }
    Duration::try_from_secs_f64(seconds).map_err(|_| err("--duration", format!("{seconds} seconds is too long")))
}

#[cfg(test)]
mod tests {
    use super::*;

    const R8: Budget = Budget::Requests(8);

    #[test]
    fn expands_in_order() {
        let g = expand(&[128, 1024], &[1, 4], &[64], R8).unwrap();
        let got: Vec<_> = g.iter().map(|p| (p.prompt_tokens, p.concurrency, p.max_tokens)).collect();
        assert_eq!(got, [(128, 1, 64), (128, 4, 64), (1024, 1, 64), (1024, 4, 64)]);
        assert_eq!(expand(&[1, 2, 3], &[1, 2], &[5, 6], R8).unwrap().len(), 12);
    }

    /// Prompt tokens, concurrency, max tokens, budget; the flag named and a phrase of the message.
    type Case = (&'static [u64], &'static [usize], &'static [u64], Budget, &'static str, &'static str);

    #[test]
    fn bad_values_name_their_flag() {
        let cases: [Case; 10] = [
            (&[], &[1], &[1], R8, "--prompt-tokens", "at least one"),
            (&[0], &[1], &[1], R8, "--prompt-tokens", "0 is not positive"),
            (&[128, 64, 128], &[1], &[1], R8, "--prompt-tokens", "128 is listed twice"),
            (&[MAX_PROMPT_TOKENS + 1], &[1], &[1], R8, "--prompt-tokens", "above the limit"),
            (&[1], &[0], &[1], R8, "--concurrency", "0 is not positive"),
            (&[1], &[5000], &[1], Budget::Requests(5000), "--concurrency", "above the limit"),
            (&[1], &[1], &[0], R8, "--max-tokens", "0 is not positive"),
            (&[1], &[1], &[4, 4], R8, "--max-tokens", "listed twice"),
            (&[1], &[1, 16], &[1], R8, "--requests", "below --concurrency 16"),
            (&[1], &[1], &[1], Budget::Requests(0), "--requests", "measure nothing"),
        ];
        for (p, c, m, b, flag, needle) in cases {
            let e = expand(p, c, m, b).unwrap_err();
            assert_eq!(e.flag, flag, "{p:?} {c:?} {m:?}: {e}");
            assert!(e.to_string().contains(needle), "{e}");
            assert!(e.to_string().starts_with(flag), "{e}");
        }
    }

    #[test]
    fn duration_budget() {
        assert_eq!(duration_flag(2.5).unwrap(), Duration::from_millis(2500));
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY, 1e30] {
            assert_eq!(duration_flag(bad).unwrap_err().flag, "--duration", "{bad}");
        }
        // A duration budget does not tie the clients to a request count.
        assert_eq!(expand(&[8], &[64], &[8], Budget::Duration(Duration::from_secs(1))).unwrap().len(), 1);
        assert_eq!(expand(&[8], &[1], &[8], Budget::Duration(Duration::ZERO)).unwrap_err().flag, "--duration");
        assert_eq!(Budget::Duration(Duration::from_secs(1)).requests(4), None);
    }

    #[test]
    fn requests_per_point() {
        assert_eq!(Budget::Requests(10).requests(4), Some(10));
        assert_eq!(Budget::PerClient(4).requests(16), Some(64));
        assert_eq!(expand(&[8], &[64], &[8], Budget::PerClient(1)).unwrap().len(), 1);
    }
}
