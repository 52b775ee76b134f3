//! Where the accounts database is: `--data-dir` (SQLite) or `--database-url` (Postgres).

use std::path::PathBuf;

use clap::Args;

#[derive(Args, Debug, Clone)]
pub struct DataDirArg {
    /// Where keys and the usage ledger live (SQLite).
    #[arg(long, env = "GANTRY_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// A database instead of the data directory's SQLite file: `postgres://…` lets several
    /// replicas share keys, budgets, rate limits and the ledger.
    #[arg(long, env = "GANTRY_DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
}

impl DataDirArg {
    /// Opens the database these flags name.
    pub async fn open(&self) -> anyhow::Result<gantry_accounts::Accounts> {
        use anyhow::Context;
        match &self.database_url {
            Some(url) => {
                gantry_accounts::Accounts::open_url(url).await.context("opening the accounts database (--database-url)")
            }
            None => {
                let dir = self.resolve();
                gantry_accounts::Accounts::open_data_dir(&dir)
                    .await
                    .with_context(|| format!("opening the accounts database in {}", dir.display()))
            }
        }
    }

    pub fn resolve(&self) -> PathBuf {
        self.data_dir.clone().unwrap_or_else(|| {
            let base = std::env::var_os("XDG_DATA_HOME")
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")))
                .unwrap_or_else(|| PathBuf::from("."));
            base.join("gantry")
        })
    }
}
