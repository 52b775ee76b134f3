pub mod models;
pub mod app;
mod auth;
mod chat;
pub mod cli;
pub mod commands;
mod request_id;
pub mod serve;
mod stream;
