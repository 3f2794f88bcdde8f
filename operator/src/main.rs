//! brink-operator. Today it prints the CRDs of the `brink.dev` group (`crds`) and the JSON schema
//! of the self-test report agents publish (`schema`); the controllers arrive with the fleet issues.

mod crds;

use clap::{Parser, Subcommand};

// The placement and lifecycle decisions; the controllers that call them arrive next, so
// nothing in the binary uses them yet.
#[allow(dead_code, unused_imports)]
mod decide;
// Leader election; the controllers' wiring calls `leader::run_as_leader`.
#[allow(dead_code, unused_imports)]
mod leader;

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
    /// Print every brink.dev CustomResourceDefinition as one multi-document YAML
    /// (`brink-operator crds | kubectl apply -f -`).
    Crds,
}

fn main() -> std::process::ExitCode {
    match Cli::parse().command {
        Cmd::Crds => match crds::render() {
            Ok(yaml) => {
                print!("{yaml}");
                std::process::ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: cannot render the CRDs as YAML: {e}");
                std::process::ExitCode::FAILURE
            }
        },
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
