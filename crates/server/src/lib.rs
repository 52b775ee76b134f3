pub mod models;
pub mod app;
mod admin;
mod keyspec;
mod auth;
mod chat;
mod engine_errors;
mod images;
pub mod cli;
pub mod commands;
mod rate_limit;
mod request_id;
#[cfg(test)]
mod router_tests;
pub mod serve;
mod stream;
mod telemetry;
mod tool_calls;
