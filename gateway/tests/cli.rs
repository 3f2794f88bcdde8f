//! The binary's flag mistakes: exit 2 and a message naming the flag.

use std::process::Command;

fn run(args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_brink-gateway")).args(args).output().unwrap();
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn a_bad_upstream_url_exits_2_naming_the_flag() {
    for bad in ["localhost:8080", "https://a:1", "http://a:1/v1"] {
        let (code, err) = run(&["--listen", "127.0.0.1:0", "--upstream", bad]);
        assert_eq!(code, Some(2), "{bad}: {err}");
        assert!(err.contains("--upstream"), "{bad}: {err}");
    }
}

#[test]
fn an_unreadable_key_file_exits_2_naming_the_flag() {
    for flag in ["--api-key-file", "--upstream-api-key-file"] {
        let (code, err) = run(&["--listen", "127.0.0.1:0", "--upstream", "http://127.0.0.1:9", flag, "/nonexistent/brink/keys"]);
        assert_eq!(code, Some(2), "{err}");
        assert!(err.contains(&format!("{flag} /nonexistent/brink/keys: cannot read it")), "{err}");
    }
}

#[test]
fn no_upstream_exits_2() {
    let (code, err) = run(&["--listen", "127.0.0.1:0"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--upstream"), "{err}");
}
