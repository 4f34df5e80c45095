//! The CUDA kernels (`paged.cu`, `kv.cu`, `fused.cu`) run on this machine, without a GPU, for
//! the tests: a faithful fake of the device. Each kernel file is compiled by the host's C++
//! compiler (`$CXX`, else `g++`) against `emulator/cuda_emulation.h`, an emulation of CUDA's
//! execution model (a block's threads as OS threads, `__syncthreads` a barrier over them, warp
//! shuffles an exchange through memory), with the address and undefined-behaviour sanitizers;
//! `emulator/launch.cpp` runs one launch per process. The tests beside each op launch its
//! kernel with the grid and scalar arguments its CUDA launch takes from the op, and compare the
//! result with the op's CPU implementation, which the other tests check against candle's own
//! ops and llama.cpp. A kernel that indexes out of its buffers or its shared memory, or that
//! computes something else than the CPU path, fails here before it reaches a GPU.
//!
//! What this cannot show: the kernels' speed, nvcc's own code generation (it contracts
//! multiply-adds, g++ here does not: agreement is within rounding), and races that the host's
//! scheduling happens to hide.

use std::hash::{Hash, Hasher};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use half::f16;

use super::operands::Grid;

/// The kernel files, as the build compiles them to PTX.
const KERNELS: [(&str, &str); 3] = [
    ("paged", include_str!("paged.cu")),
    ("kv", include_str!("kv.cu")),
    ("fused", include_str!("fused.cu")),
];

/// The emulation's headers (under the names the kernels include) and the launcher.
const SUPPORT: [(&str, &str); 4] = [
    (
        "cuda_emulation.h",
        include_str!("emulator/cuda_emulation.h"),
    ),
    ("cuda_fp16.h", include_str!("emulator/cuda_fp16.h")),
    ("cuda_runtime.h", include_str!("emulator/cuda_runtime.h")),
    ("launch.cpp", include_str!("emulator/launch.cpp")),
];

const FLAGS: [&str; 8] = [
    "-std=c++20",
    "-O1",
    "-g",
    "-pthread",
    "-fsanitize=address,undefined",
    "-fno-sanitize-recover=all",
    "-Wall",
    "-Wno-unknown-pragmas",
];

/// One argument of a launch, in the kernel signature's order.
pub(crate) enum Arg {
    /// A device buffer's bytes; what the kernel leaves in it comes back.
    Buf(Vec<u8>),
    I32(i32),
    F32(f32),
}

impl Arg {
    pub(crate) fn f32s(v: &[f32]) -> Self {
        Arg::Buf(v.iter().flat_map(|x| x.to_le_bytes()).collect())
    }

    pub(crate) fn f16s(v: &[f16]) -> Self {
        Arg::Buf(v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect())
    }

    pub(crate) fn u32s(v: &[u32]) -> Self {
        Arg::Buf(v.iter().flat_map(|x| x.to_le_bytes()).collect())
    }

    pub(crate) fn ints(v: &[i32]) -> impl Iterator<Item = Self> + '_ {
        v.iter().map(|&i| Arg::I32(i))
    }
}

/// A buffer that came back, read as f32s.
pub(crate) fn as_f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// A buffer that came back, read as f16s.
pub(crate) fn as_f16s(bytes: &[u8]) -> Vec<f16> {
    bytes
        .chunks_exact(2)
        .map(|b| f16::from_bits(u16::from_le_bytes([b[0], b[1]])))
        .collect()
}

