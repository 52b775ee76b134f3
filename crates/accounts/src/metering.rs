//! Admission and settlement of metered requests, in one place.
//!
//! [`Meter::admit`] checks the key's rate limits (in this process for SQLite, in the shared
//! database for PostgreSQL) and reserves the most the request can cost against its budget. It
//! returns a [`Ticket`] that must end exactly once: [`Ticket::settle`] books the real usage, and
//! a ticket dropped unsettled (the request never reached the engine, the handler was dropped
//! because the client went away) releases its reservation. Both go through the [`Outbox`]
//! first, so they survive a database outage and a restart; a background task moves them into
//! the database. No caller can orphan a reservation.
//!
//! Each server process has its own identity (`--instance-id` or the host name, plus a random
//! suffix) and a heartbeat row; reservations of a process whose heartbeat is older than
//! `heartbeat_timeout` are released by any server. The reservation TTL is a last resort.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use tokio::sync::{oneshot, Notify};
use tokio_util::task::TaskTracker;

use crate::budget::Reservation;
use crate::keys::KeyInfo;
use crate::money::Price;
use crate::outbox::{Entry, Outbox};
use crate::rate::{Count, LocalWindows, RateRefusal, RateStatus};
use crate::usage::UsageRecord;
use crate::{Accounts, AccountsError};

pub(crate) mod clock;
mod pre_admission;
pub use pre_admission::Pass;

/// How a [`Meter`] runs.
#[derive(Debug, Clone)]
pub struct MeterConfig {
    /// The readable part of this process's identity (`--instance-id`, default the host name).
    pub instance_name: String,
    /// Where the outbox files live (the server's data directory + `/outbox`).
    pub outbox_dir: PathBuf,
    /// A server whose heartbeat is older than this is dead; its reservations are released.
    pub heartbeat_timeout: Duration,
    /// Reservations older than this are released whoever holds them (last resort).
    pub reservation_ttl: Duration,
    /// Per-minute limits of keys that have none of their own. Every key is counted against
    /// some limit, so every answer can carry OpenAI's `x-ratelimit-*` headers; "unlimited" is
    /// [`UNLIMITED_RPM`] / [`UNLIMITED_TPM`].
    pub default_limits: DefaultLimits,
}

/// A ceiling no single server reaches, standing for "no limit" (1,000,000 requests a minute).
pub const UNLIMITED_RPM: u64 = 1_000_000;
/// A ceiling no single server reaches, standing for "no limit" (1,000,000,000 tokens a minute).
pub const UNLIMITED_TPM: u64 = 1_000_000_000;

/// Requests and tokens per minute for keys without limits of their own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DefaultLimits {
    pub rpm: u64,
    pub tpm: u64,
}

impl Default for DefaultLimits {
    fn default() -> Self {
        Self { rpm: UNLIMITED_RPM, tpm: UNLIMITED_TPM }
    }
}

/// What a request may cost at most, and what it is.
#[derive(Debug, Clone)]
pub struct Charge {
    /// The server's id of the request (also the ledger's and the completion's).
    pub request_id: String,
    /// The client's `x-request-id`, if it sent one; kept beside, never as a key.
    pub client_request_id: Option<String>,
    pub model: String,
    pub price: Price,
    /// The service tier it runs in (`default`, `flex`, `priority`), kept on its ledger row.
    pub service_tier: &'static str,
    /// The batch it is a line of, kept on its ledger row.
    pub batch_id: Option<String>,
    pub prompt_tokens: u64,
    /// `max_tokens × n`.
    pub max_completion_tokens: u64,
}

/// What an admission counts against the key's per-minute windows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Windows {
    /// The request and its tokens: the tests' request admitted in one go.
    #[cfg(test)]
    RequestAndTokens,
    /// Its tokens: the request was counted by `Meter::pre_admit`.
    Tokens,
    /// Nothing: a batch line, outside the key's interactive limits (budgets still apply).
    Outside,
}

