mod progress_cases;
mod record_cases;
mod schedule_cases;

/// Unix seconds of a UTC date and time.
pub fn at(s: &str) -> i64 {
    s.parse::<jiff::Timestamp>().unwrap_or_else(|e| panic!("{s}: {e}")).as_second()
}
