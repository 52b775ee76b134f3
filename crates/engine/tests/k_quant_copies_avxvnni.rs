//! The K-quant copies end to end with the AVX2 kernels that take AVX-VNNI (`--cpu-kernels
//! gantry-avxvnni`: what Intel's client cores run; `support` has the test).

mod support;

#[test]
fn with_avx_vnni_an_engine_answers_from_its_copies_and_ggml_repacks_nothing() {
    if !std::arch::is_x86_feature_detected!("avxvnni") {
        eprintln!("SKIPPED: this CPU has no AVX-VNNI (Zen 4 has none; Intel's Xeons from Sapphire Rapids on do)");
        return;
    }
    support::an_engine_answers_from_its_copies(gantry_engine::CpuKernels::GantryAvxVnni, "gantry-avxvnni");
}
