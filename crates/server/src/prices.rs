//! What a request costs: a price per model and billing tier, from `--price` or a models file's
//! `price` table (`--price` wins where both price a model's tier). A tier without its
//! own price derives it from the model's `default` one: `flex` at `FLEX_PRICE_FACTOR` of it
//! (OpenAI prices flex as it prices Batch, at half), a batch's lines at `BATCH_PRICE_FACTOR`,
//! `priority` at it.

use std::collections::HashMap;

use gantry_accounts::Price;
use gantry_api::ServiceTier;

/// What `flex` costs of `default` when the operator gave it no price of its own.
pub const FLEX_PRICE_FACTOR: f64 = 0.5;
/// What a batch's line costs of `default` when the operator gave `batch` no price of its own
/// (OpenAI's Batch discount).
pub const BATCH_PRICE_FACTOR: f64 = 0.5;

/// The tier a request is billed in: the service tier it ran in, or `batch` for a batch's line
/// (whatever tier its body asked for). The ledger keeps its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BillingTier {
    Service(ServiceTier),
    Batch,
}

impl BillingTier {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Service(tier) => tier.as_str(),
            Self::Batch => "batch",
        }
    }
}

/// One `--price`: a model (or alias), the tier it prices, the price.
pub type PriceEntry = (String, BillingTier, Price);

/// A billing tier by name: `default`, `flex`, `priority` or `batch`.
pub fn parse_tier(name: &str) -> Result<BillingTier, String> {
    match name.trim() {
        "default" => Ok(BillingTier::Service(ServiceTier::Default)),
        "flex" => Ok(BillingTier::Service(ServiceTier::Flex)),
        "priority" => Ok(BillingTier::Service(ServiceTier::Priority)),
        "batch" => Ok(BillingTier::Batch),
        tier => Err(format!("{tier:?} is not a billing tier (default, flex, priority or batch)")),
    }
}

/// What `parse_rates` wants, in its refusal of another shape.
pub const RATES_SHAPE: &str = "expected \"INPUT,OUTPUT[,CACHED]\" (USD per million tokens)";

/// `INPUT,OUTPUT[,CACHED]`, USD per million tokens, each finite and not negative.
pub fn parse_rates(rates: &str) -> Result<Price, String> {
    let parts: Vec<&str> = rates.split(',').collect();
    let (input, output, cached) = match parts[..] {
        [input, output] => (input, output, None),
        [input, output, cached] => (input, output, Some(cached)),
        _ => return Err(RATES_SHAPE.into()),
    };
    let parse = |v: &str| {
        v.trim()
            .parse::<f64>()
            .ok()
            .filter(|x| x.is_finite() && *x >= 0.0)
            .ok_or_else(|| format!("{v:?} is not a price"))
    };
    Ok(Price {
        input_per_mtok: parse(input)?,
        output_per_mtok: parse(output)?,
        cached_input_per_mtok: cached.map(parse).transpose()?,
    })
}

#[derive(Debug, Clone, Default)]
pub struct PriceList {
    by_model: HashMap<String, TierPrices>,
}

#[derive(Debug, Clone, Copy, Default)]
struct TierPrices {
    default: Option<Price>,
    flex: Option<Price>,
    priority: Option<Price>,
    batch: Option<Price>,
}

impl PriceList {
    pub fn new(entries: &[PriceEntry]) -> Self {
        let mut by_model: HashMap<String, TierPrices> = HashMap::new();
        for (model, tier, price) in entries {
            let tiers = by_model.entry(model.clone()).or_default();
            let slot = match tier {
                BillingTier::Service(ServiceTier::Default) => &mut tiers.default,
                BillingTier::Service(ServiceTier::Flex) => &mut tiers.flex,
                BillingTier::Service(ServiceTier::Priority) => &mut tiers.priority,
                BillingTier::Batch => &mut tiers.batch,
            };
            *slot = Some(*price);
        }
        Self { by_model }
    }

