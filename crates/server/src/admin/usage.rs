//! `/admin/v1/usage` and `/admin/v1/usage/requests`: the usage ledger, grouped or per request,
//! as JSON or CSV (the same CSV `gantry usage --format csv` prints).

use axum::extract::{Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use gantry_accounts::{RequestRow, UsageQuery, UsageRow};
use gantry_api::ApiError;
use serde::Deserialize;
use serde_json::json;

use crate::admin::keyspec::parse_time;
use crate::errors::IntoApiError;
use crate::state::AppState;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct UsageParams {
    pub key_name: Option<String>,
    pub tenant: Option<String>,
    pub model: Option<String>,
    /// RFC 3339 time or a date.
    pub since: Option<String>,
    pub until: Option<String>,
    /// Only the lines of this batch (`batch_…`).
    pub batch_id: Option<String>,
    /// `day` adds one row per UTC day.
    pub group_by: Option<String>,
    /// `json` (default) or `csv`.
    pub format: Option<String>,
}

impl UsageParams {
    pub(crate) fn to_query(&self) -> Result<UsageQuery, String> {
        let by_day = match self.group_by.as_deref() {
            None | Some("") | Some("key") => false,
            Some("day") => true,
            Some(other) => return Err(format!("group_by must be `day`, not {other:?}")),
        };
        Ok(UsageQuery {
            key_name: self.key_name.clone(),
            tenant: self.tenant.clone(),
            model: self.model.clone(),
            since_ms: self.since.as_deref().map(parse_time).transpose()?.map(|s| s * 1000),
            until_ms: self.until.as_deref().map(parse_time).transpose()?.map(|s| s * 1000),
            batch_id: self.batch_id.clone(),
            by_day,
        })
    }
}

pub(super) async fn usage(
    State(state): State<AppState>,
    params: Result<Query<UsageParams>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(params) = params.map_err(|e| ApiError::invalid_request(e.body_text(), None))?;
    let query = params.to_query().map_err(|m| ApiError::invalid_request(m, None))?;
    let rows = state.accounts.usage_report(&query).await.map_err(IntoApiError::into_api_error)?;
    match params.format.as_deref() {
        None | Some("json") => Ok(Json(json!({"object": "list", "data": rows})).into_response()),
        Some("csv") => Ok(([(header::CONTENT_TYPE, "text/csv; charset=utf-8")], usage_csv(&rows)).into_response()),
        Some(other) => {
            Err(ApiError::invalid_request(format!("format must be `json` or `csv`, not {other:?}"), Some("format")))
        }
    }
}

/// One row per request: `GET /admin/v1/usage/requests` with the filters of `/usage`.
pub(super) async fn usage_requests(
    State(state): State<AppState>,
    params: Result<Query<UsageParams>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(params) = params.map_err(|e| ApiError::invalid_request(e.body_text(), None))?;
    if params.group_by.is_some() {
        return Err(ApiError::invalid_request("group_by does not apply to the per-request listing", Some("group_by")));
    }
    let query = params.to_query().map_err(|m| ApiError::invalid_request(m, None))?;
    let rows = state.accounts.usage_requests(&query).await.map_err(IntoApiError::into_api_error)?;
    match params.format.as_deref() {
        None | Some("json") => Ok(Json(json!({"object": "list", "data": rows})).into_response()),
        Some("csv") => Ok(([(header::CONTENT_TYPE, "text/csv; charset=utf-8")], requests_csv(&rows)).into_response()),
        Some(other) => {
            Err(ApiError::invalid_request(format!("format must be `json` or `csv`, not {other:?}"), Some("format")))
        }
    }
}

/// CSV of the per-request listing; the same text `gantry usage --requests --format csv` prints.
pub(crate) fn requests_csv(rows: &[RequestRow]) -> String {
    let mut out = String::from(
        "request_id,client_request_id,key_name,tenant,model,prompt_tokens,cached_tokens,completion_tokens,reasoning_tokens,cost,outcome,started_at_ms,finished_at_ms,service_tier,batch_id\n",
    );
    for r in rows {
        out.push_str(&format!(
            "{},{},{},{},{},{},{},{},{},{:.9},{},{},{},{},{}\n",
            r.request_id,
            r.client_request_id.as_deref().unwrap_or(""),
            csv_field(&r.key_name),
            csv_field(&r.tenant),
            csv_field(&r.model),
            r.prompt_tokens,
            r.cached_tokens,
            r.completion_tokens,
            r.reasoning_tokens,
            r.cost,
            r.outcome,
            r.started_at_ms,
            r.finished_at_ms,
            csv_field(&r.service_tier),
            r.batch_id.as_deref().map(csv_field).unwrap_or_default()
        ));
    }
    out
}

/// CSV with a header row; the same text `gantry usage --format csv` prints.
pub(crate) fn usage_csv(rows: &[UsageRow]) -> String {
    let mut out = String::from(
        "key_name,tenant,model,day,requests,prompt_tokens,cached_tokens,completion_tokens,reasoning_tokens,cost,key_id,service_tier,batch_id\n",
    );
    for r in rows {
        out.push_str(&format!(
            "{},{},{},{},{},{},{},{},{},{:.9},{},{},{}\n",
            csv_field(&r.key_name),
            csv_field(&r.tenant),
            csv_field(&r.model),
            r.day.as_deref().unwrap_or(""),
            r.requests,
            r.prompt_tokens,
            r.cached_tokens,
            r.completion_tokens,
            r.reasoning_tokens,
            r.cost,
            r.key_id,
            csv_field(&r.service_tier),
            r.batch_id.as_deref().map(csv_field).unwrap_or_default()
        ));
    }
    out
}

pub(crate) fn csv_field(s: &str) -> String {
    // Names and tenants are anyone's text: one a spreadsheet would read as a formula (`=`, `+`,
    // `-`, `@`, tab, CR first) is written as text (OWASP's CSV injection advice).
    let neutral;
    let s = if s.starts_with(['=', '+', '-', '@', '\t', '\r']) {
        neutral = format!("'{s}");
        neutral.as_str()
    } else {
        s
    };
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasoning_tokens_come_right_after_completion_tokens() {
        let row = UsageRow {
            key_id: 1,
            key_name: "k".into(),
            tenant: "t".into(),
            model: "m".into(),
            day: Some("2026-01-02".into()),
            service_tier: "flex".into(),
            batch_id: None,
            requests: 1,
            prompt_tokens: 10,
            cached_tokens: 2,
            completion_tokens: 12,
            reasoning_tokens: 7,
            cost: 0.5,
        };
        assert_eq!(
            usage_csv(std::slice::from_ref(&row)),
            "key_name,tenant,model,day,requests,prompt_tokens,cached_tokens,completion_tokens,reasoning_tokens,cost,key_id,\
             service_tier,batch_id\n\
             k,t,m,2026-01-02,1,10,2,12,7,0.500000000,1,flex,\n"
        );
        let line = UsageRow { service_tier: "batch".into(), batch_id: Some("batch_1".into()), ..row.clone() };
        assert!(usage_csv(&[line]).ends_with(",0.500000000,1,batch,batch_1\n"));
        // A name a spreadsheet would run as a formula is written as text.
        let hostile = UsageRow { key_name: "=HYPERLINK(\"x\")".into(), tenant: "+cmd".into(), ..row.clone() };
        let line = usage_csv(std::slice::from_ref(&hostile)).lines().nth(1).unwrap().to_string();
        assert!(line.starts_with("\"'=HYPERLINK(\"\"x\"\")\",'+cmd,m,"), "{line}");
        let keys: Vec<String> = serde_json::to_value(&row).unwrap().as_object().unwrap().keys().cloned().collect();
        let at = keys.iter().position(|k| k == "completion_tokens").unwrap();
        assert_eq!(keys[at + 1], "reasoning_tokens", "{keys:?}");

        let request = RequestRow {
            request_id: "r".into(),
            client_request_id: None,
            key_name: "k".into(),
            tenant: "t".into(),
            model: "m".into(),
            prompt_tokens: 10,
            cached_tokens: 2,
            completion_tokens: 12,
            reasoning_tokens: 7,
            cost: 0.5,
            outcome: "completed".into(),
            started_at_ms: 1,
            finished_at_ms: 2,
            service_tier: "priority".into(),
            batch_id: None,
        };
        assert_eq!(
            requests_csv(std::slice::from_ref(&request)),
            "request_id,client_request_id,key_name,tenant,model,prompt_tokens,cached_tokens,completion_tokens,\
             reasoning_tokens,cost,outcome,started_at_ms,finished_at_ms,service_tier,batch_id\n\
             r,,k,t,m,10,2,12,7,0.500000000,completed,1,2,priority,\n"
        );
        let line = RequestRow { service_tier: "batch".into(), batch_id: Some("batch_1".into()), ..request.clone() };
        assert!(requests_csv(&[line]).ends_with(",completed,1,2,batch,batch_1\n"));
        let keys: Vec<String> = serde_json::to_value(&request).unwrap().as_object().unwrap().keys().cloned().collect();
        let at = keys.iter().position(|k| k == "completion_tokens").unwrap();
        assert_eq!(keys[at + 1], "reasoning_tokens", "{keys:?}");
    }
}
