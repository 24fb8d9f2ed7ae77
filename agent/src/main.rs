//! `slo-probe`: parses the command line and runs it (the subcommands are in `slo_probe::cli`).

use std::process::ExitCode;

use clap::Parser as _;
use slo_probe::{cli, error_chain};

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    // `run` shares the terminal with the command: quieter, and every line of ours prefixed.
    let wraps = matches!(cli.command, cli::Cmd::Run { .. });
    let level = cli
        .log_level
        .clone()
        .unwrap_or_else(|| if wraps { "warn" } else { "info" }.to_owned());
    let mut logger =
        env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(level));
    logger.format_target(false);
    if wraps {
        logger.format(|buf, record| {
            use std::io::Write as _;
            writeln!(
                buf,
                "slo-probe: {}: {}",
                record.level().as_str().to_lowercase(),
                record.args()
            )
        });
    }
    logger.init();
    match cli::run(cli.command) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("slo-probe: error: {}", error_chain(e.as_ref()));
            ExitCode::FAILURE
        }
    }
}
