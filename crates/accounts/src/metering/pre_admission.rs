//! The cheap first half of admission, run before a request's body is even parsed: count the
//! request against its key's requests per minute and check that the key has any budget left.
//! Everything a request costs the server (parsing, templating, tokenizing, compiling grammars,
//! loading a model) comes after it, so a key at its limit, or out of budget, costs nothing.
//!
//! The [`Pass`] it hands out is what the full admission ([`Meter::admit_passed`]) takes: it
//! counts the request's tokens and reserves its cost, but not the request a second time.

use std::time::Instant;

use super::{Meter, Refusal, Refused, Ticket, Windows};
use crate::budget::Spend;
use crate::keys::KeyInfo;
use crate::money::BudgetPeriod;
use crate::rate::{Count, RateStatus};
use crate::{Backend, Charge};

/// A request counted against its key's requests per minute by [`Meter::pre_admit`]. Consumed by
/// [`Meter::admit_passed`], so one request is never counted twice.
#[derive(Debug)]
#[must_use = "a pass is spent by `Meter::admit_passed`"]
pub struct Pass {
    key_id: i64,
    rate: RateStatus,
    /// Counted against the key's per-minute windows (a batch line is not).
    windows: Windows,
}

impl Pass {
    /// The rate-limit state after counting the request, for the `x-ratelimit-*` headers of an
    /// answer given before the full admission (a 400 for a bad body).
    pub fn rate(&self) -> RateStatus {
        self.rate
    }
}

impl Meter {
    /// Counts the request against the key's requests per minute (refused when the limit is
    /// reached, or when not one token is left in its tokens per minute) and checks that its
    /// budget is not used up. Reads the database only for a key with a budget, or when the
    /// rate windows are shared (PostgreSQL).
    pub async fn pre_admit(&self, key: &KeyInfo) -> Result<Pass, Refused> {
        let rate = self.count_or_refuse(key, Count::Request).await?;
        self.check_budget(key, rate).await?;
        Ok(Pass { key_id: key.id, rate, windows: Windows::Tokens })
    }

    /// Counts a request that spends nothing (reading or managing the key's files and batches)
    /// against the key's requests per minute; its budget is not checked, so a key that spent it
    /// all can still read what it paid for.
    pub async fn count_request(&self, key: &KeyInfo) -> Result<RateStatus, Refused> {
        self.count_or_refuse(key, Count::Request).await
    }

    /// [`Self::pre_admit`] for a line of a batch: its budget is checked, but neither it nor its
    /// tokens count against the key's per-minute windows, which are its interactive traffic's
    /// (OpenAI limits batches apart from them).
    pub async fn pre_admit_batch_line(&self, key: &KeyInfo) -> Result<Pass, Refused> {
        self.check_budget(key, RateStatus::default()).await?;
        Ok(Pass { key_id: key.id, rate: RateStatus::default(), windows: Windows::Outside })
    }

    /// Refused when the key's budget has nothing left for any request.
    async fn check_budget(&self, key: &KeyInfo, rate: RateStatus) -> Result<(), Refused> {
        if key.budget.is_limited() {
            let spend = match self.inner.accounts.spend(key, self.inner.clock.now_ms()).await {
                Ok(spend) => spend,
                Err(e) => return Err(Refused { rate, reason: Refusal::Unavailable(e) }),
            };
            if let Some(message) = exhausted(key, &spend) {
                return Err(Refused { rate, reason: Refusal::Quota(message) });
            }
        }
        Ok(())
    }

    /// The full admission of a request that passed [`Meter::pre_admit`]: counts its tokens
    /// against the tokens per minute and reserves the most it can cost against the budget.
    pub async fn admit_passed(&self, pass: Pass, key: &KeyInfo, charge: Charge) -> Result<Ticket, Refused> {
        debug_assert_eq!(pass.key_id, key.id, "a pass is spent by the key it was given to");
        self.admit_counting(key, charge, pass.windows).await
    }

