//! The K-quant copies end to end with the AVX2 kernels (`--cpu-kernels gantry-avx2`: what a CPU
//! without AVX-512 runs; `support` has the test).

mod support;

#[test]
fn with_avx2_an_engine_answers_from_its_copies_and_ggml_repacks_nothing() {
    support::an_engine_answers_from_its_copies(gantry_engine::CpuKernels::GantryAvx2, "gantry-avx2");
}
