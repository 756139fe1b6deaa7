//! The PyTorch binding (its own issue fills this crate).
