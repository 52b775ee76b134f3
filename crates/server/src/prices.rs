//! What a request costs: a price per model and service tier, from `--price`. A tier without its
//! own price derives it from the model's `default` one: `flex` at `FLEX_PRICE_FACTOR` of it
//! (OpenAI prices flex as it prices Batch, at half), `priority` at it.

use std::collections::HashMap;

use gantry_accounts::Price;
use gantry_api::ServiceTier;

/// What `flex` costs of `default` when the operator gave it no price of its own.
pub const FLEX_PRICE_FACTOR: f64 = 0.5;

/// One `--price`: a model (or alias), the tier it prices, the price.
pub type PriceEntry = (String, ServiceTier, Price);

#[derive(Debug, Clone, Default)]
pub struct PriceList {
    by_model: HashMap<String, TierPrices>,
}

#[derive(Debug, Clone, Copy, Default)]
struct TierPrices {
    default: Option<Price>,
    flex: Option<Price>,
    priority: Option<Price>,
}

impl PriceList {
    pub fn new(entries: &[PriceEntry]) -> Self {
        let mut by_model: HashMap<String, TierPrices> = HashMap::new();
        for (model, tier, price) in entries {
            let tiers = by_model.entry(model.clone()).or_default();
            let slot = match tier {
                ServiceTier::Default => &mut tiers.default,
                ServiceTier::Flex => &mut tiers.flex,
                ServiceTier::Priority => &mut tiers.priority,
            };
            *slot = Some(*price);
        }
        Self { by_model }
    }

    /// The price of `tier` for the model the client asked for as `asked` (an alias keeps its
    /// own prices), else for the model it resolved to, `model_id`; free when neither has one.
    pub fn price(&self, asked: &str, model_id: &str, tier: ServiceTier) -> Price {
        let Some(tiers) = self.by_model.get(asked).or_else(|| self.by_model.get(model_id)) else {
            return Price::default();
        };
        let default = tiers.default.unwrap_or_default();
        match tier {
            ServiceTier::Default => default,
            ServiceTier::Flex => tiers.flex.unwrap_or_else(|| default.scaled(FLEX_PRICE_FACTOR)),
            ServiceTier::Priority => tiers.priority.unwrap_or(default),
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
            ("m".into(), ServiceTier::Default, Price { cached_input_per_mtok: Some(0.5), ..price(2.0, 8.0) }),
            ("alias".into(), ServiceTier::Default, price(1.0, 1.0)),
            ("custom".into(), ServiceTier::Default, price(2.0, 8.0)),
            ("custom".into(), ServiceTier::Flex, price(1.5, 6.0)),
            ("custom".into(), ServiceTier::Priority, price(4.0, 16.0)),
        ]);
        let flex = list.price("m", "m", ServiceTier::Flex);
        assert_eq!((flex.input_per_mtok, flex.output_per_mtok, flex.cached_input_per_mtok), (1.0, 4.0, Some(0.25)));
        assert_eq!(list.price("m", "m", ServiceTier::Priority), list.price("m", "m", ServiceTier::Default));
        assert_eq!(list.price("custom", "custom", ServiceTier::Flex), price(1.5, 6.0));
        assert_eq!(list.price("custom", "custom", ServiceTier::Priority), price(4.0, 16.0));
        // An alias with a price keeps it; one without takes its model's; an unpriced model is free.
        assert_eq!(list.price("alias", "m", ServiceTier::Default), price(1.0, 1.0));
        assert_eq!(list.price("other-name", "m", ServiceTier::Default).input_per_mtok, 2.0);
        assert_eq!(list.price("x", "y", ServiceTier::Flex), Price::default());
    }
}
