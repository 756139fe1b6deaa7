//! E-graph rewrites over traces (the fusion issue fills this crate).