/// Why admission refused a request, with the rate-limit state to report.
#[derive(Debug)]
pub struct Refused {
    pub rate: RateStatus,
    pub reason: Refusal,
}

#[derive(Debug)]
pub enum Refusal {
    RateLimited(RateRefusal),
    /// The budget cannot cover the request (OpenAI's `insufficient_quota`); the message says why.
    Quota(String),
    /// The database could not be asked.
    Unavailable(AccountsError),
}

/// What a request used, as the engine reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settlement {
    pub prompt_tokens: u32,
    pub cached_tokens: u32,
    pub completion_tokens: u32,
    /// The completion tokens spent thinking: part of `completion_tokens` (and billed as such),
    /// recorded apart.
    pub reasoning_tokens: u32,
    pub outcome: Outcome,
}

/// How a request ended, as the ledger records it (its `outcome` column).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Completed,
    /// Stopped at its token limit.
    Length,
    /// The client went away.
    Cancelled,
    Error,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Completed => "completed",
            Outcome::Length => "length",
            Outcome::Cancelled => "cancelled",
            Outcome::Error => "error",
        }
    }
}

#[derive(Clone)]
pub struct Meter {
    inner: Arc<Inner>,
}

struct Inner {
    accounts: Accounts,
    owner: String,
    windows: LocalWindows,
    outbox: Outbox,
    /// Wakes the drainer when something was appended.
    appended: Notify,
    /// Wakes `shutdown` when the outbox became empty.
    drained: Notify,
    /// Settlements and releases being journalled; shutdown waits for them.
    tasks: TaskTracker,
    config: MeterConfig,
    /// The database's time (see `clock`).
    clock: clock::DbClock,
}

impl Meter {
    /// Registers this process, adopts outbox entries a previous run left, and starts the
    /// heartbeat, the sweeper of dead owners' reservations and the outbox drainer.
    pub async fn start(accounts: Accounts, config: MeterConfig) -> Result<Self, AccountsError> {
        let owner = format!("{}-{:08x}", config.instance_name, rand::rng().random::<u32>());
        let dir = config.outbox_dir.clone();
        let name = owner.clone();
        let outbox = tokio::task::spawn_blocking(move || Outbox::open(&dir, &name))
            .await
            .map_err(|e| AccountsError::Io(std::io::Error::other(e)))??;
        let clock = clock::DbClock::default();
        clock.sync(&accounts).await?;
        crate::instances::heartbeat(&accounts.pool, &owner, clock.now_ms()).await?;
        let meter = Self {
            inner: Arc::new(Inner {
                accounts,
                owner,
                windows: LocalWindows::default(),
                outbox,
                appended: Notify::new(),
                drained: Notify::new(),
                tasks: TaskTracker::new(),
                config,
                clock,
            }),
        };
        tokio::spawn(drain(meter.inner.clone()));
        tokio::spawn(heartbeat(meter.inner.clone()));
        Ok(meter)
    }

    /// This process's identity: the owner of its reservations and the name of its outbox file.
    pub fn owner(&self) -> &str {
        &self.inner.owner
    }

    /// The database's time now, unix milliseconds: what heartbeats are stamped with.
    pub fn now_ms(&self) -> i64 {
        self.inner.clock.now_ms()
    }

    /// Entries written to the outbox and not yet stored in the database.
    pub fn pending(&self) -> usize {
        self.inner.outbox.pending_len()
    }

    /// Rate limit, then budget reservation, in one call: the tests' shorthand for what the
    /// server does in two ([`Meter::pre_admit`], then [`Meter::admit_passed`]).
    #[cfg(test)]
    pub(crate) async fn admit(&self, key: &KeyInfo, charge: Charge) -> Result<Ticket, Refused> {
        self.admit_counting(key, charge, Windows::RequestAndTokens).await
    }

