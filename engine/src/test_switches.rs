//! Test-only switches read from the environment: they make an engine hang, fail or lie about
//! its backend, so the tests can show that the watchdog and backend truth catch it. They are
//! compiled in only with the cargo feature `test-switches` (the tests enable it; a release
//! build of `brink-agent` does not have it). Without it a set variable is ignored, and the
//! process says so on stderr, so no environment can make a production engine lie.

use std::sync::Mutex;

/// Fault injection in the engine and the model-level test's worker (see `monitor::Fault`).
pub const INJECT_FAULT: &str = "BRINK_INJECT_FAULT";
/// The engine child claims this backend whatever it runs on.
pub const CLAIM_BACKEND: &str = "BRINK_TEST_CLAIM_BACKEND";
/// `1`: the engine child runs on the CPU and claims the backend it was asked for.
pub const SILENT_CPU: &str = "BRINK_TEST_SILENT_CPU";
/// A JSON file of scripted replies the server generates in place of sampled tokens
/// (`server::scripted`), so tests can drive a synthetic model's output format.
pub const SCRIPT_REPLY: &str = "BRINK_TEST_SCRIPT_REPLY";

/// Whether this build honours the switches.
pub const COMPILED: bool = cfg!(feature = "test-switches");

/// The value of switch `name` (set and not blank), when this build honours switches; else
/// `None`, with one line on stderr per ignored switch and process.
pub fn get(name: &str) -> Option<String> {
    static WARNED: Mutex<Vec<String>> = Mutex::new(Vec::new());
    gate(name, std::env::var(name).ok(), COMPILED, &mut |line| {
        let mut warned = WARNED.lock().unwrap_or_else(|p| p.into_inner());
        if !warned.iter().any(|w| w == name) {
            warned.push(name.to_string());
            eprintln!("{line}");
        }
    })
}

/// The decision of [`get`], pure: `value` when `compiled`, else `None` and `warn` told why.
pub fn gate(name: &str, value: Option<String>, compiled: bool, warn: &mut dyn FnMut(String)) -> Option<String> {
    let value = value.filter(|v| !v.trim().is_empty())?;
    if compiled {
        return Some(value);
    }
    warn(format!("brink: {name} is set but ignored: this build has no test switches (cargo feature `test-switches`)"));
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_build_without_the_feature_ignores_a_set_switch_and_says_so() {
        let mut said = Vec::new();
        assert_eq!(gate(CLAIM_BACKEND, Some("cuda".into()), false, &mut |l| said.push(l)), None);
        assert_eq!(said.len(), 1);
        assert!(said[0].contains("BRINK_TEST_CLAIM_BACKEND is set but ignored") && said[0].contains("test-switches"), "{said:?}");
    }

    #[test]
    fn a_test_build_honours_a_set_switch_and_nobody_warns_about_an_unset_one() {
        let mut said = Vec::new();
        assert_eq!(gate(SILENT_CPU, Some("1".into()), true, &mut |l| said.push(l)), Some("1".into()));
        assert_eq!(gate(SILENT_CPU, None, false, &mut |l| said.push(l)), None);
        assert_eq!(gate(SILENT_CPU, Some("  ".into()), false, &mut |l| said.push(l)), None);
        assert!(said.is_empty(), "{said:?}");
    }
}
