mod admin;
mod admin_guard;
#[cfg(test)]
mod admin_listener_tests;
mod admin_models;
#[cfg(test)]
mod admission_tests;
mod auth;
mod auth_failures;
mod body_guard;
mod chat;
pub mod cli;
mod clock;
pub mod commands;
#[cfg(test)]
mod connection_tests;
pub mod connections;
mod console;
#[cfg(test)]
mod console_tests;
mod convert;
mod engine_errors;
mod health;
mod images;
mod keyspec;
mod model_config;
mod model_routes;
pub mod models;
pub mod pool;
pub mod prepare_gate;
mod rate_limit;
mod request_id;
pub mod router;
#[cfg(test)]
mod router_tests;
pub mod serve;
pub mod state;
mod stats;
mod stream;
mod telemetry;
mod tool_calls;
