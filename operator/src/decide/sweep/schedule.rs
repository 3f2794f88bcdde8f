//! When a `RegressionSweep` fires, with Kubernetes CronJob semantics: the most recent schedule
//! time that is due since the last firing (missed times collapse into one run), the starting
//! deadline, `suspend`, and the concurrency policy. Times are Unix seconds, UTC.

use brink_api::crd::ConcurrencyPolicy;
use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};
use jiff::Timestamp;
use jiff::tz::TimeZone;

/// Missed schedule times are counted up to this many (then reported as "at least").
pub const MAX_COUNTED_MISSES: u32 = 1000;

/// A parsed cron schedule: five fields or a macro, no seconds or years (as CronJob reads them).
#[derive(Clone, Debug)]
pub struct Schedule(Cron);

impl Schedule {
    pub fn parse(expr: &str) -> Result<Schedule, String> {
        let parser = CronParser::builder().seconds(Seconds::Disallowed).year(Year::Disallowed).build();
        parser.parse(expr).map(Schedule).map_err(|e| format!("spec.schedule {expr:?}: {e}"))
    }

    /// The first schedule time strictly after `t`, or `None` if there is none (e.g. 30 February).
    pub fn next_after(&self, t: i64) -> Option<i64> {
        let start = Timestamp::from_second(t).ok()?.to_zoned(TimeZone::UTC);
        self.0.find_next_occurrence(&start, false).ok().map(|z| z.timestamp().as_second())
    }
}

/// What the sweep controller sees when it reconciles a sweep.
#[derive(Clone, Debug)]
pub struct ScheduleInput<'a> {
    pub schedule: &'a Schedule,
    pub policy: ConcurrencyPolicy,
    pub starting_deadline_s: Option<u32>,
    pub suspend: bool,
    /// The sweep's creation time: nothing fires for times before it.
    pub created_s: i64,
    /// `status.lastScheduleTime`.
    pub last_schedule_s: Option<i64>,
    /// Names of runs not yet complete.
    pub active: &'a [String],
    pub now_s: i64,
}

/// Why a due firing did not start a run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Skip {
    Suspended,
    /// `Forbid` with runs still active: retried on later reconciles until the deadline passes.
    Forbidden {
        active: Vec<String>,
    },
    /// Later than `startingDeadlineSeconds` after the schedule time.
    MissedDeadline {
        scheduled_s: i64,
        late_s: i64,
    },
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScheduleDecision {
    /// The schedule time of the run to create now (it becomes `lastScheduleTime`).
    pub start: Option<i64>,
    /// Active runs to cancel first (`Replace`).
    pub cancel: Vec<String>,
    pub skipped: Option<Skip>,
    /// Due schedule times not started, besides the one started (an operator that was down).
    pub missed: u32,
    /// When to look again: the next schedule time.
    pub next_s: Option<i64>,
}

/// The decision for one reconcile.
pub fn decide(input: &ScheduleInput<'_>) -> ScheduleDecision {
    let mut earliest = input.last_schedule_s.unwrap_or(input.created_s);
    if let Some(deadline) = input.starting_deadline_s {
        // Times older than the deadline could not start anyway: do not walk through them. A
        // time exactly `deadline` ago may still start (`next_after` is strictly after: hence -1).
        earliest = earliest.max(input.now_s - i64::from(deadline) - 1);
    }
    let (mut due, mut count) = (None, 0u32);
    let mut t = earliest;
    while let Some(next) = input.schedule.next_after(t).filter(|&n| n <= input.now_s) {
        due = Some(next);
        count = count.saturating_add(1);
        if count >= MAX_COUNTED_MISSES {
            // A minutely schedule after a long outage: jump to the latest due time directly.
            due = Some(latest_at_or_before(input.schedule, next, input.now_s));
            break;
        }
        t = next;
    }
    let mut d = ScheduleDecision { next_s: input.schedule.next_after(input.now_s), ..ScheduleDecision::default() };
    let Some(scheduled) = due else { return d };
    d.missed = count.saturating_sub(1);
    if input.suspend {
        d.skipped = Some(Skip::Suspended);
        return d;
    }
    if let Some(deadline) = input.starting_deadline_s {
        let late = input.now_s - scheduled;
        if late > i64::from(deadline) {
            d.skipped = Some(Skip::MissedDeadline { scheduled_s: scheduled, late_s: late });
            return d;
        }
    }
    match (input.policy, input.active.is_empty()) {
        (_, true) | (ConcurrencyPolicy::Allow, false) => d.start = Some(scheduled),
        (ConcurrencyPolicy::Forbid, false) => d.skipped = Some(Skip::Forbidden { active: input.active.to_vec() }),
        (ConcurrencyPolicy::Replace, false) => {
            d.cancel = input.active.to_vec();
            d.start = Some(scheduled);
        }
    }
    d
}

/// The latest schedule time in `[from, now]`, where `from` is one. `next_after(x - 1) <= now`
/// ("a schedule time at or after x is due") holds for x = from and turns false once past the
/// latest one: a binary search finds it in ~log2(now - from) steps.
fn latest_at_or_before(schedule: &Schedule, from: i64, now: i64) -> i64 {
    let due_from = |x: i64| schedule.next_after(x - 1).is_some_and(|n| n <= now);
    let (mut lo, mut hi) = (from, now);
    while lo < hi {
        let mid = lo + (hi - lo + 1) / 2;
        if due_from(mid) { lo = mid } else { hi = mid - 1 }
    }
    schedule.next_after(lo - 1).unwrap_or(from)
}

/// The run's name: the sweep's and the schedule time in minutes, as CronJob names its Jobs, so
/// that a firing retried after a crash finds the run it already created.
pub fn run_name(sweep: &str, scheduled_s: i64) -> String {
    format!("{sweep}-{}", scheduled_s.div_euclid(60))
}
