//! The NVIDIA kernel driver's version from `/proc/driver/nvidia/version`, for when NVML cannot
//! be loaded (a container without libnvidia-ml, a minimal image).

/// The version on the `NVRM version:` line, e.g. `580.95.05`.
pub fn parse_proc_version(text: &str) -> Option<String> {
    let line = text.lines().find_map(|l| l.strip_prefix("NVRM version:"))?;
    line.split_whitespace().find(|w| is_version(w)).map(str::to_string)
}

/// `digits.digits[.digits]`: what driver versions look like (and module names do not).
fn is_version(w: &str) -> bool {
    let parts: Vec<&str> = w.split('.').collect();
    (2..=3).contains(&parts.len()) && parts.iter().all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_from_real_first_lines() {
        let cases = [
            (
                "NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  580.95.05  Release Build  (dvs-builder@U16-I3-B03-4-3)  Thu Sep 25 2025\nGCC version:  gcc version 13.3.0\n",
                Some("580.95.05"),
            ),
            ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\n", Some("535.104.05")),
            ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  470.42  Tue Jun 15 2021\n", Some("470.42")),
            ("GCC version:  gcc version 13.3.0\n", None),
            ("NVRM version: garbled\n", None),
            ("", None),
        ];
        for (text, want) in cases {
            assert_eq!(parse_proc_version(text).as_deref(), want, "{text:?}");
        }
    }
}