    async fn admit_counting(&self, key: &KeyInfo, charge: Charge, windows: Windows) -> Result<Ticket, Refused> {
        // Admission runs in its own task: a caller dropped while the reservation is being made
        // (the client went away) cannot leave it orphaned, because the finished task's ticket
        // is then dropped, which releases it.
        let (meter, key) = (self.clone(), key.clone());
        match self.inner.tasks.spawn(async move { meter.admit_here(&key, charge, windows).await }).await {
            Ok(admitted) => admitted,
            Err(e) => Err(Refused {
                rate: RateStatus::default(),
                reason: Refusal::Unavailable(AccountsError::Io(std::io::Error::other(e))),
            }),
        }
    }

    async fn admit_here(&self, key: &KeyInfo, charge: Charge, windows: Windows) -> Result<Ticket, Refused> {
        let tokens = charge.prompt_tokens + charge.max_completion_tokens;
        let started_at_ms = self.inner.clock.now_ms();
        let accounts = &self.inner.accounts;
        let (rate, verdict) = match windows {
            #[cfg(test)]
            Windows::RequestAndTokens => self.count(key, Count::RequestAndTokens(tokens)).await?,
            Windows::Tokens => self.count(key, Count::Tokens(tokens)).await?,
            Windows::Outside => (RateStatus::default(), Ok(())),
        };
        if let Err(refusal) = verdict {
            return Err(Refused { rate, reason: Refusal::RateLimited(refusal) });
        }
        let reservation = Reservation {
            request_id: charge.request_id.clone(),
            tokens: tokens as i64,
            // The most it can cost: no prompt token from the cache.
            nanos: charge.price.cost_nanos(charge.prompt_tokens, 0, charge.max_completion_tokens),
            owner: self.inner.owner.clone(),
            at_ms: started_at_ms,
        };
        let refused = match accounts.reserve(key, &reservation).await {
            Ok(()) => {
                return Ok(Ticket { meter: self.clone(), key_id: key.id, charge, started_at_ms, rate, open: true })
            }
            Err(AccountsError::QuotaExceeded(message)) => Refusal::Quota(message),
            Err(e) => Refusal::Unavailable(e),
        };
        // Refused after its tokens were counted: it runs nothing, so it uses none of them.
        let rate = match windows {
            Windows::Outside => rate,
            _ => self.refund_tokens(key, tokens, started_at_ms, rate).await,
        };
        Err(Refused { rate, reason: refused })
    }

    /// Waits for settlements in flight to reach the outbox, then up to `grace` for the outbox
    /// to reach the database. What remains is replayed by the next server to start.
    pub async fn shutdown(&self, grace: Duration) {
        let inner = &self.inner;
        inner.tasks.close();
        let deadline = tokio::time::Instant::now() + grace;
        if tokio::time::timeout_at(deadline, inner.tasks.wait()).await.is_err() {
            tracing::error!("settlements were still being journalled at exit");
        }
        while inner.outbox.pending_len() > 0 {
            let drained = inner.drained.notified();
            inner.appended.notify_one();
            if tokio::time::timeout_at(deadline, drained).await.is_err() {
                break;
            }
        }
        let left = inner.outbox.pending_len();
        if left > 0 {
            tracing::error!(left, outbox = %inner.outbox.path().display(), "usage records not yet in the database stay in the outbox; the next start replays them");
            return;
        }
        if let Err(e) = crate::instances::deregister(&inner.accounts.pool, &inner.owner).await {
            tracing::warn!(error = %e, "could not remove this server's heartbeat row");
        }
    }

