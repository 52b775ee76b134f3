//! The time the meter reads: the database's. Heartbeats, the cutoff past which a server counts
//! as dead, the rate-limit minute and the budget month are compared across replicas; read from
//! each server's own clock, a replica 45 s ahead took its peers for dead and released their live
//! reservations (a budget overspent twice over), and one already in the next minute wiped the
//! others' rate windows. PostgreSQL's clock is read at start and at every heartbeat; SQLite's
//! database is on this machine, whose clock it is.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::{Accounts, AccountsError, Backend};

#[derive(Debug, Default)]
pub(crate) struct DbClock {
    /// The database's clock less this machine's, in milliseconds.
    offset_ms: AtomicI64,
    /// How far this machine's clock is off, as tests pretend (0 outside tests).
    skew_ms: i64,
}

impl DbClock {
    /// A clock on a machine whose own clock is `skew_ms` off.
    #[cfg(test)]
    pub(crate) fn skewed(skew_ms: i64) -> Self {
        Self { offset_ms: AtomicI64::new(0), skew_ms }
    }

    /// Milliseconds since the epoch, by the database's clock as last read.
    pub(crate) fn now_ms(&self) -> i64 {
        self.local_ms() + self.offset_ms.load(Ordering::Relaxed)
    }

    /// Reads the database's clock again, halfway through the round trip.
    pub(crate) async fn sync(&self, accounts: &Accounts) -> Result<(), AccountsError> {
        if accounts.backend() != Backend::Postgres {
            return Ok(());
        }
        let before = self.local_ms();
        let db: i64 = sqlx::query_scalar("SELECT CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)")
            .fetch_one(&accounts.pool)
            .await?;
        let after = self.local_ms();
        self.offset_ms.store(db - before - (after - before) / 2, Ordering::Relaxed);
        Ok(())
    }

    fn local_ms(&self) -> i64 {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0);
        now + self.skew_ms
    }
}
