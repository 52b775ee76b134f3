//! `GET /v1/responses/{id}/input_items`: a stored Response's input items as OpenAI lists them, a
//! page at a time. Items are stored as the client sent them (`kept`), often without ids and with
//! a message's content as a plain string; listed, each has an id (made from the Response's id and
//! the item's place, so the same item always has the same one) and its content as parts.

use std::collections::HashMap;

use serde_json::{json, Value};

use crate::ApiError;

/// A page's bounds: OpenAI's `limit` (1–100, default 20), `order` (`desc` by default) and the
/// `after`/`before` cursors (item ids).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ItemsQuery {
    pub limit: usize,
    pub ascending: bool,
    pub after: Option<String>,
    pub before: Option<String>,
}

/// Reads a page's bounds from the query string's parameters; `include` names extra fields
/// OpenAI can add, none of which this server keeps, so it changes nothing.
pub fn items_query(params: &HashMap<String, String>) -> Result<ItemsQuery, ApiError> {
    let limit = match params.get("limit") {
        None => 20,
        Some(v) => match v.parse::<usize>() {
            Ok(n @ 1..=100) => n,
            _ => {
                return Err(ApiError::invalid_value(
                    "limit",
                    format!("Invalid 'limit': expected an integer from 1 to 100, but got '{v:.32}'."),
                ))
            }
        },
    };
    let ascending = match params.get("order").map(String::as_str) {
        None | Some("desc") => false,
        Some("asc") => true,
        Some(other) => {
            return Err(ApiError::invalid_value(
                "order",
                format!("Invalid 'order': expected 'asc' or 'desc', but got '{other:.32}'."),
            ))
        }
    };
    Ok(ItemsQuery { limit, ascending, after: params.get("after").cloned(), before: params.get("before").cloned() })
}

/// The list object of `input` (the Response's input items, in the order sent) for `query`.
pub fn input_items_page(response_id: &str, input: &[Value], query: &ItemsQuery) -> Value {
    let mut items: Vec<Value> = input.iter().enumerate().map(|(i, item)| listed(response_id, i, item)).collect();
    if !query.ascending {
        items.reverse();
    }
    let position = |id: &str| items.iter().position(|item| item["id"] == id);
    let start = query.after.as_deref().and_then(position).map_or(0, |i| i + 1);
    let end = query.before.as_deref().and_then(position).unwrap_or(items.len()).max(start);
    let window = &items[start..end];
    let page = &window[..window.len().min(query.limit)];
    json!({
        "object": "list",
        "data": page,
        "first_id": page.first().map(|i| i["id"].clone()),
        "last_id": page.last().map(|i| i["id"].clone()),
        "has_more": window.len() > page.len(),
    })
}

/// One input item as listed: its type, an id, and a message's content as parts.
fn listed(response_id: &str, index: usize, item: &Value) -> Value {
    let mut item = item.clone();
    let kind = item.get("type").and_then(Value::as_str).unwrap_or("message").to_owned();
    item["type"] = kind.clone().into();
    if item.get("id").and_then(Value::as_str).is_none() {
        let prefix = match kind.as_str() {
            "function_call" => "fc",
            "function_call_output" => "fco",
            "reasoning" => "rs",
            _ => "msg",
        };
        let tail = response_id.strip_prefix("resp_").unwrap_or(response_id);
        item["id"] = format!("{prefix}_{tail}{index:04}").into();
    }
    if kind == "message" {
        let assistant = item["role"] == "assistant";
        let part = |text: &Value| {
            if assistant {
                json!({"type": "output_text", "text": text, "annotations": []})
            } else {
                json!({"type": "input_text", "text": text})
            }
        };
        if let Some(text) = item.get("content").filter(|c| c.is_string()).cloned() {
            item["content"] = json!([part(&text)]);
        }
    }
    if kind != "reasoning" && item.get("status").is_none() {
        item["status"] = "completed".into();
    }
    item
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(pairs: &[(&str, &str)]) -> Result<ItemsQuery, ApiError> {
        items_query(&pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect())
    }

    fn input() -> Vec<Value> {
        vec![
            json!({"type": "message", "role": "user", "content": "Weather in Paris?"}),
            json!({"type": "message", "id": "msg_given", "role": "assistant", "content": "Checking."}),
            json!({"type": "function_call", "call_id": "c1", "name": "weather", "arguments": "{}"}),
            json!({"type": "function_call_output", "call_id": "c1", "output": "18C"}),
        ]
    }

    #[test]
    fn items_are_listed_newest_first_with_ids_and_parts() {
        let page = input_items_page("resp_ab12", &input(), &query(&[]).unwrap());
        let ids: Vec<&str> = page["data"].as_array().unwrap().iter().map(|i| i["id"].as_str().unwrap()).collect();
        assert_eq!(ids, ["fco_ab120003", "fc_ab120002", "msg_given", "msg_ab120000"]);
        assert_eq!((page["first_id"].as_str(), page["last_id"].as_str()), (Some("fco_ab120003"), Some("msg_ab120000")));
        assert_eq!(page["has_more"], false);
        let user = &page["data"][3];
        assert_eq!(user["content"], json!([{"type": "input_text", "text": "Weather in Paris?"}]));
        assert_eq!(user["status"], "completed");
        assert_eq!(page["data"][2]["content"][0]["type"], "output_text");
    }

    #[test]
    fn pages_follow_limit_order_and_cursors() {
        let q = query(&[("limit", "2"), ("order", "asc")]).unwrap();
        let first = input_items_page("resp_x", &input(), &q);
        assert_eq!(first["data"].as_array().map(Vec::len), Some(2));
        assert_eq!(first["has_more"], true);
        let after = first["last_id"].as_str().unwrap().to_owned();
        let next = input_items_page("resp_x", &input(), &ItemsQuery { after: Some(after), ..q.clone() });
        assert_eq!(next["data"][0]["type"], "function_call");
        assert_eq!(next["has_more"], false);
        let before = input_items_page("resp_x", &input(), &ItemsQuery { before: Some("msg_given".into()), ..q });
        assert_eq!(before["data"].as_array().map(Vec::len), Some(1));
        let empty = input_items_page("resp_x", &[], &query(&[]).unwrap());
        assert_eq!((empty["data"].as_array().map(Vec::len), empty["first_id"].is_null()), (Some(0), true));
    }

    #[test]
    fn bad_bounds_are_400s_naming_them() {
        for (k, v) in [("limit", "0"), ("limit", "101"), ("limit", "x"), ("order", "up")] {
            assert_eq!(query(&[(k, v)]).unwrap_err().param.as_deref(), Some(k));
        }
        assert_eq!(query(&[("limit", "100"), ("include", "x")]).unwrap().limit, 100);
    }
}
