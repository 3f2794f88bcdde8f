//! A value read from a slow source at most once per interval, however often it is asked for:
//! every `/metrics` scrape and every OTLP instrument's callback reads the node gauges, and NVML
//! calls take milliseconds each. Pure: the caller passes the clock.

use std::sync::Mutex;
use std::time::{Duration, Instant};

pub struct Throttled<T> {
    min_interval: Duration,
    last: Mutex<Option<(Instant, T)>>,
}

impl<T: Clone> Throttled<T> {
    pub fn new(min_interval: Duration) -> Throttled<T> {
        Throttled { min_interval, last: Mutex::new(None) }
    }

    /// The value read at most `min_interval` before `now`, else a fresh `read()`. Callers at the
    /// same moment wait for one read rather than each reading.
    pub fn get(&self, now: Instant, read: impl FnOnce() -> T) -> T {
        // A poisoned lock only means a reader panicked: the cached value is still a value.
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((at, v)) = last.as_ref()
            && now.saturating_duration_since(*at) < self.min_interval
        {
            return v.clone();
        }
        let v = read();
        *last = Some((now, v.clone()));
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn reads_at_most_once_per_interval() {
        let t = Throttled::new(Duration::from_secs(1));
        let reads = Cell::new(0);
        let read = || {
            reads.set(reads.get() + 1);
            reads.get()
        };
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        assert_eq!(t.get(t0, read), 1);
        assert_eq!(t.get(ms(10), read), 1);
        assert_eq!(t.get(ms(999), read), 1);
        assert_eq!(t.get(ms(1000), read), 2, "an interval after the read, a new one");
        assert_eq!(t.get(ms(1500), read), 2);
        assert_eq!(t.get(ms(2000), read), 3);
        assert_eq!(reads.get(), 3);
    }

    #[test]
    fn a_clock_read_before_the_cached_sample_reuses_it() {
        // Two scrapes racing: the later `now` may be taken before the earlier one stored its read.
        let t = Throttled::new(Duration::from_secs(1));
        let t0 = Instant::now();
        assert_eq!(t.get(t0 + Duration::from_millis(5), || "first"), "first");
        assert_eq!(t.get(t0, || "second"), "first");
    }
}