    /// The price of `tier` for the model the client asked for as `asked` (an alias keeps its
    /// own prices), else for the model it resolved to, `model_id`; free when neither has one.
    pub fn price(&self, asked: &str, model_id: &str, tier: BillingTier) -> Price {
        let Some(tiers) = self.by_model.get(asked).or_else(|| self.by_model.get(model_id)) else {
            return Price::default();
        };
        let default = tiers.default.unwrap_or_default();
        match tier {
            BillingTier::Service(ServiceTier::Default) => default,
            BillingTier::Service(ServiceTier::Flex) => tiers.flex.unwrap_or_else(|| default.scaled(FLEX_PRICE_FACTOR)),
            BillingTier::Service(ServiceTier::Priority) => tiers.priority.unwrap_or(default),
            BillingTier::Batch => tiers.batch.unwrap_or_else(|| default.scaled(BATCH_PRICE_FACTOR)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn price(input: f64, output: f64) -> Price {
        Price { input_per_mtok: input, output_per_mtok: output, cached_input_per_mtok: None }
    }

    #[test]
    fn tiers_without_a_price_derive_it_from_the_default_one() {
        let list = PriceList::new(&[
            (
                "m".into(),
                BillingTier::Service(ServiceTier::Default),
                Price { cached_input_per_mtok: Some(0.5), ..price(2.0, 8.0) },
            ),
            ("alias".into(), BillingTier::Service(ServiceTier::Default), price(1.0, 1.0)),
            ("custom".into(), BillingTier::Service(ServiceTier::Default), price(2.0, 8.0)),
            ("custom".into(), BillingTier::Service(ServiceTier::Flex), price(1.5, 6.0)),
            ("custom".into(), BillingTier::Service(ServiceTier::Priority), price(4.0, 16.0)),
        ]);
        let flex = list.price("m", "m", BillingTier::Service(ServiceTier::Flex));
        assert_eq!((flex.input_per_mtok, flex.output_per_mtok, flex.cached_input_per_mtok), (1.0, 4.0, Some(0.25)));
        assert_eq!(
            list.price("m", "m", BillingTier::Service(ServiceTier::Priority)),
            list.price("m", "m", BillingTier::Service(ServiceTier::Default))
        );
        assert_eq!(list.price("custom", "custom", BillingTier::Service(ServiceTier::Flex)), price(1.5, 6.0));
        assert_eq!(list.price("custom", "custom", BillingTier::Service(ServiceTier::Priority)), price(4.0, 16.0));
        // An alias with a price keeps it; one without takes its model's; an unpriced model is free.
        assert_eq!(list.price("alias", "m", BillingTier::Service(ServiceTier::Default)), price(1.0, 1.0));
        assert_eq!(list.price("other-name", "m", BillingTier::Service(ServiceTier::Default)).input_per_mtok, 2.0);
        assert_eq!(list.price("x", "y", BillingTier::Service(ServiceTier::Flex)), Price::default());
        let batch = list.price("m", "m", BillingTier::Batch);
        assert_eq!((batch.input_per_mtok, batch.output_per_mtok, batch.cached_input_per_mtok), (1.0, 4.0, Some(0.25)));
        let custom = PriceList::new(&[("m".into(), BillingTier::Batch, price(0.1, 0.2))]);
        assert_eq!(custom.price("m", "m", BillingTier::Batch), price(0.1, 0.2));
    }

    #[test]
    fn a_later_entry_for_the_same_tier_wins() {
        // The server lists a models file's prices before the `--price` flags.
        let default = BillingTier::Service(ServiceTier::Default);
        let list = PriceList::new(&[
            ("m".into(), default, price(1.0, 2.0)),
            ("m".into(), BillingTier::Batch, price(0.1, 0.2)),
            ("m".into(), default, price(3.0, 4.0)),
        ]);
        assert_eq!(list.price("m", "m", default), price(3.0, 4.0));
        assert_eq!(list.price("m", "m", BillingTier::Batch), price(0.1, 0.2), "the file's batch price stays");
        assert_eq!(parse_tier(" priority "), Ok(BillingTier::Service(ServiceTier::Priority)));
        assert_eq!(parse_rates("1,2,3").map(|p| p.cached_input_per_mtok), Ok(Some(3.0)));
        assert_eq!(parse_rates("1"), Err(RATES_SHAPE.to_string()));
    }
}
