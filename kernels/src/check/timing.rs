//! Where a case's GPU half spends its time, marked by the family as it goes (inputs made and
//! uploaded, the kernel, outputs downloaded): the worker starts the marks before the GPU half
//! and takes them after, so the report splits the GPU half of the families that mark it.
//! Thread-local: the GPU half runs on the worker's main thread, the marks cost an `Instant`.

use std::cell::RefCell;
use std::time::Instant;

thread_local! {
    static MARKS: RefCell<Option<(Instant, Vec<(String, f64)>)>> = const { RefCell::new(None) };
}

/// Starts marking this thread's GPU half (dropping marks left from an earlier one).
pub fn begin() {
    MARKS.with(|m| *m.borrow_mut() = Some((Instant::now(), Vec::new())));
}

/// Whether this thread is marking (between [`begin`] and [`take`]).
pub fn active() -> bool {
    MARKS.with(|m| m.borrow().is_some())
}

/// The time since [`begin`] or the last mark went to `what` (a no-op when nothing began, as in
/// tests and benches). Marks of the same name add up.
pub fn mark(what: &str) {
    MARKS.with(|m| {
        if let Some((last, parts)) = m.borrow_mut().as_mut() {
            let now = Instant::now();
            let ms = (now - *last).as_secs_f64() * 1e3;
            *last = now;
            match parts.iter_mut().find(|(w, _)| w == what) {
                Some((_, t)) => *t += ms,
                None => parts.push((what.to_string(), ms)),
            }
        }
    });
}

/// The marks since [`begin`], in the order first marked, the time after the last mark as
/// `rest` (none when nothing was marked); marking stops until the next [`begin`].
pub fn take() -> Vec<(String, f64)> {
    MARKS.with(|m| {
        let Some((last, mut parts)) = m.borrow_mut().take() else { return Vec::new() };
        if !parts.is_empty() {
            parts.push(("rest".into(), last.elapsed().as_secs_f64() * 1e3));
        }
        parts
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_add_up_in_order_and_stop_at_take() {
        assert!(take().is_empty());
        mark("nothing began");
        assert!(!active());
        begin();
        assert!(active());
        mark("inputs");
        mark("kernel");
        mark("inputs");
        let parts = take();
        let names: Vec<&str> = parts.iter().map(|(w, _)| w.as_str()).collect();
        assert_eq!(names, ["inputs", "kernel", "rest"]);
        mark("after");
        assert!(take().is_empty());
        begin();
        assert!(take().is_empty(), "a GPU half that marks nothing has no parts");
    }
}
