//! The link argument the engine's build script asks of every binary that links it (see
//! crates/engine/build.rs): `--wrap` of llamafile's sgemm where ggml's CPU backend is static.

fn main() {
    if let Ok(symbol) = std::env::var("DEP_GANTRY_ENGINE_WRAP") {
        println!("cargo::rustc-link-arg=-Wl,--wrap={symbol}");
    }
}
