//! With the `cuda` feature, compiles the paged-attention kernel (src/candle/paged.cu) to PTX
//! with nvcc (`$NVCC`, else `$CUDA_HOME/bin/nvcc`, else `nvcc` on the PATH). The PTX targets a
//! low virtual architecture, so the driver JIT-compiles it for any GPU from Ampere on (L4's
//! sm_89, H100/H200's sm_90). Without the feature it does nothing.

use std::path::PathBuf;
use std::process::Command;

/// The virtual architecture the PTX is written for.
const ARCH: &str = "compute_80";

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=src/candle/paged.cu");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    println!("cargo:rerun-if-env-changed=NVCC");
    println!("cargo:rerun-if-env-changed=CUDA_HOME");
    let nvcc = std::env::var_os("NVCC")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("CUDA_HOME").map(|h| PathBuf::from(h).join("bin/nvcc")))
        .unwrap_or_else(|| PathBuf::from("nvcc"));
    let out =
        PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR")).join("paged.ptx");
    let status = Command::new(&nvcc)
        .args(["--ptx", &format!("-arch={ARCH}"), "-O3", "-o"])
        .arg(&out)
        .arg("src/candle/paged.cu")
        .status()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run {} (the cuda feature needs nvcc): {e}",
                nvcc.display()
            )
        });
    assert!(
        status.success(),
        "{} failed on src/candle/paged.cu: {status}",
        nvcc.display()
    );
}
