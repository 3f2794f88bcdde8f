//! brink-operator. Today it prints the JSON schema of the wire types it will read from nodes
//! (the self-test report); the controllers and `crds` arrive with the fleet issues.

use clap::{Parser, Subcommand};

// The placement and lifecycle decisions; the controllers that call them arrive next, so
// nothing in the binary uses them yet.
#[allow(dead_code, unused_imports)]
mod decide;

#[derive(Parser)]
#[command(name = "brink-operator", version, about = "brink's fleet operator")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Print the JSON schema of the node self-test report that agents publish.
    Schema,
}

fn main() -> std::process::ExitCode {
    match Cli::parse().command {
        Cmd::Schema => {
            let schema = schemars::schema_for!(brink_api::SelfTestReport);
            match serde_json::to_string_pretty(&schema) {
                Ok(s) => {
                    println!("{s}");
                    std::process::ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    std::process::ExitCode::FAILURE
                }
            }
        }
    }
}
