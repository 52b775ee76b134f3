//! Gantry's x86 kernels for the dot product of one row of Q8_0, Q5_0 or Q4_0 weights with one row of
//! Q8_0 activations, and (AVX-512) of Q4_K, Q5_K, Q6_K and IQ4_XS weights with Q8_K activations, in
//! ggml's block layouts, and their products with a few rows of activations at once. `gantry-engine`
//! puts them in ggml's kernel table (its `model::dot_kernels` says why and how, and tests them
//! against ggml's own). A crate of their own so that they are compiled optimised in every profile
//! (the root `Cargo.toml`): at the debug profile's level intrinsics stay calls and the kernels run
//! slower than ggml's.
//! `x86::repack_q4_k_rows16` / `repack_q5_k_rows16` / `repack_q6_k_rows16` /
//! `repack_iq4_xs_rows16` and the `v4::gemm_` functions of the same names multiply Q4_K, Q5_K,
//! Q6_K and IQ4_XS weights in layouts of Gantry's own (16 rows to a register), the engine's
//! K-quant copies.

#[cfg(target_arch = "x86_64")]
pub mod x86;