    /// Journals `entry`, then wakes the drainer and fires `on_disk`. Runs as a tracked task.
    fn journal(&self, entry: Entry, on_disk: Option<oneshot::Sender<()>>) {
        let inner = self.inner.clone();
        let task = self.inner.tasks.track_future(async move {
            let outbox_inner = inner.clone();
            let kept = entry.clone();
            match tokio::task::spawn_blocking(move || outbox_inner.outbox.append(kept)).await {
                Ok(Ok(_)) => {
                    inner.appended.notify_one();
                    on_disk.map(|tx| tx.send(()));
                }
                failed => {
                    // Do not hold the client's answer hostage to a failing disk.
                    on_disk.map(|tx| tx.send(()));
                    // The disk refused: write to the database directly, as long as it takes.
                    tracing::error!(
                        ?failed,
                        request_id = entry.request_id(),
                        "could not write the usage outbox; writing to the database directly"
                    );
                    let mut backoff = Duration::from_millis(200);
                    while let Err(e) = apply(&inner.accounts, &entry).await {
                        if is_permanent(&e) {
                            tracing::error!(error = %e, ?entry, "dropping a usage entry the database refuses");
                            break;
                        }
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(Duration::from_secs(5));
                    }
                }
            }
        });
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => drop(handle.spawn(task)),
            Err(_) => tracing::error!(owner = %self.inner.owner, "no runtime to journal a settlement on"),
        }
    }
}

/// An admitted request's hold on its key's budget. Ends exactly once: settled with what the
/// request used, or — dropped unsettled — released.
pub struct Ticket {
    meter: Meter,
    key_id: i64,
    charge: Charge,
    started_at_ms: i64,
    rate: RateStatus,
    open: bool,
}

impl Ticket {
    pub fn request_id(&self) -> &str {
        &self.charge.request_id
    }

    /// The rate-limit state at admission, for the `x-ratelimit-*` headers.
    pub fn rate(&self) -> RateStatus {
        self.rate
    }

    /// Books what the request used (journalled first, then stored in the database).
    pub fn settle(self, used: Settlement) {
        self.settle_then(used, None);
    }

    fn settle_then(mut self, used: Settlement, on_disk: Option<oneshot::Sender<()>>) {
        self.open = false;
        let c = &self.charge;
        let record = UsageRecord {
            request_id: c.request_id.clone(),
            client_request_id: c.client_request_id.clone(),
            key_id: self.key_id,
            model: c.model.clone(),
            prompt_tokens: used.prompt_tokens,
            cached_tokens: used.cached_tokens,
            completion_tokens: used.completion_tokens,
            reasoning_tokens: used.reasoning_tokens,
            cost_nanos: c.price.cost_nanos(
                u64::from(used.prompt_tokens),
                u64::from(used.cached_tokens),
                u64::from(used.completion_tokens),
            ),
            outcome: used.outcome.as_str().to_string(),
            service_tier: c.service_tier.to_string(),
            batch_id: c.batch_id.clone(),
            started_at_ms: self.started_at_ms,
            finished_at_ms: self.meter.inner.clock.now_ms(),
        };
        self.meter.journal(Entry::Settle { record }, on_disk);
    }

    /// Settles with what `used` resolves to, in a task that shutdown waits for. The returned
    /// receiver fires once the usage record is on disk: tell the client its usage only then,
    /// so a crash right after the answer cannot lose the record of what it was told.
    pub fn settle_when(self, used: impl Future<Output = Settlement> + Send + 'static) -> oneshot::Receiver<()> {
        self.settle_or_release_when(async move { Some(used.await) })
    }

    /// [`Self::settle_when`], or releases the reservation, booking nothing, when `used`
    /// resolves to `None` (a batch's line the engine stopped, to be run again); the receiver
    /// then fires at once.
    pub fn settle_or_release_when(
        self,
        used: impl Future<Output = Option<Settlement>> + Send + 'static,
    ) -> oneshot::Receiver<()> {
        let (tx, rx) = oneshot::channel();
        let tasks = self.meter.inner.tasks.clone();
        tokio::spawn(tasks.track_future(async move {
            match used.await {
                Some(used) => self.settle_then(used, Some(tx)),
                None => {
                    drop(self);
                    let _ = tx.send(());
                }
            }
        }));
        rx
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if self.open {
            self.open = false;
            self.meter.journal(Entry::Release { request_id: self.charge.request_id.clone() }, None);
        }
    }
}

