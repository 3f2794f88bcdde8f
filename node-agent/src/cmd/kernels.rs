//! `brink-agent kernels`: compile every kernel for the given archs (a GB10 build check that
//! needs no GPU, only NVRTC).

use std::process::ExitCode;

use brink_kernels::cuda::compile::{compile, nvrtc_version, parse_resources};
use brink_kernels::sources;

#[derive(clap::Args)]
pub struct Args {
    /// Target archs, e.g. sm_90 (H200) and sm_121 (GB10).
    #[arg(long = "arch", default_values_t = ["sm_90".to_string(), "sm_121".to_string()])]
    archs: Vec<String>,
}

pub fn run(args: Args) -> ExitCode {
    if let Some(bad) = args.archs.iter().find(|a| a.strip_prefix("sm_").is_none_or(|n| n.parse::<u32>().is_err())) {
        eprintln!("error: --arch {bad}: expected a real arch sm_<number> (a CUBIN, not PTX), e.g. sm_121");
        return ExitCode::from(2);
    }
    let version = match nvrtc_version() {
        Ok((a, b)) => format!("{a}.{b}"),
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!("NVRTC {version}, kernel sources {}", &sources::sources_hash()[..12]);
    let mut failed = false;
    for arch in &args.archs {
        for src in sources::ALL {
            match compile(src, arch, None) {
                Ok(c) => {
                    for r in parse_resources(&c.log) {
                        println!(
                            "{arch:<7} {:<24} {:<30} regs {:>3}  smem {:>6} B  spills {} B",
                            src.file, r.kernel, r.registers, r.shared_bytes, r.spill_stores
                        );
                    }
                }
                Err(e) => {
                    failed = true;
                    eprintln!("{e}");
                }
            }
        }
    }
    if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS }
}
