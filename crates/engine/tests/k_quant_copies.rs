//! The K-quant copies end to end with the AVX-512 kernels (`support` has the test).

mod support;

#[test]
fn an_engine_makes_its_copies_at_start_answers_from_them_and_drops_them_with_its_model() {
    if !(std::arch::is_x86_feature_detected!("avx512vnni") && std::arch::is_x86_feature_detected!("avx512bw")) {
        eprintln!("SKIPPED: this CPU has no AVX-512 VNNI (the AVX2 level's test runs here)");
        return;
    }
    support::an_engine_answers_from_its_copies(gantry_engine::CpuKernels::Gantry, "gantry-avx512");
}
