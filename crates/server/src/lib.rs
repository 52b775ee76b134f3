pub mod models;
pub mod app;
mod admin;
mod admin_guard;
mod admin_models;
mod keyspec;
mod model_config;
pub mod pool;
mod auth;
mod auth_failures;
mod body_guard;
pub mod connections;
mod chat;
mod engine_errors;
mod health;
mod images;
pub mod cli;
pub mod commands;
pub mod prepare_gate;
mod rate_limit;
mod stats;
mod console;
mod request_id;
#[cfg(test)]
mod router_tests;
#[cfg(test)]
mod admission_tests;
#[cfg(test)]
mod console_tests;
#[cfg(test)]
mod admin_listener_tests;
#[cfg(test)]
mod connection_tests;
pub mod serve;
mod stream;
mod telemetry;
mod tool_calls;
