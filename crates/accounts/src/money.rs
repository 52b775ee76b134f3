//! Money and limits as values: nano-dollars, a key's budget and its period, a model's price.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::AccountsError;

/// Nano-dollars per US dollar: money is stored as integers.
pub const NANOS_PER_USD: i64 = 1_000_000_000;

/// A key's spending limit: tokens (prompt + completion), money, or both, over a period.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Budget {
    #[serde(default)]
    pub tokens: Option<i64>,
    /// USD × 1e9.
    #[serde(default)]
    pub nanos: Option<i64>,
    #[serde(default)]
    pub period: BudgetPeriod,
}

impl Budget {
    pub fn is_limited(&self) -> bool {
        self.tokens.is_some() || self.nanos.is_some()
    }
}

/// `total`: one budget for the key's lifetime. `month`: resets at each UTC calendar month.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BudgetPeriod {
    #[default]
    Total,
    Month,
}

impl BudgetPeriod {
    pub fn as_str(self) -> &'static str {
        match self {
            BudgetPeriod::Total => "total",
            BudgetPeriod::Month => "month",
        }
    }

    /// The spend bucket a moment falls in: `total`, or `YYYY-MM` (UTC).
    pub fn bucket(self, unix_ms: i64) -> String {
        match self {
            BudgetPeriod::Total => "total".into(),
            BudgetPeriod::Month => {
                let t = time::OffsetDateTime::from_unix_timestamp(unix_ms.div_euclid(1000))
                    .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
                format!("{:04}-{:02}", t.year(), u8::from(t.month()))
            }
        }
    }
}

impl fmt::Display for BudgetPeriod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for BudgetPeriod {
    type Err = AccountsError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "total" => Ok(BudgetPeriod::Total),
            "month" => Ok(BudgetPeriod::Month),
            other => Err(AccountsError::Invalid(format!("budget period must be `total` or `month`, not {other:?}"))),
        }
    }
}

/// Price of a model in USD per million tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Price {
    pub input_per_mtok: f64,
    pub output_per_mtok: f64,
    /// Prompt tokens read from the prefix cache; `None`: the input price.
    #[serde(default)]
    pub cached_input_per_mtok: Option<f64>,
}

impl Price {
    /// Every rate times `factor` (a tier's discount or surcharge).
    pub fn scaled(self, factor: f64) -> Self {
        Self {
            input_per_mtok: self.input_per_mtok * factor,
            output_per_mtok: self.output_per_mtok * factor,
            cached_input_per_mtok: self.cached_input_per_mtok.map(|p| p * factor),
        }
    }

    /// Cost in nano-dollars, rounded up so a non-zero price never rounds to free.
    /// `cached_tokens` (at most `prompt_tokens`) are priced at the cached rate.
    pub fn cost_nanos(&self, prompt_tokens: u64, cached_tokens: u64, completion_tokens: u64) -> i64 {
        let cached = cached_tokens.min(prompt_tokens);
        let cached_rate = self.cached_input_per_mtok.unwrap_or(self.input_per_mtok);
        // USD per million tokens = 1000 nano-dollars per token per dollar.
        let nanos = (prompt_tokens - cached) as f64 * self.input_per_mtok * 1000.0
            + cached as f64 * cached_rate * 1000.0
            + completion_tokens as f64 * self.output_per_mtok * 1000.0;
        nanos.ceil().min(i64::MAX as f64) as i64
    }
}
