//! Shared by the chat-template tests that cross-check brink's renderer with Python's Jinja2.

use std::process::Command;

/// Whether `python3` can import jinja2; without it the cross-check is skipped with a note,
/// unless `BRINK_REQUIRE_PY=1` (CI), which makes its absence a failure.
pub fn have_jinja2() -> bool {
    let ok = Command::new("python3").args(["-c", "import jinja2"]).output().is_ok_and(|o| o.status.success());
    if !ok {
        let msg = "python3 with the `jinja2` package (pip install 'jinja2==3.1.6') is not available";
        assert!(std::env::var("BRINK_REQUIRE_PY").as_deref() != Ok("1"), "BRINK_REQUIRE_PY=1 but {msg}");
        eprintln!("skipping the Jinja2 cross-check: {msg}");
    }
    ok
}
