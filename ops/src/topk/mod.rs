//! TopK (opsets 1, 10, 11 to 24): the K largest or smallest elements along one axis, with
//! their indices. Lowering reads a constant K into an attribute and checks it against the
//! shape; a K computed at run time makes the outputs bounded (`crate::bounded`): planned for
//! the whole dim, the run fills K. The kernel is in `cpu.rs`.
//!
//! Canonical form (what `cpu.rs` reads):
//! - inputs: X, and K (one int64) only where it is computed at run time (a constant K is read
//!   into `k` and dropped).
//! - attributes: `k` (0 to X's dim along the axis; absent for a run-time K), `axis`
//!   (nonnegative), `largest` and `sorted` (0 or 1; opsets before 11 have neither, and mean 1
//!   for both).
//! - outputs: Values (X's type) and Indices (int64), both X's shape with the axis' dim k (the
//!   whole dim for a run-time K, entries past K zero); for a run-time K then the count, K.

pub(crate) mod cpu;

pub(crate) const FAMILY: Family = Family {
    ops: OPS,
    cpu: cpu::prepare,
    // Every output element reads a whole lane of X.
    in_place: never,
    #[cfg(feature = "wgsl")]
    vulkan: no_vulkan,
};

use crate::Node;
use crate::TensorDesc;
use crate::lower::{LowerCx, OpResult, normalize_axis, op_err};
#[cfg(feature = "wgsl")]
use crate::registry::no_vulkan;
use crate::registry::{Family, OpDef, never};
use ingot_schema::{AttrValue, Attrs, DType};

pub const OPS: &[OpDef] = &[OpDef::new("TopK", lower, infer)
    .bounded(|a| (!a.contains("k")).then(|| a.int("axis").map_or(0, |v| v as usize)))
    .cpu_only(
        "TopK has no Vulkan kernel yet: its steps run on the CPU, as a submodel of their own",
    )];

fn lower(node: &mut Node, cx: &LowerCx) -> OpResult<()> {
    let shape = &cx.input(0)?.shape;
    let a = &node.attrs;
    let k = if cx.opset < 10 {
        if node.inputs.len() > 1 {
            return Err(op_err!(
                "TopK takes one input at opset {}; K is the k attribute",
                cx.opset
            ));
        }
        Some(a.int("k")?)
    } else {
        if node.inputs.len() > 2 {
            return Err(op_err!("TopK takes two inputs, X and K, got {}", node.inputs.len()));
        }
        if !cx.has_input(1) {
            return Err(op_err!("TopK needs its K input (input 1) at opset {}", cx.opset));
        }
        let desc = cx.input(1)?;
        if desc.dtype != DType::I64 || desc.elements() != 1 {
            return Err(op_err!("K must be one int64, got {} {:?}", desc.dtype, desc.shape));
        }
        match cx.consts.get(1).copied().flatten() {
            Some(c) => match c.to_i64s().as_deref() {
                Some(&[k]) => Some(k),
                _ => return Err(op_err!("K must be one int64")),
            },
            // Computed at run time: planned for the whole dim, the run fills K.
            None => None,
        }
    };
    let (largest, sorted) = if cx.opset < 11 {
        if let Some(name) = ["largest", "sorted"].into_iter().find(|n| a.contains(n)) {
            return Err(op_err!("TopK has no {name} attribute before opset 11"));
        }
        (1, 1)
    } else {
        (i64::from(a.int_or("largest", 1)? != 0), i64::from(a.int_or("sorted", 1)? != 0))
    };
    if shape.is_empty() {
        return Err(op_err!("TopK needs an input of rank 1 or more, got a scalar"));
    }
    let axis = normalize_axis(a.int_or("axis", -1)?, shape.len())?;
    node.attrs = Attrs::new()
        .with("axis", AttrValue::Int(axis as i64))
        .with("largest", AttrValue::Int(largest))
        .with("sorted", AttrValue::Int(sorted));
    if let Some(k) = k {
        check_k(k, shape[axis], axis)?;
        node.attrs.set("k", AttrValue::Int(k));
        node.inputs.truncate(1);
    }
    Ok(())
}

/// K is 0 to the dim it selects from.
fn check_k(k: i64, dim: usize, axis: usize) -> OpResult<()> {
    if k < 0 || k as u64 > dim as u64 {
        return Err(op_err!("K must be 0 to {dim} (the input's dim along axis {axis}), got {k}"));
    }
    Ok(())
}

/// The shape both outputs have: X's with the axis' dim `k` (kept whole for a run-time K);
/// checks the canonical attributes.
pub(crate) fn output_shape(attrs: &Attrs, x: &[usize]) -> OpResult<Vec<usize>> {
    let axis = attrs.int("axis")?;
    let axis = usize::try_from(axis)
        .ok()
        .filter(|&a| a < x.len())
        .ok_or_else(|| op_err!("axis {axis} is out of range for an input of shape {x:?}"))?;
    let mut shape = x.to_vec();
    if attrs.contains("k") {
        let k = attrs.int("k")?;
        check_k(k, x[axis], axis)?;
        shape[axis] = k as usize;
    }
    Ok(shape)
}

