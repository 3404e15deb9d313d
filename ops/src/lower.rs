//! How an ONNX node becomes canonical (`lower`): what every family's `lower` may look at, and
//! the helpers they share.
//!
//! **Canonical form**, what a bundle's steps carry and kernels read:
//! - every attribute the kernel reads is explicit (ONNX defaults filled in here, for the
//!   model's opset), so the runtime never guesses a default;
//! - operands that must be constant for a static graph (Reshape's shape, Slice's starts,
//!   Pad's pads, axes of reductions, Resize's scales/sizes, Clip's bounds...) are read from
//!   their constant inputs into attributes and dropped from the inputs;
//! - no optional holes: every remaining input is present (a family may materialise a default
//!   operand as a constant, e.g. a zero bias).

use crate::TensorDesc;
use crate::cpu::KernelError;
use crate::node::Constant;
use ingot_schema::AttrError;

/// An op-level error; the pass that called the op adds the node's name and op type.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct OpError(pub String);

impl From<AttrError> for OpError {
    fn from(e: AttrError) -> Self {
        OpError(e.to_string())
    }
}
impl From<KernelError> for OpError {
    fn from(e: KernelError) -> Self {
        OpError(e.to_string())
    }
}

/// Shorthand for an `OpError` with a formatted message.
macro_rules! op_err {
    ($($arg:tt)*) => { $crate::lower::OpError(format!($($arg)*)) };
}
pub(crate) use op_err;

pub type OpResult<T> = Result<T, OpError>;

/// What lowering may look at: the opset and, per input, its type and constant value.
pub struct LowerCx<'a> {
    pub opset: i64,
    pub inputs: Vec<Option<&'a TensorDesc>>,
    pub consts: Vec<Option<&'a dyn Constant>>,
}

impl LowerCx<'_> {
    /// The type of input `i`; an error if it is absent.
    pub fn input(&self, i: usize) -> OpResult<&TensorDesc> {
        self.inputs.get(i).copied().flatten().ok_or_else(|| op_err!("input {i} is required"))
    }

    /// Whether input `i` is given (not omitted).
    pub fn has_input(&self, i: usize) -> bool {
        self.inputs.get(i).copied().flatten().is_some()
    }

    /// Input `i` as constant integers: `Ok(None)` if omitted, an error if not constant.
    pub fn const_ints(&self, i: usize, what: &str) -> OpResult<Option<Vec<i64>>> {
        if !self.has_input(i) {
            return Ok(None);
        }
        match self.consts.get(i).copied().flatten() {
            Some(c) => c
                .to_i64s()
                .map(Some)
                .ok_or_else(|| op_err!("{what} (input {i}) must hold integers")),
            None => Err(op_err!(
                "{what} (input {i}) must be a constant once shapes are static; it is computed at run time"
            )),
        }
    }

    /// Input `i` as constant floats: `Ok(None)` if omitted, an error if not constant.
    pub fn const_floats(&self, i: usize, what: &str) -> OpResult<Option<Vec<f64>>> {
        if !self.has_input(i) {
            return Ok(None);
        }
        match self.consts.get(i).copied().flatten() {
            Some(c) => {
                c.to_f64s().map(Some).ok_or_else(|| op_err!("{what} (input {i}) must hold numbers"))
            }
            None => Err(op_err!(
                "{what} (input {i}) must be a constant once shapes are static; it is computed at run time"
            )),
        }
    }
}

/// Normalises a possibly negative axis against `rank`.
pub fn normalize_axis(axis: i64, rank: usize) -> OpResult<usize> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    if (0..r.max(1)).contains(&a) || (r == 0 && a == 0) {
        Ok(a as usize)
    } else {
        Err(op_err!("axis {axis} is out of range for rank {rank}"))
    }
}

/// The product of `dims`, `None` if it overflows (dims come from models: never multiply them
/// unchecked).
pub fn checked_product(dims: &[usize]) -> Option<usize> {
    dims.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d))
}

/// The sum of `parts`, `None` if it overflows.
pub fn checked_sum(parts: &[usize]) -> Option<usize> {
    parts.iter().try_fold(0usize, |acc, &d| acc.checked_add(d))
}

/// Numpy-style broadcast of several shapes.
pub fn broadcast_shapes(shapes: &[&[usize]]) -> OpResult<Vec<usize>> {
    let rank = shapes.iter().map(|s| s.len()).max().unwrap_or(0);
    let mut out = vec![1usize; rank];
    for s in shapes {
        let off = rank - s.len();
        for (i, &d) in s.iter().enumerate() {
            let o = &mut out[off + i];
            if *o == 1 {
                *o = d;
            } else if d != 1 && d != *o {
                return Err(op_err!("shapes {shapes:?} do not broadcast"));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcasting_follows_numpy() {
        assert_eq!(broadcast_shapes(&[&[2, 1, 4], &[3, 1]]).unwrap(), vec![2, 3, 4]);
        assert_eq!(broadcast_shapes(&[&[], &[5]]).unwrap(), vec![5]);
        assert!(broadcast_shapes(&[&[2], &[3]]).is_err());
    }
}