async fn apply(accounts: &Accounts, entry: &Entry) -> Result<(), AccountsError> {
    match entry {
        Entry::Settle { record } => accounts.record_usage(record).await,
        Entry::Release { request_id } => accounts.release(request_id).await,
    }
}

/// An entry the database will never take (its key is gone); retrying would block the rest.
fn is_permanent(e: &AccountsError) -> bool {
    matches!(e, AccountsError::NotFound(_) | AccountsError::Invalid(_))
}

/// Moves outbox entries into the database, a few at a time, retrying with backoff while the
/// database is unreachable.
async fn drain(inner: Arc<Inner>) {
    let mut backoff = Duration::from_millis(100);
    loop {
        let batch = inner.outbox.pending();
        if batch.is_empty() {
            inner.drained.notify_waiters();
            inner.appended.notified().await;
            continue;
        }
        let mut failed = false;
        for chunk in batch.chunks(16) {
            let mut stored_seqs = Vec::with_capacity(chunk.len());
            let mut set = tokio::task::JoinSet::new();
            for (seq, entry) in chunk.iter().cloned() {
                let accounts = inner.accounts.clone();
                set.spawn(async move { (seq, apply(&accounts, &entry).await, entry) });
            }
            while let Some(joined) = set.join_next().await {
                let Ok((seq, result, entry)) = joined else { continue };
                let stored = match result {
                    Ok(()) => true,
                    Err(e) if is_permanent(&e) => {
                        tracing::error!(error = %e, ?entry, "dropping a usage entry the database refuses");
                        true
                    }
                    Err(e) => {
                        if !failed {
                            tracing::warn!(error = %e, pending = batch.len(), "the database did not take usage records; they stay in the outbox and are retried");
                        }
                        failed = true;
                        false
                    }
                };
                if stored {
                    stored_seqs.push(seq);
                }
            }
            // Off the runtime's workers: emptying or compacting the file is blocking I/O.
            let outbox_inner = inner.clone();
            let _ = tokio::task::spawn_blocking(move || {
                for seq in stored_seqs {
                    if let Err(e) = outbox_inner.outbox.done(seq) {
                        tracing::error!(error = %e, "could not compact the outbox");
                    }
                }
            })
            .await;
            if failed {
                break;
            }
        }
        if failed {
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(5));
        } else {
            backoff = Duration::from_millis(100);
        }
    }
}

/// Refreshes this process's heartbeat and releases the reservations of dead processes (and,
/// as a last resort, of any reservation older than the TTL).
async fn heartbeat(inner: Arc<Inner>) {
    let timeout = inner.config.heartbeat_timeout;
    let mut tick = tokio::time::interval((timeout / 4).clamp(Duration::from_millis(100), Duration::from_secs(15)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let pool = &inner.accounts.pool;
    loop {
        tick.tick().await;
        if let Err(e) = inner.clock.sync(&inner.accounts).await {
            tracing::warn!(error = %e, "could not read the database's clock");
            continue;
        }
        let now = inner.clock.now_ms();
        if let Err(e) = crate::instances::heartbeat(pool, &inner.owner, now).await {
            tracing::warn!(error = %e, "could not refresh this server's heartbeat");
            continue;
        }
        match crate::instances::release_dead(pool, now - timeout.as_millis() as i64).await {
            Ok(0) => {}
            Ok(n) => tracing::warn!(released = n, "released budget reservations of servers that stopped"),
            Err(e) => tracing::warn!(error = %e, "sweeping reservations of stopped servers failed"),
        }
        let cutoff = now - inner.config.reservation_ttl.as_millis() as i64;
        match inner.accounts.release_reservations_before(cutoff).await {
            Ok(0) => {}
            Ok(n) => tracing::warn!(released = n, "released budget reservations older than --reservation-ttl"),
            Err(e) => tracing::warn!(error = %e, "sweeping stale reservations failed"),
        }
    }
}
