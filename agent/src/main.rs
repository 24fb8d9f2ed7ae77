//! `slo-probe`: parses the command line and runs it (the subcommands are in `slo_probe::cli`).

use std::process::ExitCode;

use clap::Parser as _;
use slo_probe::{cli, error_chain};

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    let level = cli.log_level.clone().unwrap_or_else(|| {
        match cli.command {
            cli::Cmd::Run { .. } => "warn",
            _ => "info",
        }
        .to_owned()
    });
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(level))
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
