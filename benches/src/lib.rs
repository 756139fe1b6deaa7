//! Benchmarks of deferfuse live in `benches/` (criterion) and `src/bin/` (the comparison runner).