    /// Counts `tokens` that a request which passed [`Meter::pre_admit`] made the server read
    /// without running them (a prompt whose tokens were counted for the client) against the
    /// key's tokens per minute. Refused, counting nothing, when they do not fit the window.
    pub async fn count_passed_tokens(&self, pass: &Pass, key: &KeyInfo, tokens: u64) -> Result<RateStatus, Refused> {
        debug_assert_eq!(pass.key_id, key.id, "a pass is spent by the key it was given to");
        self.count_or_refuse(key, Count::Tokens(tokens)).await
    }

    /// [`Self::count`], a verdict against the windows being a refusal.
    async fn count_or_refuse(&self, key: &KeyInfo, count: Count) -> Result<RateStatus, Refused> {
        match self.count(key, count).await? {
            (rate, Ok(())) => Ok(rate),
            (rate, Err(refusal)) => Err(Refused { rate, reason: Refusal::RateLimited(refusal) }),
        }
    }

    /// Takes back the `tokens` a request refused after [`Self::count`] counted them (at
    /// `counted_at_ms`); returns `rate` as it then stands. A refund the database could not make
    /// is logged: the window forgets it within the minute.
    pub(super) async fn refund_tokens(
        &self,
        key: &KeyInfo,
        tokens: u64,
        counted_at_ms: i64,
        mut rate: RateStatus,
    ) -> RateStatus {
        let accounts = &self.inner.accounts;
        match accounts.backend() {
            Backend::Sqlite => self.inner.windows.refund(key.id, tokens),
            Backend::Postgres => {
                if let Err(e) = crate::rate::refund_shared(&accounts.pool, key.id, counted_at_ms, tokens).await {
                    tracing::warn!(error = %e, key_id = key.id, "could not give back a refused request's tokens per minute");
                }
            }
        }
        if let Some(t) = rate.tokens.as_mut() {
            t.remaining = (t.remaining + tokens).min(t.limit);
        }
        rate
    }

    /// Counts `count` against the key's per-minute windows: in this process (SQLite) or in the
    /// shared database (PostgreSQL).
    pub(super) async fn count(
        &self,
        key: &KeyInfo,
        count: Count,
    ) -> Result<(RateStatus, Result<(), crate::RateRefusal>), Refused> {
        let defaults = self.inner.config.default_limits;
        let rpm = key.rpm_limit.map_or(defaults.rpm, |n| n as u64);
        let tpm = key.tpm_limit.map_or(defaults.tpm, |n| n as u64);
        let accounts = &self.inner.accounts;
        match accounts.backend() {
            Backend::Sqlite => Ok(self.inner.windows.count(key.id, Some(rpm), Some(tpm), count, Instant::now())),
            Backend::Postgres => {
                let (rpm, tpm) = (Some(rpm as i64), Some(tpm as i64));
                crate::rate::admit_shared(&accounts.pool, key.id, rpm, tpm, count, self.inner.clock.now_ms())
                    .await
                    .map_err(|e| Refused { rate: RateStatus::default(), reason: Refusal::Unavailable(e) })
            }
        }
    }
}

/// Why a key's budget has nothing left for any request, if it has not.
fn exhausted(key: &KeyInfo, spend: &Spend) -> Option<String> {
    let period = match key.budget.period {
        BudgetPeriod::Total => "",
        BudgetPeriod::Month => " this month",
    };
    if let Some(limit) = key.budget.tokens.filter(|&b| spend.spent_tokens + spend.reserved_tokens >= b) {
        return Some(format!(
            "You exceeded your current quota: the key has used or reserved all of its {limit}-token budget{period}. \
             Raise the budget or wait for requests in flight to finish."
        ));
    }
    let limit = key.budget.nanos.filter(|&b| spend.spent_nanos + spend.reserved_nanos >= b)?;
    Some(format!(
        "You exceeded your current quota: the key has used or reserved all of its ${:.2} budget{period}. \
         Raise the budget or wait for requests in flight to finish.",
        limit as f64 / crate::NANOS_PER_USD as f64
    ))
}
