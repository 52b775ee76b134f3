//! The link argument the engine's build script asks of every binary that links it (see
//! crates/engine/build.rs): `--wrap` of llamafile's sgemm where ggml's CPU backend is static, its
//! export where the backend is loaded at run time.

fn main() {
    if let Ok(arg) = std::env::var("DEP_GANTRY_ENGINE_LINK_ARG") {
        println!("cargo::rustc-link-arg={arg}");
    }
}
