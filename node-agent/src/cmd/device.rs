//! `brink-agent device`: what the agent found (GPU, memory, driver, CUDA, NVRTC), as a table or
//! JSON. No GPU is not a failure: it prints `gpu: false` with the reason and exits 0.

use std::process::ExitCode;

use crate::device;

#[derive(clap::Args)]
pub struct Args {
    /// Print JSON on stdout instead of the table.
    #[arg(long)]
    json: bool,
    /// CUDA device ordinal (after CUDA_VISIBLE_DEVICES).
    #[arg(long, value_name = "N", default_value_t = 0)]
    ordinal: usize,
}

pub fn run(args: Args) -> ExitCode {
    let found = device::discover(args.ordinal);
    for w in &found.warnings {
        eprintln!("warning: {w}");
    }
    if args.json {
        match serde_json::to_string_pretty(&found.report) {
            Ok(j) => println!("{j}"),
            Err(e) => {
                eprintln!("error: cannot serialise the device report: {e}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        print!("{}", device::render(&found.report));
    }
    ExitCode::SUCCESS
}