/// Runs `kernel` over `grid` under the emulation; the buffer arguments after the launch, in
/// order. `Err` with the launcher's report (a sanitizer's, or an argument that does not match
/// the kernel's signature) when the launch fails.
pub(crate) fn launch(kernel: &str, grid: Grid, args: Vec<Arg>) -> Result<Vec<Vec<u8>>, String> {
    let mut request = Vec::new();
    let header = [
        grid.blocks.0,
        grid.blocks.1,
        grid.blocks.2,
        grid.threads,
        1,
        1,
        grid.shared_bytes,
        args.len() as u32,
    ];
    header
        .iter()
        .for_each(|w| request.extend_from_slice(&w.to_le_bytes()));
    for a in &args {
        match a {
            Arg::Buf(b) => {
                request.extend_from_slice(&0u32.to_le_bytes());
                request.extend_from_slice(&(b.len() as u64).to_le_bytes());
                request.extend_from_slice(b);
            }
            Arg::I32(i) => {
                request.extend_from_slice(&1u32.to_le_bytes());
                request.extend_from_slice(&i.to_le_bytes());
            }
            Arg::F32(f) => {
                request.extend_from_slice(&2u32.to_le_bytes());
                request.extend_from_slice(&f.to_le_bytes());
            }
        }
    }
    let mut child = Command::new(launcher())
        .arg(kernel)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run the launcher: {e}"))?;
    // The launcher reads the whole request before it writes anything.
    let mut stdin = child.stdin.take().expect("piped");
    stdin
        .write_all(&request)
        .map_err(|e| format!("cannot send the request: {e}"))?;
    drop(stdin);
    let out = child
        .wait_with_output()
        .map_err(|e| format!("the launcher did not finish: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{kernel}: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let mut reply = out.stdout.as_slice();
    let mut buffers = Vec::new();
    while reply.len() >= 8 {
        let (len, rest) = reply.split_at(8);
        let len = u64::from_le_bytes(len.try_into().expect("8 bytes")) as usize;
        buffers.push(rest[..len].to_vec());
        reply = &rest[len..];
    }
    Ok(buffers)
}

/// The launcher: built once for these sources and this compiler, under the build's target
/// folder (beside the test binary), and reused by later test runs until a source changes.
fn launcher() -> &'static Path {
    static LAUNCHER: OnceLock<PathBuf> = OnceLock::new();
    LAUNCHER.get_or_init(|| {
        let cxx = std::env::var_os("CXX").unwrap_or_else(|| "g++".into());
        let mut key = std::collections::hash_map::DefaultHasher::new();
        (KERNELS, SUPPORT, FLAGS, &cxx).hash(&mut key);
        // target/<profile>/deps/<test binary>: the folder is target/<profile>.
        let root = std::env::current_exe()
            .ok()
            .and_then(|exe| Some(exe.parent()?.parent()?.to_path_buf()))
            .unwrap_or_else(std::env::temp_dir);
        let dir = root.join(format!("cuda-emulation-{:016x}", key.finish()));
        let exe = dir.join("launch");
        if exe.is_file() {
            return exe;
        }
        // Built aside and moved into place whole, so a run killed halfway leaves nothing that
        // a later run would take for a launcher.
        let aside = root.join(format!("cuda-emulation-build-{}", std::process::id()));
        let built = build(&aside, &cxx).unwrap_or_else(|e| panic!("the CUDA emulation: {e}"));
        match std::fs::rename(&aside, &dir) {
            Ok(()) => exe,
            // Another run moved its build there first: the same sources, the same launcher.
            Err(_) if exe.is_file() => {
                let _ = std::fs::remove_dir_all(&aside);
                exe
            }
            Err(_) => built,
        }
    })
}

/// Writes the sources to `dir` and compiles them with `cxx`: each kernel file with the
/// emulation's header in front, then the launcher, linked into one program.
fn build(dir: &Path, cxx: &std::ffi::OsStr) -> Result<PathBuf, String> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let write = |name: &str, text: &str| {
        std::fs::write(dir.join(name), text).map_err(|e| format!("{name}: {e}"))
    };
    for (name, text) in SUPPORT {
        write(name, text)?;
    }
    let compile = |src: &str, obj: &str, prelude: bool| {
        let mut c = Command::new(cxx);
        c.args(FLAGS).arg("-I").arg(dir);
        if prelude {
            c.args(["-include", "cuda_emulation.h"]);
        }
        c.arg("-c").arg(dir.join(src)).arg("-o").arg(dir.join(obj));
        run(c)
    };
    let mut objects = vec!["launch.o".to_string()];
    for (stem, text) in KERNELS {
        write(&format!("{stem}.cc"), &host_source(text))?;
        compile(&format!("{stem}.cc"), &format!("{stem}.o"), true)?;
        objects.push(format!("{stem}.o"));
    }
    compile("launch.cpp", "launch.o", false)?;
    let exe = dir.join("launch");
    let mut link = Command::new(cxx);
    link.args(["-pthread", "-fsanitize=address,undefined"])
        .args(objects.iter().map(|o| dir.join(o)))
        .arg("-o")
        .arg(&exe);
    run(link)?;
    Ok(exe)
}

fn run(mut c: Command) -> Result<(), String> {
    let out = c
        .output()
        .map_err(|e| format!("cannot run {:?} (a C++20 compiler is needed): {e}", c))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{:?}: {}\n{}",
            c,
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// A kernel file as host C++: its dynamic shared memory (`extern __shared__ T name[];`)
/// becomes a pointer to the running block's buffer, which the launch sizes.
fn host_source(cu: &str) -> String {
    cu.lines()
        .map(|line| {
            let decl = line
                .trim()
                .strip_prefix("extern __shared__ ")
                .and_then(|d| d.strip_suffix("[];"))
                .and_then(|d| d.split_once(' '));
            match decl {
                Some((ty, name)) => {
                    format!("{ty} *{name} = static_cast<{ty} *>(emu::dynamic_shared());")
                }
                None => line.to_string(),
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn dynamic_shared_memory_becomes_the_launchs_buffer() {
    let src = "a\n  extern __shared__ float smem[];\nb";
    assert_eq!(
        host_source(src),
        "a\nfloat *smem = static_cast<float *>(emu::dynamic_shared());\nb"
    );
}

#[test]
fn the_launcher_refuses_arguments_that_do_not_match_the_kernel() {
    let grid = Grid::per_item(4);
    let err = launch("swiglu_f32", grid, vec![Arg::I32(1)]).expect_err("an i32 for a pointer");
    assert!(err.contains("argument 0 is of the wrong kind"), "{err}");
    let short = vec![Arg::f32s(&[0.0; 4]), Arg::f32s(&[0.0; 8]), Arg::I32(1)];
    let err = launch("swiglu_f32", grid, short).expect_err("an argument missing");
    assert!(err.contains("too few arguments"), "{err}");
    let err = launch("no_such_kernel", grid, Vec::new()).expect_err("no such kernel");
    assert!(err.contains("unknown kernel"), "{err}");
}
