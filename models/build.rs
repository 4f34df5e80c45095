//! With the `cuda` feature, compiles the CUDA kernels (src/candle/*.cu: paged attention, the KV
//! write, the fused norm and SwiGLU) to PTX with nvcc (`$NVCC`, else `$CUDA_HOME/bin/nvcc`,
//! else `nvcc` on the PATH). The PTX targets a low virtual architecture, so the driver JIT-compiles it for any GPU from
//! Ampere on (L4's sm_89, H100/H200's sm_90). Without the feature it does nothing.

use std::path::PathBuf;
use std::process::Command;

/// The virtual architecture the PTX is written for.
const ARCH: &str = "compute_80";

/// The kernels, by file stem under src/candle: each becomes `$OUT_DIR/<stem>.ptx`.
const KERNELS: [&str; 3] = ["paged", "kv", "fused"];

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    for k in KERNELS {
        println!("cargo:rerun-if-changed=src/candle/{k}.cu");
    }
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    println!("cargo:rerun-if-env-changed=NVCC");
    println!("cargo:rerun-if-env-changed=CUDA_HOME");
    let nvcc = std::env::var_os("NVCC")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("CUDA_HOME").map(|h| PathBuf::from(h).join("bin/nvcc")))
        .unwrap_or_else(|| PathBuf::from("nvcc"));
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    for k in KERNELS {
        let src = format!("src/candle/{k}.cu");
        let status = Command::new(&nvcc)
            .args(["--ptx", &format!("-arch={ARCH}"), "-O3", "-o"])
            .arg(out_dir.join(format!("{k}.ptx")))
            .arg(&src)
            .status()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot run {} (the cuda feature needs nvcc): {e}",
                    nvcc.display()
                )
            });
        assert!(
            status.success(),
            "{} failed on {src}: {status}",
            nvcc.display()
        );
    }
}
