//! The state every handler shares: the model pool, the accounts, the meter, the admin token and
//! the draining flag. It imports no handler, so every handler may import it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use gantry_accounts::{Accounts, Meter};

#[derive(Clone)]
pub struct AppState {
    /// The models this server serves, loaded on demand; behind a loader trait so router tests
    /// can script their engines.
    pub models: crate::pool::ModelPool,
    pub accounts: Accounts,
    pub images: crate::openai::images::ImageFetcher,
    /// Admission (rate limits, budget reservations) and settlement into the usage ledger.
    pub meter: Meter,
    /// USD per million tokens, by model id; models without an entry cost nothing.
    pub prices: Arc<crate::prices::PriceList>,
    /// Guards `/admin/v1`; `None` disables the admin API.
    pub admin_token: Option<Arc<str>>,
    /// Set by a shutdown signal: readiness turns 503 and new chat requests are refused.
    pub draining: Draining,
    /// The live figures' 15-minute history behind `/admin/v1/stats` (the console's overview).
    pub stats: crate::admin::stats::StatsHistory,
    /// Bounds the requests being prepared at once, overall and per key.
    pub prepare_gate: crate::openai::prepare_gate::PrepareGate,
    /// How long stored responses (`store: true`) are kept; zero stores none.
    pub response_retention: std::time::Duration,
    /// What stored responses may take: per response, per key, and the disk's free space floor.
    pub response_storage: crate::response_storage::ResponseStorage,
    /// Files and batches: their limits, and the batch runner's wake-up call.
    pub batches: crate::batches::BatchSettings,
}

/// Set once, when a shutdown signal arrives: from then on readiness answers 503 and new chat
/// requests are refused, while running ones finish.
#[derive(Clone, Default)]
pub struct Draining(Arc<AtomicBool>);

impl Draining {
    pub fn start(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    pub fn is_draining(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}
