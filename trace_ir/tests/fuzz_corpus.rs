//! Replays the seed corpus of the `trace_json` fuzz target, so every input the
//! fuzzer was seeded with (or found and we kept) is checked on every test run.

use std::path::Path;

#[test]
fn trace_json_corpus_never_panics() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/trace_json");
    let mut count = 0;
    let mut valid = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let bytes = std::fs::read(entry.unwrap().path()).unwrap();
        let text = String::from_utf8_lossy(&bytes);
        if let Ok(trace) = trace_ir::Trace::from_json(&text) {
            trace.validate().unwrap();
            valid += 1;
        }
        count += 1;
    }
    assert!(count >= 5, "corpus at {} has {count} files", dir.display());
    assert!(valid >= 1, "the corpus should hold at least one valid trace");
}
