//! Helpers for test suites that run against PostgreSQL (see `scripts/test-postgres.sh`).

use sqlx::Connection;

use crate::AccountsError;

/// The admin URL of the test PostgreSQL, from `GANTRY_TEST_DATABASE_URL`, if set.
pub fn postgres_admin_url() -> Option<String> {
    std::env::var("GANTRY_TEST_DATABASE_URL").ok().filter(|u| !u.is_empty())
}

/// Creates an empty database with a unique name and returns its URL, so every test starts
/// from a clean schema.
pub async fn fresh_postgres_database(admin_url: &str) -> Result<String, AccountsError> {
    let name = format!("gantry_test_{}", &crate::generate_secret()[crate::SECRET_PREFIX.len()..][..16].to_ascii_lowercase());
    let mut conn = sqlx::PgConnection::connect(admin_url).await?;
    sqlx::query(&format!("CREATE DATABASE {name}")).execute(&mut conn).await?;
    conn.close().await?;
    let base = admin_url.rsplit_once('/').map_or(admin_url, |(b, _)| b);
    Ok(format!("{base}/{name}"))
}
