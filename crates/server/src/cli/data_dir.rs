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

    /// Opens the database these flags name, which must exist already: commands that only read
    /// or change keys and usage refuse a data directory holding none (a mistyped path would
    /// otherwise show an empty table and leave a new database behind).
    pub async fn open_existing(&self) -> anyhow::Result<gantry_accounts::Accounts> {
        if self.database_url.is_none() {
            let file = self.resolve().join(gantry_accounts::DB_FILE_NAME);
            if !file.exists() {
                anyhow::bail!(
                    "no accounts database at {} (check --data-dir; `gantry keys create` or `gantry serve` makes one)",
                    file.display()
                );
            }
        }
        self.open().await
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_data_dir_holding_no_database_is_an_error_and_stays_empty() {
        let dir = tempfile::tempdir().unwrap();
        let missing = DataDirArg { data_dir: Some(dir.path().join("typo")), database_url: None };
        let Err(e) = missing.open_existing().await else { panic!("no database there") };
        assert!(e.to_string().contains("no accounts database"), "{e}");
        assert!(!dir.path().join("typo").exists(), "nothing was created");
        let made = DataDirArg { data_dir: Some(dir.path().join("real")), database_url: None };
        made.open().await.unwrap();
        assert!(made.open_existing().await.is_ok());
    }
}
