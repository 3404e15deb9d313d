//! (in progress)
#[derive(Debug)]
pub struct Bundle;
#[derive(Debug, thiserror::Error)]
#[error("bundle")]
pub struct BundleError;
