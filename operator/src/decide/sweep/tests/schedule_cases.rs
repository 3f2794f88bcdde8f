//! CronJob semantics: due times, missed schedules collapsing into one run, the starting
//! deadline, suspend and the three concurrency policies.

use brink_api::crd::ConcurrencyPolicy::{self, *};

use super::at;
use crate::decide::sweep::schedule::{MAX_COUNTED_MISSES, Schedule, ScheduleDecision, ScheduleInput, Skip, decide, run_name};

#[test]
fn five_field_schedules_and_macros_parse_seconds_do_not() {
    for good in ["0 2 * * *", "*/15 * * * *", "0 3 * * MON-FRI", "@daily", "@hourly", "@weekly", "0 0 1 * *", "30 1 * * 0"] {
        assert!(Schedule::parse(good).is_ok(), "{good}");
    }
    for bad in ["", "0 2 * *", "0 0 2 * * *", "61 * * * *", "* 25 * * *", "bogus", "0 2 * * * 2027"] {
        let e = Schedule::parse(bad).unwrap_err();
        assert!(e.starts_with("spec.schedule"), "{bad}: {e}");
    }
}

#[test]
fn next_times_follow_the_pattern_in_utc() {
    let s = Schedule::parse("0 2 * * *").unwrap();
    assert_eq!(s.next_after(at("2026-12-01T01:59:59Z")), Some(at("2026-12-01T02:00:00Z")));
    assert_eq!(s.next_after(at("2026-12-01T02:00:00Z")), Some(at("2026-12-02T02:00:00Z")), "strictly after");
    let weekdays = Schedule::parse("30 1 * * MON-FRI").unwrap();
    // 2026-12-05 is a Saturday.
    assert_eq!(weekdays.next_after(at("2026-12-04T02:00:00Z")), Some(at("2026-12-07T01:30:00Z")));
    let never = Schedule::parse("0 0 30 2 *").unwrap();
    assert_eq!(never.next_after(at("2026-01-01T00:00:00Z")), None);
}

fn input<'a>(s: &'a Schedule, policy: ConcurrencyPolicy, last: Option<&str>, active: &'a [String], now: &str) -> ScheduleInput<'a> {
    ScheduleInput {
        schedule: s,
        policy,
        starting_deadline_s: None,
        suspend: false,
        created_s: at("2026-11-01T00:00:00Z"),
        last_schedule_s: last.map(at),
        active,
        now_s: at(now),
    }
}

#[test]
fn due_or_not_with_each_policy() {
    let s = Schedule::parse("0 2 * * *").unwrap();
    let active = vec!["nightly-1".to_string()];
    let none: Vec<String> = vec![];
    let last = Some("2026-11-30T02:00:00Z");
    struct Case {
        name: &'static str,
        policy: ConcurrencyPolicy,
        active: bool,
        now: &'static str,
        start: Option<&'static str>,
        cancel: bool,
        skipped: Option<Skip>,
        /// The next firing after `now`, worked out by hand for "0 2 * * *".
        next: &'static str,
    }
    let cases = [
        Case {
            name: "not yet due",
            policy: Forbid,
            active: false,
            now: "2026-12-01T01:59:59Z",
            start: None,
            cancel: false,
            skipped: None,
            next: "2026-12-01T02:00:00Z",
        },
        Case {
            name: "due exactly now",
            policy: Forbid,
            active: false,
            now: "2026-12-01T02:00:00Z",
            start: Some("2026-12-01T02:00:00Z"),
            cancel: false,
            skipped: None,
            next: "2026-12-02T02:00:00Z",
        },
        Case {
            name: "due, started late",
            policy: Forbid,
            active: false,
            now: "2026-12-01T05:00:00Z",
            start: Some("2026-12-01T02:00:00Z"),
            cancel: false,
            skipped: None,
            next: "2026-12-02T02:00:00Z",
        },
        Case {
            name: "forbid with an active run",
            policy: Forbid,
            active: true,
            now: "2026-12-01T02:00:10Z",
            start: None,
            cancel: false,
            skipped: Some(Skip::Forbidden { active: vec!["nightly-1".into()] }),
            next: "2026-12-02T02:00:00Z",
        },
        Case {
            name: "allow beside the active run",
            policy: Allow,
            active: true,
            now: "2026-12-01T02:00:10Z",
            start: Some("2026-12-01T02:00:00Z"),
            cancel: false,
            skipped: None,
            next: "2026-12-02T02:00:00Z",
        },
        Case {
            name: "replace the active run",
            policy: Replace,
            active: true,
            now: "2026-12-01T02:00:10Z",
            start: Some("2026-12-01T02:00:00Z"),
            cancel: true,
            skipped: None,
            next: "2026-12-02T02:00:00Z",
        },
        Case {
            name: "replace with nothing active",
            policy: Replace,
            active: false,
            now: "2026-12-01T02:00:10Z",
            start: Some("2026-12-01T02:00:00Z"),
            cancel: false,
            skipped: None,
            next: "2026-12-02T02:00:00Z",
        },
    ];
    for c in cases {
        let act = if c.active { &active[..] } else { &none[..] };
        let d = decide(&input(&s, c.policy, last, act, c.now));
        assert_eq!(d.start, c.start.map(at), "{}", c.name);
        assert_eq!(d.cancel.is_empty(), !c.cancel, "{}", c.name);
        assert_eq!(d.skipped, c.skipped, "{}", c.name);
        assert_eq!(d.next_s, Some(at(c.next)), "{}", c.name);
    }
}

