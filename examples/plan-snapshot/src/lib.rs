//! This crate only holds a test: see `tests/plan.rs` and the README.
