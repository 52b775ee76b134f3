//! `gantry keys …`, `gantry usage`, `gantry models …`.

use anyhow::Context;
use gantry_accounts::Accounts;

use crate::cli::{DataDirArg, KeysCommand, ModelsCommand, OutputFormat, UsageArgs};
use crate::models;

async fn open(data: &DataDirArg) -> anyhow::Result<Accounts> {
    let dir = data.resolve();
    Accounts::open_data_dir(&dir).await.with_context(|| format!("opening the accounts database in {}", dir.display()))
}

pub async fn keys(cmd: KeysCommand) -> anyhow::Result<()> {
    match cmd {
        KeysCommand::Create { name, rpm, tpm, data } => {
            let limits = gantry_accounts::KeyLimits { rpm, tpm };
            let created = open(&data).await?.create_key_with_limits(&name, limits).await?;
            eprintln!("Created key {} ({}). The secret is shown only once:", created.key.id, created.key.name);
            println!("{}", created.secret);
        }
        KeysCommand::List { data } => {
            let keys = open(&data).await?.list_keys().await?;
            println!("{:<6} {:<24} {:<18} {:<10} {:>8} {:>10}", "ID", "NAME", "PREFIX", "STATUS", "RPM", "TPM");
            let limit = |l: Option<i64>| l.map_or("-".to_string(), |n| n.to_string());
            for k in keys {
                let status = if k.revoked_at.is_some() { "revoked" } else { "active" };
                println!(
                    "{:<6} {:<24} {:<18} {:<10} {:>8} {:>10}",
                    k.id, k.name, k.prefix, status, limit(k.rpm_limit), limit(k.tpm_limit)
                );
            }
        }
        KeysCommand::Revoke { key, data } => {
            let k = open(&data).await?.revoke_key(&key).await?;
            println!("Revoked key {} ({}, {}…)", k.id, k.name, k.prefix);
        }
    }
    Ok(())
}

pub async fn usage(args: UsageArgs) -> anyhow::Result<()> {
    let rows = open(&args.data).await?.usage_summary().await?;
    match args.format {
        OutputFormat::Json => {
            let json: Vec<_> = rows
                .iter()
                .map(|r| {
                    serde_json::json!({
                        "key_name": r.key_name, "model": r.model, "requests": r.requests,
                        "prompt_tokens": r.prompt_tokens, "cached_tokens": r.cached_tokens,
                        "completion_tokens": r.completion_tokens,
                    })
                })
                .collect();
            println!("{}", serde_json::to_string_pretty(&json)?);
        }
        OutputFormat::Csv => {
            println!("key_name,model,requests,prompt_tokens,cached_tokens,completion_tokens");
            for r in rows {
                println!("{},{},{},{},{},{}", csv(&r.key_name), csv(&r.model), r.requests, r.prompt_tokens, r.cached_tokens, r.completion_tokens);
            }
        }
        OutputFormat::Table => {
            println!("{:<24} {:<40} {:>9} {:>14} {:>14} {:>18}", "KEY", "MODEL", "REQUESTS", "PROMPT_TOKENS", "CACHED_TOKENS", "COMPLETION_TOKENS");
            for r in rows {
                println!("{:<24} {:<40} {:>9} {:>14} {:>14} {:>18}", r.key_name, r.model, r.requests, r.prompt_tokens, r.cached_tokens, r.completion_tokens);
            }
        }
    }
    Ok(())
}

fn csv(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

pub async fn models_cmd(cmd: ModelsCommand) -> anyhow::Result<()> {
    let cache = models::default_cache_dir();
    match cmd {
        ModelsCommand::Pull { name, source, quiet } => {
            let entry = models::find(&name).with_context(|| {
                format!("unknown model `{name}`; known: {}", models::catalog().iter().map(|e| e.name).collect::<Vec<_>>().join(", "))
            })?;
            let opts = models::PullOptions { source, quiet, ..Default::default() };
            let path = models::pull(entry, &cache, &opts).await?;
            println!("{}", path.display());
        }
        ModelsCommand::List => {
            println!("{:<22} {:<46} {:>10} {:<7}", "NAME", "FILE", "SIZE", "CACHED");
            for row in models::list_rows(&cache) {
                let size = row.size.map_or("?".to_string(), |s| format!("{:.0} MB", s as f64 / 1e6));
                let name = if row.default { format!("{} *", row.name) } else { row.name.to_string() };
                println!("{:<22} {:<46} {:>10} {:<7}", name, row.file, size, if row.cached { "yes" } else { "no" });
            }
        }
    }
    Ok(())
}