/// Values (X's type) and Indices (int64).
fn infer(node: &Node, inputs: &[&TensorDesc]) -> OpResult<Vec<TensorDesc>> {
    let runtime_k = !node.attrs.contains("k");
    let x = match inputs {
        [x] if !runtime_k => x,
        [x, _] if runtime_k => x,
        _ => {
            return Err(op_err!(
                "TopK takes {} inputs once lowered, got {}",
                1 + runtime_k as usize,
                inputs.len()
            ));
        }
    };
    if x.dtype == DType::Bool {
        return Err(op_err!("TopK takes a numeric input, got bool"));
    }
    let shape = output_shape(&node.attrs, &x.shape)?;
    let mut out = vec![TensorDesc::new(x.dtype, shape.clone()), TensorDesc::new(DType::I64, shape)];
    if runtime_k {
        out.push(TensorDesc::new(DType::I64, []));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Tensor;
    use crate::node::Constant;
    use std::sync::Arc;

    fn node(inputs: usize, attrs: Attrs) -> Node {
        Node {
            name: "top".into(),
            op: "TopK".into(),
            domain: String::new(),
            inputs: (0..inputs).map(Some).collect(),
            outputs: vec![10, 11],
            attrs,
        }
    }

    /// Lowers then infers, as the compiler's passes do; `k` is K's constant value, `None`
    /// for a K computed at run time.
    fn run(n: &mut Node, opset: i64, x: &[usize], k: Option<&Tensor>) -> OpResult<Vec<TensorDesc>> {
        let descs = [TensorDesc::new(DType::F32, x.to_vec()), TensorDesc::new(DType::I64, [1])];
        let k = k.map(|k| Arc::new(k.clone()));
        let cx = LowerCx {
            opset,
            inputs: n.inputs.iter().map(|i| i.map(|i| &descs[i])).collect(),
            consts: vec![None, k.as_ref().map(|k| k as &dyn Constant)],
        };
        lower(n, &cx)?;
        let present: Vec<&TensorDesc> = n.present_inputs().map(|i| &descs[i]).collect();
        infer(n, &present)
    }

    fn k(v: i64) -> Tensor {
        Tensor::from_vec(vec![1], &[v]).unwrap()
    }

    #[test]
    fn k_becomes_an_attribute() {
        let mut n = node(2, Attrs::new().with("axis", AttrValue::Int(-2)));
        let out = run(&mut n, 11, &[3, 4, 5], Some(&k(2))).unwrap();
        assert_eq!(out[0], TensorDesc::new(DType::F32, [3, 2, 5]));
        assert_eq!(out[1], TensorDesc::new(DType::I64, [3, 2, 5]));
        assert_eq!(n.inputs, [Some(0)]);
        let a = &n.attrs;
        assert_eq!(
            [a.int("k"), a.int("axis"), a.int("largest"), a.int("sorted")].map(Result::unwrap),
            [2, 1, 1, 1]
        );
        // Opset 1: K is the attribute; the last axis by default.
        let mut n = node(1, Attrs::new().with("k", AttrValue::Int(5)));
        let out = run(&mut n, 1, &[3, 4, 5], None).unwrap();
        assert_eq!(out[1].shape, [3, 4, 5]);
        assert_eq!(n.attrs.int("axis").unwrap(), 2);
    }

    #[test]
    fn k_computed_at_run_time_keeps_the_whole_dim_and_counts_it() {
        let mut n = node(2, Attrs::new());
        n.outputs.push(12); // the count, which the compiler appends
        let out = run(&mut n, 11, &[3, 4], None).unwrap();
        assert_eq!(n.inputs, [Some(0), Some(1)]);
        assert!(!n.attrs.contains("k"));
        assert_eq!(out[0], TensorDesc::new(DType::F32, [3, 4]));
        assert_eq!(out[2], TensorDesc::new(DType::I64, []));
    }

    #[test]
    fn k_outside_the_dim_is_refused() {
        for bad in [-1, 5] {
            let err = run(&mut node(2, Attrs::new()), 10, &[3, 4], Some(&k(bad))).unwrap_err();
            assert!(err.0.contains("K must be 0 to 4"), "{err}");
        }
        let two = Tensor::from_vec(vec![2], &[1i64, 2]).unwrap();
        let err = run(&mut node(2, Attrs::new()), 10, &[3, 4], Some(&two)).unwrap_err();
        assert!(err.0.contains("K must be one int64"), "{err}");
        let axis = Attrs::new().with("axis", AttrValue::Int(2));
        let err = run(&mut node(2, axis), 10, &[3, 4], Some(&k(1))).unwrap_err();
        assert!(err.0.contains("axis 2 is out of range"), "{err}");
        let late = Attrs::new().with("k", AttrValue::Int(1)).with("largest", AttrValue::Int(0));
        let err = run(&mut node(1, late), 1, &[3, 4], None).unwrap_err();
        assert!(err.0.contains("before opset 11"), "{err}");
    }
}
