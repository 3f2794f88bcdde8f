//! `brink-agent device` as a user runs it. With every GPU hidden (`CUDA_VISIBLE_DEVICES=`,
//! which also holds on a machine with a GPU) it must say `gpu: false` with the reason and exit 0;
//! without hiding, whatever it finds must be a complete report.

use std::process::Command;

fn agent() -> Command {
    Command::new(env!("CARGO_BIN_EXE_brink-agent"))
}

fn json(cmd: &mut Command) -> serde_json::Value {
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "exit {:?}\n{stdout}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("not JSON ({e}):\n{stdout}"))
}

#[test]
fn no_gpu_is_reported_with_its_reason_and_exit_0() {
    let v = json(agent().args(["device", "--json"]).env("CUDA_VISIBLE_DEVICES", ""));
    assert_eq!(v["gpu"], false, "{v}");
    assert!(v["device"].is_null(), "{v}");
    let reason = v["noGpuReason"].as_str().unwrap_or_default();
    // No libcuda (CI), or a driver that sees no device once all are hidden.
    assert!(reason.contains("no CUDA driver (libcuda.so)") || reason.contains("CUDA_ERROR_NO_DEVICE"), "unexpected reason: {reason}");
    assert!(reason.contains("CPU backend"), "{reason}");

    let out = agent().arg("device").env("CUDA_VISIBLE_DEVICES", "").output().unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(table.starts_with("gpu     none\nreason  "), "{table}");
}

#[test]
fn whatever_is_found_is_a_complete_report() {
    let v = json(agent().args(["device", "--json"]));
    if v["gpu"] == true {
        let d = &v["device"];
        for key in ["name", "uuid", "computeCapability", "cudaVersion"] {
            assert!(d[key].as_str().is_some_and(|s| !s.is_empty()), "{key}: {v}");
        }
        assert!(d["uuid"].as_str().unwrap().starts_with("GPU-"), "{v}");
        assert!(d["smCount"].as_u64().unwrap() > 0 && d["totalMemBytes"].as_u64().unwrap() > 0, "{v}");
        assert_eq!(d["integrated"].as_bool().unwrap(), d["unifiedMemory"].is_object(), "unified memory iff integrated: {v}");
    } else {
        assert!(v["noGpuReason"].as_str().is_some_and(|s| !s.is_empty()), "{v}");
    }
}

#[test]
fn a_bad_ordinal_is_a_clear_error() {
    let out = agent().args(["device", "--ordinal", "first"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--ordinal") && err.contains("first"), "{err}");
}
