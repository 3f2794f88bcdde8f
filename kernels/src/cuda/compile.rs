//! NVRTC compilation to a CUBIN for one exact arch, with an on-disk cache.
//!
//! A CUBIN (real SASS), not PTX: PTX from an NVRTC newer than the driver is rejected at load,
//! and compiling to SASS also catches register and shared-memory overflows at build time.
//! The cache key is (source hash, arch, NVRTC version): a node restart reuses its CUBINs.

use std::ffi::CString;
use std::path::{Path, PathBuf};

use cudarc::nvrtc::{result as nvrtc, sys as nvrtc_sys};

use crate::sources::KernelSource;

#[derive(thiserror::Error, Debug)]
pub enum CompileError {
    #[error(
        "NVRTC (libnvrtc.so) was not found: install the CUDA toolkit's NVRTC or `pip install nvidia-cuda-nvrtc` and add its lib folder to LD_LIBRARY_PATH"
    )]
    NvrtcMissing,
    #[error("NVRTC call failed: {0}")]
    Nvrtc(String),
    #[error("{file} does not compile for {arch}:\n{log}")]
    Source { file: String, arch: String, log: String },
    #[error("kernel cache {path}: {source}")]
    Cache { path: PathBuf, source: std::io::Error },
}

/// A compiled module: the CUBIN and what NVRTC said about it (ptxas's resource report).
#[derive(Clone, Debug)]
pub struct Cubin {
    pub file: &'static str,
    pub arch: String,
    pub bytes: Vec<u8>,
    pub log: String,
    pub from_cache: bool,
}

pub fn nvrtc_present() -> bool {
    // SAFETY: only probes whether the shared library can be opened.
    unsafe { nvrtc_sys::is_culib_present() }
}

pub fn nvrtc_version() -> Result<(i32, i32), CompileError> {
    if !nvrtc_present() {
        return Err(CompileError::NvrtcMissing);
    }
    let (mut major, mut minor) = (0, 0);
    // SAFETY: two valid out-pointers.
    unsafe { nvrtc_sys::nvrtcVersion(&mut major, &mut minor) }.result().map_err(|e| CompileError::Nvrtc(format!("nvrtcVersion: {e:?}")))?;
    Ok((major, minor))
}

/// Where CUBINs are cached: `$BRINK_KERNEL_CACHE`, else `$XDG_CACHE_HOME/brink/kernels`, else
/// `~/.cache/brink/kernels`; `None` when none of these is set (compile every time).
pub fn default_cache_dir() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("BRINK_KERNEL_CACHE") {
        return Some(PathBuf::from(p));
    }
    if let Some(p) = std::env::var_os("XDG_CACHE_HOME") {
        return Some(PathBuf::from(p).join("brink/kernels"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/brink/kernels"))
}

/// Compiles `source` for `arch` (e.g. `sm_121`), through the cache when one is given.
/// [`compile`] for every source at once: NVRTC programs are independent, so a cold cache (a new
/// node, a changed kernel or header) is bound by the slowest file, not the sum (13-14 s in
/// series on the H100 runs of 2026-12-06). Results in `sources`' order.
pub fn compile_all(sources: &[KernelSource], arch: &str, cache_dir: Option<&Path>) -> Vec<Result<Cubin, CompileError>> {
    use rayon::prelude::*;
    sources.par_iter().map(|s| compile(s, arch, cache_dir)).collect()
}

pub fn compile(source: &KernelSource, arch: &str, cache_dir: Option<&Path>) -> Result<Cubin, CompileError> {
    let (major, minor) = nvrtc_version()?;
    let key = format!("{}-{}-nvrtc{}.{}-{}", source.file.trim_end_matches(".cu"), arch, major, minor, &source.sha256()[..16]);
    let cached = cache_dir.map(|d| d.join(format!("{key}.cubin")));
    if let Some(path) = &cached
        && let Ok(bytes) = std::fs::read(path)
        && !bytes.is_empty()
    {
        return Ok(Cubin { file: source.file, arch: arch.into(), bytes, log: String::new(), from_cache: true });
    }
    let cubin = compile_uncached(source, arch)?;
    if let Some(path) = &cached {
        store(path, &cubin.bytes)?;
    }
    Ok(cubin)
}

fn store(path: &Path, bytes: &[u8]) -> Result<(), CompileError> {
    let err = |source| CompileError::Cache { path: path.to_path_buf(), source };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(err)?;
    }
    // Write then rename: a node killed mid-write must not leave a truncated CUBIN behind.
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, bytes).map_err(err)?;
    std::fs::rename(&tmp, path).map_err(err)
}

