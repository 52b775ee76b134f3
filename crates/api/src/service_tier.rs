//! OpenAI's `service_tier`: what a request asks for, and what an answer reports it ran in.
//! `auto` (or none) and `scale` (OpenAI's older reserved capacity) run as `default`; `priority`
//! runs as asked only for keys the operator allows it, as at OpenAI, and the answer says so.

use serde_json::{Map, Value};

use crate::fields::opt_str;
use crate::ApiError;

/// A tier a request runs in, as answers report it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ServiceTier {
    #[default]
    Default,
    /// Idle capacity: waits behind every other request, billed at the flex price.
    Flex,
    /// Ahead of the key's other requests.
    Priority,
}

impl ServiceTier {
    const ASKABLE: [&'static str; 5] = ["auto", "default", "flex", "scale", "priority"];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Default => "default",
            Self::Flex => "flex",
            Self::Priority => "priority",
        }
    }

    /// The tier a request runs in when it asked for this one: `Priority` only when `priority_allowed`.
    pub fn granted(self, priority_allowed: bool) -> Self {
        match self {
            Self::Priority if !priority_allowed => Self::Default,
            tier => tier,
        }
    }
}

/// The `service_tier` of a request body: what it asks for (`auto`, absent and `scale` ask for
/// `Default`).
pub(crate) fn parse_service_tier(obj: &Map<String, Value>) -> Result<ServiceTier, ApiError> {
    match opt_str(obj, "service_tier", "service_tier")?.as_deref() {
        None | Some("auto" | "default" | "scale") => Ok(ServiceTier::Default),
        Some("flex") => Ok(ServiceTier::Flex),
        Some("priority") => Ok(ServiceTier::Priority),
        Some(other) => Err(ApiError::invalid_value(
            "service_tier",
            format!(
                "Invalid value: '{other}'. Supported values are: {}.",
                ServiceTier::ASKABLE.map(|n| format!("'{n}'")).join(", ")
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn parse(v: Value) -> Result<ServiceTier, ApiError> {
        parse_service_tier(v.as_object().unwrap())
    }

    #[test]
    fn tiers_parse_as_openai_names_them_and_others_are_refused() {
        for (asked, tier) in [
            (json!({}), ServiceTier::Default),
            (json!({"service_tier": null}), ServiceTier::Default),
            (json!({"service_tier": "auto"}), ServiceTier::Default),
            (json!({"service_tier": "scale"}), ServiceTier::Default),
            (json!({"service_tier": "flex"}), ServiceTier::Flex),
            (json!({"service_tier": "priority"}), ServiceTier::Priority),
        ] {
            assert_eq!(parse(asked.clone()).unwrap(), tier, "{asked}");
        }
        for bad in [json!({"service_tier": "turbo"}), json!({"service_tier": "Flex"}), json!({"service_tier": 1})] {
            let e = parse(bad.clone()).unwrap_err().to_json();
            assert_eq!(e["error"]["param"], "service_tier", "{bad}: {e}");
        }
        let e = parse(json!({"service_tier": "turbo"})).unwrap_err().to_json();
        assert!(e["error"]["message"].as_str().unwrap().contains("'flex'"), "{e}");
    }

    #[test]
    fn priority_is_granted_only_where_allowed() {
        assert_eq!(ServiceTier::Priority.granted(false), ServiceTier::Default);
        assert_eq!(ServiceTier::Priority.granted(true), ServiceTier::Priority);
        assert_eq!(ServiceTier::Flex.granted(false), ServiceTier::Flex);
    }

    #[test]
    fn every_chunk_reports_the_tier_it_ran_in() {
        let encoder = crate::ChunkEncoder::new("c".into(), 1, "m".into(), false).in_tier(ServiceTier::Flex);
        let frames = encoder.encode(crate::ChatDelta::TurnStart { choice: 0, forced_call: false });
        let crate::ChunkFrame::Data(chunk) = &frames[0] else { panic!("{frames:?}") };
        assert_eq!(chunk["service_tier"], "flex");
    }
}