#[test]
fn missed_schedules_collapse_into_the_latest_one() {
    let s = Schedule::parse("0 2 * * *").unwrap();
    // The operator was down for three nights: one run, for the latest night, three missed.
    let d = decide(&input(&s, Forbid, Some("2026-11-27T02:00:00Z"), &[], "2026-12-01T03:00:00Z"));
    assert_eq!(d.start, Some(at("2026-12-01T02:00:00Z")));
    assert_eq!(d.missed, 3);
    // A new sweep fires for nothing before its creation.
    let mut fresh = input(&s, Forbid, None, &[], "2026-11-01T01:00:00Z");
    fresh.created_s = at("2026-11-01T00:30:00Z");
    assert_eq!(decide(&fresh), ScheduleDecision { next_s: Some(at("2026-11-01T02:00:00Z")), ..ScheduleDecision::default() });
}

#[test]
fn a_minutely_schedule_after_a_long_outage_finds_the_latest_time_quickly() {
    let s = Schedule::parse("* * * * *").unwrap();
    let d = decide(&input(&s, Allow, Some("2026-01-01T00:00:00Z"), &[], "2026-12-01T03:07:30Z"));
    assert_eq!(d.start, Some(at("2026-12-01T03:07:00Z")));
    assert_eq!(d.missed, MAX_COUNTED_MISSES - 1, "counted up to the cap");
    let hourly = Schedule::parse("17 * * * *").unwrap();
    let d = decide(&input(&hourly, Allow, Some("2025-01-01T00:17:00Z"), &[], "2026-12-01T03:07:30Z"));
    assert_eq!(d.start, Some(at("2026-12-01T02:17:00Z")));
}

#[test]
fn the_starting_deadline_skips_what_is_too_late() {
    let s = Schedule::parse("0 2 * * *").unwrap();
    let mut i = input(&s, Forbid, Some("2026-11-30T02:00:00Z"), &[], "2026-12-01T02:10:00Z");
    for (deadline, start) in [(3600, true), (600, true), (599, false), (60, false)] {
        i.starting_deadline_s = Some(deadline);
        let d = decide(&i);
        assert_eq!(d.start.is_some(), start, "deadline {deadline}");
        if !start {
            // Outside the deadline the 02:00 time is not even considered due: nothing to skip.
            assert_eq!(d.skipped, None, "deadline {deadline}");
        }
    }
    // Forbid keeps a due firing waiting while within the deadline; it starts once the run ends.
    let active = vec!["nightly-0".to_string()];
    i.starting_deadline_s = Some(3600);
    i.active = &active;
    assert!(matches!(decide(&i).skipped, Some(Skip::Forbidden { .. })));
    i.active = &[];
    assert_eq!(decide(&i).start, Some(at("2026-12-01T02:00:00Z")));
}

#[test]
fn suspend_skips_without_starting_and_resume_fires_the_latest_time() {
    let s = Schedule::parse("0 2 * * *").unwrap();
    let mut i = input(&s, Forbid, Some("2026-11-28T02:00:00Z"), &[], "2026-12-01T02:30:00Z");
    i.suspend = true;
    let d = decide(&i);
    assert_eq!((d.start, d.skipped), (None, Some(Skip::Suspended)));
    i.suspend = false;
    let d = decide(&i);
    assert_eq!((d.start, d.missed), (Some(at("2026-12-01T02:00:00Z")), 2));
}

#[test]
fn run_names_are_stable_per_schedule_time() {
    assert_eq!(run_name("nightly", at("2026-12-01T02:00:00Z")), format!("nightly-{}", at("2026-12-01T02:00:00Z") / 60));
    assert_eq!(run_name("nightly", at("2026-12-01T02:00:59Z")), run_name("nightly", at("2026-12-01T02:00:00Z")));
}
