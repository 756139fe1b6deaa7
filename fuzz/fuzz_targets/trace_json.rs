//! Loading trace JSON from untrusted bytes: an error or a valid trace, never a
//! panic. `cargo fuzz run trace_json` from this folder; the seed corpus in
//! `corpus/trace_json/` is replayed by the regular test suite.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(trace) = trace_ir::Trace::from_json(text) {
            assert!(trace.validate().is_ok());
            let again =
                trace_ir::Trace::from_json(&trace.to_json()).expect("a loaded trace reloads");
            assert_eq!(again.to_json(), trace.to_json());
        }
    }
});