fn compile_uncached(source: &KernelSource, arch: &str) -> Result<Cubin, CompileError> {
    let src = CString::new(source.full_source()).map_err(|e| CompileError::Nvrtc(e.to_string()))?;
    let name = CString::new(source.file).map_err(|e| CompileError::Nvrtc(e.to_string()))?;
    let prog = nvrtc::create_program(&src, Some(&name)).map_err(|e| CompileError::Nvrtc(format!("create_program: {e:?}")))?;
    let opts = [format!("--gpu-architecture={arch}"), "--std=c++17".to_string(), "--ptxas-options=-v".to_string(), "-lineinfo".to_string()];
    // SAFETY: `prog` is a live program until destroy_program below; `src`/`name` outlive it.
    let compiled = unsafe { nvrtc::compile_program(prog, &opts) };
    let log = unsafe { nvrtc::get_program_log(prog) }
        .map(|chars| {
            let bytes: Vec<u8> = chars.iter().map(|&c| c as u8).take_while(|&b| b != 0).collect();
            String::from_utf8_lossy(&bytes).into_owned()
        })
        .unwrap_or_default();
    let result = match compiled {
        Err(_) => Err(CompileError::Source { file: source.file.into(), arch: arch.into(), log: log.clone() }),
        Ok(()) => get_cubin(prog).map(|bytes| Cubin { file: source.file, arch: arch.into(), bytes, log, from_cache: false }),
    };
    // SAFETY: created above, destroyed once.
    unsafe { nvrtc::destroy_program(prog) }.map_err(|e| CompileError::Nvrtc(format!("destroy_program: {e:?}")))?;
    result
}

fn get_cubin(prog: nvrtc_sys::nvrtcProgram) -> Result<Vec<u8>, CompileError> {
    let mut size = 0usize;
    // SAFETY: `prog` compiled successfully; out-pointer valid.
    unsafe { nvrtc_sys::nvrtcGetCUBINSize(prog, &mut size) }
        .result()
        .map_err(|e| CompileError::Nvrtc(format!("nvrtcGetCUBINSize: {e:?}")))?;
    if size == 0 {
        return Err(CompileError::Nvrtc("NVRTC returned an empty CUBIN (was a virtual arch compute_XX given?)".into()));
    }
    let mut buf = vec![0u8; size];
    // SAFETY: `buf` has exactly the size NVRTC reported.
    unsafe { nvrtc_sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr().cast()) }
        .result()
        .map_err(|e| CompileError::Nvrtc(format!("nvrtcGetCUBIN: {e:?}")))?;
    Ok(buf)
}

/// Per-kernel resource usage parsed from ptxas's `-v` report in the NVRTC log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelResources {
    pub kernel: String,
    pub registers: u32,
    pub shared_bytes: u32,
    pub spill_stores: u32,
}

/// Parses lines such as `ptxas info    : Function properties for moe_gemm` / `Used 64 registers,
/// used 1 barriers, 8448 bytes smem` from the compile log.
pub fn parse_resources(log: &str) -> Vec<KernelResources> {
    let mut out: Vec<KernelResources> = Vec::new();
    let mut current: Option<String> = None;
    for line in log.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            current = rest.split('\'').next().map(str::to_string);
        } else if let Some(rest) = line.split("Function properties for ").nth(1) {
            current = Some(rest.trim().to_string());
        }
        let Some(kernel) = current.clone() else { continue };
        let entry = |out: &mut Vec<KernelResources>| -> usize {
            if let Some(i) = out.iter().position(|r| r.kernel == kernel) {
                i
            } else {
                out.push(KernelResources { kernel: kernel.clone(), registers: 0, shared_bytes: 0, spill_stores: 0 });
                out.len() - 1
            }
        };
        if line.contains("Used ") && line.contains("registers") {
            let i = entry(&mut out);
            out[i].registers = number_before(line, " registers").unwrap_or(0);
            out[i].shared_bytes = number_before(line, " bytes smem").unwrap_or(0);
        } else if line.contains("bytes spill stores") {
            let i = entry(&mut out);
            out[i].spill_stores = number_before(line, " bytes spill stores").unwrap_or(0);
        }
    }
    out.retain(|r| !r.kernel.starts_with('_'));
    out
}

fn number_before(line: &str, marker: &str) -> Option<u32> {
    let head = &line[..line.find(marker)?];
    head.rsplit(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every source compiled at once lands in the cache, so the loads that follow read CUBINs
    /// instead of compiling. Needs libnvrtc; without it there is nothing to compile.
    #[test]
    fn compile_all_leaves_a_cubin_for_every_source() {
        if !nvrtc_present() {
            eprintln!("libnvrtc not found: compile_all not exercised");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let srcs = [crate::sources::TESTDATA, crate::sources::ROPE, crate::sources::EMBED];
        let t = std::time::Instant::now();
        for (src, cubin) in srcs.iter().zip(compile_all(&srcs, "sm_90", Some(dir.path()))) {
            assert!(!cubin.unwrap().from_cache, "{}", src.file);
        }
        eprintln!("compiled {} sources in {:.2} s", srcs.len(), t.elapsed().as_secs_f64());
        for src in &srcs {
            let cubin = compile(src, "sm_90", Some(dir.path())).unwrap();
            assert!(cubin.from_cache && cubin.bytes.len() > 100, "{}", src.file);
        }
    }

    #[test]
    fn parses_ptxas_report() {
        let log = "ptxas info    : Compiling entry function 'moe_gemm' for 'sm_90'\n\
                   ptxas info    : Function properties for moe_gemm\n\
                   \x20   0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n\
                   ptxas info    : Used 72 registers, used 1 barriers, 9216 bytes smem, 400 bytes cmem[0]\n";
        let r = parse_resources(log);
        assert_eq!(r, vec![KernelResources { kernel: "moe_gemm".into(), registers: 72, shared_bytes: 9216, spill_stores: 0 }]);
    }
}
