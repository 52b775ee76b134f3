//! Helpers for test suites that run against PostgreSQL (see `scripts/test-postgres.sh`).

use sqlx::Connection;

use crate::AccountsError;

/// Set (to `1`) by `make test`: the PostgreSQL runs are part of the suite, and a missing
/// database is a failure rather than a skip.
pub const REQUIRE_ENV: &str = "GANTRY_REQUIRE_POSTGRES";

/// The admin URL of the test PostgreSQL, from `GANTRY_TEST_DATABASE_URL`. Without one, panics
/// when [`REQUIRE_ENV`] says PostgreSQL is required; otherwise prints a visible skip line naming
/// `test` and returns `None`.
pub fn postgres_admin_url_for(test: &str) -> Option<String> {
    if let Some(url) = std::env::var("GANTRY_TEST_DATABASE_URL").ok().filter(|u| !u.is_empty()) {
        return Some(url);
    }
    if std::env::var(REQUIRE_ENV).is_ok_and(|v| !v.is_empty() && v != "0") {
        panic!("{REQUIRE_ENV} is set but GANTRY_TEST_DATABASE_URL is not: {test} needs PostgreSQL (run scripts/test-postgres.sh)");
    }
    eprintln!("SKIPPED (PostgreSQL): {test}: GANTRY_TEST_DATABASE_URL is not set (make test sets it)");
    None
}

/// [`postgres_admin_url_for`] without a test name.
pub fn postgres_admin_url() -> Option<String> {
    postgres_admin_url_for("a PostgreSQL test")
}

/// Creates an empty database with a unique name and returns its URL, so every test starts
/// from a clean schema.
pub async fn fresh_postgres_database(admin_url: &str) -> Result<String, AccountsError> {
    let name =
        format!("gantry_test_{}", &crate::generate_secret()[crate::SECRET_PREFIX.len()..][..16].to_ascii_lowercase());
    let mut conn = sqlx::PgConnection::connect(admin_url).await?;
    sqlx::query(&format!("CREATE DATABASE {name}")).execute(&mut conn).await?;
    conn.close().await?;
    let base = admin_url.rsplit_once('/').map_or(admin_url, |(b, _)| b);
    Ok(format!("{base}/{name}"))
}
