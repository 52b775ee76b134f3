//! The `gantry` binary: parses the command line and runs `serve`, `keys`, `tenants`, `usage` or
//! `models` on a Tokio runtime, logging to stderr (`GANTRY_LOG`).

use clap::Parser;
use gantry_server::cli::{commands, serve};
use gantry_server::cli::{Cli, Command};

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("GANTRY_LOG").unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Serve(args) => serve::run(*args).await,
            Command::Keys(cmd) => commands::keys(cmd).await,
            Command::Tenants(cmd) => commands::tenants(cmd).await,
            Command::Usage(args) => commands::usage(args).await,
            Command::Models(cmd) => commands::models_cmd(cmd).await,
        }
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
