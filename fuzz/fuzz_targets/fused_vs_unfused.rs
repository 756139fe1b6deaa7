//! A random trace (built from the fuzzer's bytes by the shared generator)
//! runs fused and unfused; the results must agree within the written
//! tolerance. `cargo fuzz run fused_vs_unfused` from this folder; the seed
//! corpus in `corpus/fused_vs_unfused/` is replayed by the regular tests.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(msg) = deferfuse::differential::check_generated(data) {
        panic!("fused and unfused disagree: {msg}");
    }
});
