//! Server processes sharing a database announce themselves with a heartbeat row; a process
//! whose heartbeat stopped is dead, and any server releases the reservations it held.

use sqlx::AnyPool;

use crate::budget;
use crate::AccountsError;

/// Creates or refreshes the heartbeat row of `id`.
pub(crate) async fn heartbeat(pool: &AnyPool, id: &str, now_ms: i64) -> Result<(), AccountsError> {
    sqlx::query(
        "INSERT INTO instances (id, started_at_ms, heartbeat_at_ms) VALUES ($1, $2, $2) \
         ON CONFLICT (id) DO UPDATE SET heartbeat_at_ms = $2",
    )
    .bind(id)
    .bind(now_ms)
    .execute(pool)
    .await?;
    Ok(())
}

/// Removes the heartbeat row of a server that stops cleanly.
pub(crate) async fn deregister(pool: &AnyPool, id: &str) -> Result<(), AccountsError> {
    sqlx::query("DELETE FROM instances WHERE id = $1").bind(id).execute(pool).await?;
    Ok(())
}

/// Releases the reservations of every owner without a heartbeat since `cutoff_ms` (dead, or
/// never registered), and forgets the dead instances. Returns how many reservations went.
pub(crate) async fn release_dead(pool: &AnyPool, cutoff_ms: i64) -> Result<u64, AccountsError> {
    let released = budget::release_where(
        pool,
        "owner NOT IN (SELECT id FROM instances WHERE heartbeat_at_ms >= $1)",
        budget::Bind::Int(cutoff_ms),
    )
    .await?;
    sqlx::query("DELETE FROM instances WHERE heartbeat_at_ms < $1").bind(cutoff_ms).execute(pool).await?;
    Ok(released)
}
