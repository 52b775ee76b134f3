//! `tiny-gguf OUT.gguf [--seed N]`: writes a tiny random-weight GGUF model.

use std::path::PathBuf;
use std::process::ExitCode;

use tiny_gguf::{write_tiny_model, TinyModelSpec};

const USAGE: &str = "usage: tiny-gguf OUT.gguf [--seed N]";

fn parse_args() -> Result<(PathBuf, u64), String> {
    let mut out = None;
    let mut seed = 0u64;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "-h" | "--help" => return Err(USAGE.to_string()),
            "--seed" => {
                let v = args.next().ok_or("--seed needs a value")?;
                seed = v
                    .parse()
                    .map_err(|e| format!("invalid --seed {v:?}: {e}"))?;
            }
            s if s.starts_with("--seed=") => {
                let v = &s["--seed=".len()..];
                seed = v
                    .parse()
                    .map_err(|e| format!("invalid --seed {v:?}: {e}"))?;
            }
            s if s.starts_with('-') && s.len() > 1 => {
                return Err(format!("unknown option {s}\n{USAGE}"))
            }
            s => {
                if out.replace(PathBuf::from(s)).is_some() {
                    return Err(format!("more than one output path\n{USAGE}"));
                }
            }
        }
    }
    let out = out.ok_or_else(|| USAGE.to_string())?;
    Ok((out, seed))
}

fn main() -> ExitCode {
    let (out, seed) = match parse_args() {
        Ok(v) => v,
        Err(msg) => {
            eprintln!("{msg}");
            return ExitCode::from(2);
        }
    };
    let spec = TinyModelSpec {
        seed,
        ..TinyModelSpec::default()
    };
    match write_tiny_model(&out, &spec) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tiny-gguf: failed to write {}: {e}", out.display());
            ExitCode::FAILURE
        }
    }
}
