//! `sluice serve --check-config`: the real binary validates flags and environment variables,
//! prints the configuration as JSON and exits without binding or loading anything.

use std::process::{Command, Output};

fn check(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sluice"));
    cmd.arg("serve").arg("--check-config").args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("running sluice")
}

#[test]
fn valid_flags_print_the_configuration_and_exit_0() {
    // Port 1 is privileged and the model is absent: neither matters, nothing is bound or read.
    let out = check(
        &[
            "--host",
            "0.0.0.0",
            "--port",
            "1",
            "--model",
            "no-such-model",
        ],
        &[("SLUICE_DRAIN_TIMEOUT", "2m")],
    );
    assert!(out.status.success(), "{out:?}");
    let s: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(s["port"], 1);
    assert_eq!(s["model"], "no-such-model");
    assert_eq!(s["drain_timeout_s"], 120.0);
    assert_eq!(s["paths"]["ready"], "/ready");
}

#[test]
fn invalid_values_exit_1_naming_the_flag() {
    let out = check(&["--discover", "k8s://Bad_Namespace/svc:http"], &[]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("k8s://"));
    let out = check(&[], &[("SLUICE_MAX_NUM_SEQS", "0")]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--max-num-seqs"));
}

#[test]
fn unknown_flags_are_refused() {
    let out = check(&["--no-such-flag"], &[]);
    assert!(!out.status.success());
    assert!(out.stdout.is_empty());
}
