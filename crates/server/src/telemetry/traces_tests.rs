//! The pure parts of trace export: which environment turns it on and how, and the attributes a
//! request's spans carry.

use std::collections::HashMap;

use axum::http::StatusCode;
use gantry_api::ApiError;
use gantry_engine::Usage;
use opentelemetry::{KeyValue, Value};

use super::{config_from, response_attributes, usage_attributes, Encoding, TraceConfig};

fn config(vars: &[(&str, &str)]) -> Result<Option<TraceConfig>, String> {
    let vars: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    config_from(|name| vars.get(name).cloned())
}

fn value(attributes: &[KeyValue], key: &str) -> Option<Value> {
    attributes.iter().find(|kv| kv.key.as_str() == key).map(|kv| kv.value.clone())
}

#[test]
fn tracing_is_off_unless_an_endpoint_or_the_otlp_exporter_is_named() {
    assert_eq!(config(&[]), Ok(None));
    assert_eq!(config(&[("OTEL_SERVICE_NAME", "x"), ("OTEL_EXPORTER_OTLP_ENDPOINT", "")]), Ok(None));
    let on = Ok(Some(TraceConfig { service_name: "gantry".into(), encoding: Encoding::Protobuf }));
    assert_eq!(config(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")]), on);
    assert_eq!(config(&[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://c:4318/v1/traces")]), on);
    assert_eq!(config(&[("OTEL_TRACES_EXPORTER", "otlp")]), on);
}

#[test]
fn disabling_wins_over_an_endpoint() {
    let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318");
    assert_eq!(config(&[endpoint, ("OTEL_SDK_DISABLED", "TRUE")]), Ok(None));
    assert_eq!(config(&[endpoint, ("OTEL_TRACES_EXPORTER", "none")]), Ok(None));
    // Only `true` disables (the specification's boolean): anything else leaves it on.
    assert!(config(&[endpoint, ("OTEL_SDK_DISABLED", "false")]).unwrap().is_some());
}

#[test]
fn service_name_and_protocol_come_from_the_standard_variables() {
    let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318");
    let got = config(&[endpoint, ("OTEL_SERVICE_NAME", "gantry-eu"), ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")]);
    assert_eq!(got, Ok(Some(TraceConfig { service_name: "gantry-eu".into(), encoding: Encoding::Json })));
    // The traces-only variable wins over the general one.
    let got = config(&[
        endpoint,
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf"),
    ]);
    assert_eq!(got.unwrap().unwrap().encoding, Encoding::Protobuf);
}

#[test]
fn what_cannot_be_exported_is_refused_not_ignored() {
    let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317");
    assert!(config(&[endpoint, ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")]).unwrap_err().contains("grpc"));
    assert!(config(&[("OTEL_TRACES_EXPORTER", "otlp,zipkin")]).unwrap_err().contains("zipkin"));
}

#[test]
fn usage_becomes_the_token_count_attributes() {
    let usage =
        Usage { prompt_tokens: 30, cached_tokens: 16, completion_tokens: 7, reasoning_tokens: 2, ..Usage::default() };
    let attributes = usage_attributes(&usage);
    assert_eq!(value(&attributes, "gen_ai.usage.input_tokens"), Some(Value::I64(30)));
    assert_eq!(value(&attributes, "gen_ai.usage.output_tokens"), Some(Value::I64(7)));
    assert_eq!(value(&attributes, "gen_ai.usage.cache_read.input_tokens"), Some(Value::I64(16)));
    assert_eq!(value(&attributes, "gantry.usage.reasoning_tokens"), Some(Value::I64(2)));
}

#[test]
fn a_refusal_names_its_error_type_but_only_a_server_error_fails_the_span() {
    let (attributes, failed) = response_attributes(StatusCode::OK, None);
    assert_eq!(value(&attributes, "http.response.status_code"), Some(Value::I64(200)));
    assert_eq!((value(&attributes, "error.type"), failed), (None, None));

    let refused = ApiError::invalid_request("secret prompt text", None);
    let (attributes, failed) = response_attributes(StatusCode::BAD_REQUEST, Some(&refused));
    assert_eq!(value(&attributes, "error.type"), Some(Value::from("invalid_request_error")));
    assert_eq!(failed, None);
    assert!(!format!("{attributes:?}").contains("secret prompt text"), "an error's message is never recorded");

    let (attributes, _) = response_attributes(StatusCode::TOO_MANY_REQUESTS, Some(&ApiError::rate_limited("x")));
    assert_eq!(value(&attributes, "error.type"), Some(Value::from("rate_limit_exceeded")));

    let (attributes, failed) = response_attributes(StatusCode::BAD_GATEWAY, None);
    assert_eq!(value(&attributes, "error.type"), Some(Value::from("502")));
    assert_eq!(failed.as_deref(), Some("502"));
}
