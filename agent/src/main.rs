//! `slo-probe`: parses the command line and runs it (the subcommands are in `slo_probe::cli`).

use std::process::ExitCode;

use clap::Parser as _;
use slo_probe::{cli, error_chain};

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(&cli.log_level))
        .format_target(false)
        .init();
    match cli::run(cli.command) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("slo-probe: error: {}", error_chain(e.as_ref()));
            ExitCode::FAILURE
        }
    }
}
