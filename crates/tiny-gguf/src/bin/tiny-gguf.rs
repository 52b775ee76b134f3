//! `tiny-gguf OUT.gguf [--seed N] [--mmproj MMPROJ.gguf]`: writes a tiny random-weight GGUF
//! model and, with `--mmproj`, a tiny multimodal projector for it.
//! `tiny-gguf --vision DIR [--seed N]`: the pair as `DIR/model.gguf` and `DIR/mmproj.gguf`.
//! `--reasoning`: a reasoning model (`<think>`/`</think>` tokens, a thinking template);
//! `--harmony`: one in gpt-oss's harmony format (its control tokens and channels).

use std::path::PathBuf;
use std::process::ExitCode;

use tiny_gguf::{
    write_tiny_model, write_tiny_projector, TinyModelSpec, TinyProjectorSpec, HARMONY_TEMPLATE, THINKING_TEMPLATE,
};

const USAGE: &str =
    "usage: tiny-gguf OUT.gguf [--seed N] [--mmproj MMPROJ.gguf] [--reasoning | --harmony] | tiny-gguf --vision DIR [--seed N]";

struct Args {
    out: PathBuf,
    seed: u64,
    mmproj: Option<PathBuf>,
    reasoning: bool,
    harmony: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut out = None;
    let mut seed = 0u64;
    let mut mmproj = None;
    let mut reasoning = false;
    let mut harmony = false;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "-h" | "--help" => return Err(USAGE.to_string()),
            "--reasoning" => reasoning = true,
            "--harmony" => harmony = true,
            "--mmproj" => mmproj = Some(PathBuf::from(args.next().ok_or("--mmproj needs a path")?)),
            "--vision" => {
                let dir = PathBuf::from(args.next().ok_or("--vision needs a directory")?);
                std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
                mmproj = Some(dir.join("mmproj.gguf"));
                if out.replace(dir.join("model.gguf")).is_some() {
                    return Err(format!("--vision names both outputs\n{USAGE}"));
                }
            }
            "--seed" => {
                let v = args.next().ok_or("--seed needs a value")?;
                seed = v.parse().map_err(|e| format!("invalid --seed {v:?}: {e}"))?;
            }
            s if s.starts_with("--seed=") => {
                let v = &s["--seed=".len()..];
                seed = v.parse().map_err(|e| format!("invalid --seed {v:?}: {e}"))?;
            }
            s if s.starts_with('-') && s.len() > 1 => return Err(format!("unknown option {s}\n{USAGE}")),
            s => {
                if out.replace(PathBuf::from(s)).is_some() {
                    return Err(format!("more than one output path\n{USAGE}"));
                }
            }
        }
    }
    let out = out.ok_or_else(|| USAGE.to_string())?;
    Ok(Args { out, seed, mmproj, reasoning, harmony })
}

fn main() -> ExitCode {
    let Args { out, seed, mmproj, reasoning, harmony } = match parse_args() {
        Ok(v) => v,
        Err(msg) => {
            eprintln!("{msg}");
            return ExitCode::from(2);
        }
    };
    let mut spec = TinyModelSpec { seed, ..TinyModelSpec::default() };
    if reasoning {
        spec.think_tokens = true;
        spec.chat_template = Some(THINKING_TEMPLATE.to_string());
    }
    if harmony {
        spec.harmony_tokens = true;
        spec.chat_template = Some(HARMONY_TEMPLATE.to_string());
    }
    if let Err(e) = write_tiny_model(&out, &spec) {
        eprintln!("tiny-gguf: failed to write {}: {e}", out.display());
        return ExitCode::FAILURE;
    }
    if let Some(path) = mmproj {
        let projector = TinyProjectorSpec { text_n_embd: spec.n_embd, seed, ..TinyProjectorSpec::default() };
        if let Err(e) = write_tiny_projector(&path, &projector) {
            eprintln!("tiny-gguf: failed to write {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}
