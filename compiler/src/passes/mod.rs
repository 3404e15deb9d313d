//! Graph passes, one per file, each `pub fn run(&mut Graph) -> Result<(), PassError>`.
//! [`PIPELINE`] is the order they run in; the IR is checked after each one in debug builds.

use crate::ir::{self, Graph};

mod bounded;
mod channel_scales;
pub(crate) mod contrib;
mod control;
mod dce;
mod dequantize;
mod dequantize_in_gemm;
mod dynamic_slices;
mod fuse;
mod half_weights;
mod integer_products;
mod legacy;
mod lower;
mod norm_chains;
mod outputs;
mod patterns;
mod round_trips;
pub(crate) mod sequences;
#[cfg(test)]
mod testing;
mod widen_f16;

#[derive(Debug, thiserror::Error)]
pub enum PassError {
    /// An op-level problem at one node: names the node and its op type.
    #[error("{node}: {message}")]
    Node { node: String, message: String },
    #[error("{0}")]
    Graph(String),
}

pub type Pass = fn(&mut Graph) -> Result<(), PassError>;

/// The passes in order, with the names errors and timings use.
pub const PIPELINE: &[(&str, Pass)] = &[
    ("lower", lower::run),
    ("dce", dce::run),
    ("dequantize", dequantize::run),
    ("round_trips", round_trips::run),
    ("integer_products", integer_products::run),
    ("norm_chains", norm_chains::run),
    ("dequantize_in_conv", dequantize_in_gemm::convs),
    ("fuse", fuse::run),
    ("channel_scales", channel_scales::run),
    ("dequantize_in_gemm", dequantize_in_gemm::products),
    ("half_weights", half_weights::run),
    ("widen_f16", widen_f16::run),
    ("outputs", outputs::run),
    ("bounded", bounded::run),
];

/// Runs every pass of [`PIPELINE`] on `g`.
pub fn run_all(g: &mut Graph) -> Result<(), PassError> {
    for (name, pass) in PIPELINE {
        pass(g)?;
        if cfg!(debug_assertions) {
            ir::check(g)
                .map_err(|e| PassError::Graph(format!("IR broken after pass {name}: {e}")))?;
        }
    }
    Ok(())
}
