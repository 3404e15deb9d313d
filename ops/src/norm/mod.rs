//! Normalizations: BatchNormalization (inference only), InstanceNormalization,
//! GroupNormalization, LayerNormalization, RMSNormalization, LRN and
//! MeanVarianceNormalization. Attribute defaults and shape rules; the kernels are in
//! `ops/src/norm/cpu.rs`.
//!
//! Canonical attributes are exactly what the kernels read: `epsilon`; Layer and
//! RMSNormalization's `axis` (non-negative); GroupNormalization's `num_groups`; LRN's `size`,
//! `alpha`, `beta`, `bias`; MeanVarianceNormalization's `axes` (non-negative, sorted).
//! Attributes that do not change inference results (`momentum`, `stash_type`: the kernels
//! take float32 and keep statistics in float32 or better) are dropped.

pub(crate) mod cpu;
#[cfg(feature = "wgsl")]
pub(crate) mod vulkan;

pub(crate) const FAMILY: Family = Family {
    ops: OPS,
    cpu: cpu::prepare,
    in_place: never,
    #[cfg(feature = "wgsl")]
    vulkan: vulkan::lower,
};

use crate::Node;
use crate::TensorDesc;
use crate::lower::{LowerCx, OpResult, normalize_axis, op_err};
use crate::registry::{Family, OpDef, never};
use ingot_schema::{AttrValue, Attrs, DType};

pub const OPS: &[OpDef] = &[
    OpDef::new("BatchNormalization", lower_batch_norm, per_channel),
    OpDef::new("InstanceNormalization", lower_epsilon, per_channel),
    OpDef::new("GroupNormalization", lower_group_norm, infer_group_norm),
    OpDef::new("LayerNormalization", lower_layer_norm, infer_layer_norm),
    OpDef::new("RMSNormalization", lower_rms_norm, infer_layer_norm),
    OpDef::new("LRN", lower_lrn, infer_same),
    OpDef::new("MeanVarianceNormalization", lower_mvn, infer_same),
];

fn epsilon(node: &Node) -> OpResult<AttrValue> {
    Ok(AttrValue::Float(f64::from(node.attrs.float_or("epsilon", 1e-5)?)))
}

fn lower_epsilon(node: &mut Node, _cx: &LowerCx) -> OpResult<()> {
    node.attrs = Attrs::new().with("epsilon", epsilon(node)?);
    Ok(())
}

fn lower_batch_norm(node: &mut Node, cx: &LowerCx) -> OpResult<()> {
    // Opset 14 made training an attribute; before, training was asked for by the optional
    // running-statistics outputs. Either way Ingot only runs inference.
    if cx.opset >= 14 && node.attrs.int_or("training_mode", 0)? != 0 {
        return Err(op_err!(
            "BatchNormalization with training_mode=1 is not supported: Ingot runs inference only"
        ));
    }
    // Before opset 7 an attribute chose: training unless `is_test` is set.
    if cx.opset < 7 && node.attrs.int_or("is_test", 0)? == 0 {
        return Err(op_err!(
            "BatchNormalization with is_test=0 (training, before opset 7) is not supported: \
             Ingot runs inference only"
        ));
    }
    if node.outputs.len() > 1 {
        return Err(op_err!(
            "BatchNormalization with {} outputs (training statistics) is not supported: \
             Ingot runs inference only",
            node.outputs.len()
        ));
    }
    lower_epsilon(node, cx)
}

/// X's (N, C) for ops that read N x C x D1 x ...
fn n_c(x: &TensorDesc) -> OpResult<(usize, usize)> {
    match x.shape.as_slice() {
        [n, c, ..] => Ok((*n, *c)),
        s => Err(op_err!("the input needs rank 2 or more (N x C x ...), got {s:?}")),
    }
}

fn infer_same(_node: &Node, inputs: &[&TensorDesc]) -> OpResult<Vec<TensorDesc>> {
    let x = inputs.first().ok_or_else(|| op_err!("X is required"))?;
    Ok(vec![(*x).clone()])
}

/// Y like X; every other input holds one value per channel.
fn per_channel(node: &Node, inputs: &[&TensorDesc]) -> OpResult<Vec<TensorDesc>> {
    params(node, inputs, &[n_c(inputs.first().ok_or_else(|| op_err!("X is required"))?)?.1])
}

/// Y like X, after checking that every input but X has one of the `allowed` lengths.
fn params(node: &Node, inputs: &[&TensorDesc], allowed: &[usize]) -> OpResult<Vec<TensorDesc>> {
    for (i, p) in inputs.iter().enumerate().skip(1) {
        if !allowed.contains(&p.elements()) || p.shape.len() > 1 {
            return Err(op_err!(
                "{} input {i} has shape {:?}, expected [{}]",
                node.op,
                p.shape,
                allowed.iter().map(|a| a.to_string()).collect::<Vec<_>>().join("] or [")
            ));
        }
    }
    infer_same(node, inputs)
}

fn lower_group_norm(node: &mut Node, _cx: &LowerCx) -> OpResult<()> {
    node.attrs = Attrs::new()
        .with("epsilon", epsilon(node)?)
        .with("num_groups", AttrValue::Int(node.attrs.int("num_groups")?));
    Ok(())
}

/// Opset 18 gives scale and bias per group, opset 21 per channel. The kernel tells the two
/// apart by their length (they coincide when groups equal channels), so both opsets share
/// one canonical form.
fn infer_group_norm(node: &Node, inputs: &[&TensorDesc]) -> OpResult<Vec<TensorDesc>> {
    let x = inputs.first().ok_or_else(|| op_err!("X is required"))?;
    let c = n_c(x)?.1;
    let g = node.attrs.int("num_groups")?;
    let g = usize::try_from(g)
        .ok()
        .filter(|&g| g > 0 && c % g == 0)
        .ok_or_else(|| op_err!("num_groups {g} does not divide the {c} channels"))?;
    params(node, inputs, &[g, c])
}

fn lower_layer_norm(node: &mut Node, cx: &LowerCx) -> OpResult<()> {
    lower_axis_norm(node, cx)?;
    if node.inputs.get(2).is_some_and(Option::is_none) {
        node.inputs.truncate(2);
    }
    Ok(())
}

/// RMSNormalization (opset 23) is LayerNormalization without the mean and the bias: the
/// same canonical `axis` and `epsilon`, inputs X and scale, Y alone.
fn lower_rms_norm(node: &mut Node, cx: &LowerCx) -> OpResult<()> {
    if node.inputs.len() != 2 || node.outputs.len() != 1 {
        return Err(op_err!(
            "RMSNormalization takes X and scale and gives Y, got {} inputs and {} outputs",
            node.inputs.len(),
            node.outputs.len()
        ));
    }
    lower_axis_norm(node, cx)
}

/// Layer and RMSNormalization's canonical attributes; both need their scale.
fn lower_axis_norm(node: &mut Node, cx: &LowerCx) -> OpResult<()> {
    let rank = cx.input(0)?.shape.len();
    if !cx.has_input(1) {
        return Err(op_err!("{} needs its scale input", node.op));
    }
    let axis = normalize_axis(node.attrs.int_or("axis", -1)?, rank)?;
    node.attrs =
        Attrs::new().with("axis", AttrValue::Int(axis as i64)).with("epsilon", epsilon(node)?);
    Ok(())
}

/// Y like X (Layer and RMSNormalization); LayerNormalization's optional Mean and InvStdDev
/// keep X's leading dimensions up to `axis` and are 1 from there (float32: the kernels
/// compute the statistics in float).
fn infer_layer_norm(node: &Node, inputs: &[&TensorDesc]) -> OpResult<Vec<TensorDesc>> {
    let x = inputs.first().ok_or_else(|| op_err!("X is required"))?;
    let axis = usize::try_from(node.attrs.int("axis")?)
        .ok()
        .filter(|&a| a < x.shape.len())
        .ok_or_else(|| op_err!("axis is out of range for rank {}", x.shape.len()))?;
    let normalized = &x.shape[axis..];
    for (p, name) in inputs[1..].iter().zip(["scale", "B"]) {
        let fits = p.shape.len() <= normalized.len()
            && p.shape.iter().rev().zip(normalized.iter().rev()).all(|(&d, &n)| d == 1 || d == n);
        if !fits {
            return Err(op_err!(
                "{} {name} of shape {:?} does not broadcast to the normalized shape \
                 {normalized:?}",
                node.op,
                p.shape
            ));
        }
    }
    let mut stats_shape = x.shape[..axis].to_vec();
    stats_shape.resize(x.shape.len(), 1);
    let stats = TensorDesc::new(DType::F32, stats_shape);
    let mut out = vec![(*x).clone()];
    out.extend(std::iter::repeat_n(stats, node.outputs.len().clamp(1, 3) - 1));
    Ok(out)
}

fn lower_lrn(node: &mut Node, _cx: &LowerCx) -> OpResult<()> {
    let a = &node.attrs;
    let size = a.int("size")?;
    if size < 1 {
        return Err(op_err!("LRN size must be positive, got {size}"));
    }
    node.attrs = Attrs::new()
        .with("size", AttrValue::Int(size))
        .with("alpha", AttrValue::Float(f64::from(a.float_or("alpha", 1e-4)?)))
        .with("beta", AttrValue::Float(f64::from(a.float_or("beta", 0.75)?)))
        .with("bias", AttrValue::Float(f64::from(a.float_or("bias", 1.0)?)));
    Ok(())
}

fn lower_mvn(node: &mut Node, cx: &LowerCx) -> OpResult<()> {
    let rank = cx.input(0)?.shape.len();
    let axes = node.attrs.ints_opt("axes")?.unwrap_or(&[0, 2, 3]);
    let mut axes: Vec<i64> =
        axes.iter().map(|&a| normalize_axis(a, rank).map(|a| a as i64)).collect::<OpResult<_>>()?;
    axes.sort_unstable();
    axes.dedup();
    node.attrs = Attrs::new().with("axes", AttrValue::Ints(axes));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(op: &str, n_in: usize, n_out: usize, attrs: Attrs) -> Node {
        Node {
            name: "n".into(),
            op: op.into(),
            domain: String::new(),
            inputs: (0..n_in).map(Some).collect(),
            outputs: (n_in..n_in + n_out).collect(),
            attrs,
        }
    }

    /// Lowers then infers, as the compiler's passes do.
    fn run(n: &mut Node, opset: i64, inputs: &[&[usize]]) -> OpResult<Vec<TensorDesc>> {
        let descs: Vec<TensorDesc> =
            inputs.iter().map(|s| TensorDesc::new(DType::F32, s.to_vec())).collect();
        let cx = LowerCx {
            opset,
            inputs: n.inputs.iter().map(|i| i.map(|i| &descs[i])).collect(),
            consts: vec![None; n.inputs.len()],
        };
        let def = OPS.iter().find(|d| d.name == n.op).unwrap();
        (def.lower)(n, &cx)?;
        let present: Vec<&TensorDesc> = n.present_inputs().map(|i| &descs[i]).collect();
        (def.infer)(n, &present)
    }

    #[test]
    fn batch_norm_is_inference_only() {
        let x: &[usize] = &[2, 3, 4, 4];
        let mut n =
            node("BatchNormalization", 5, 1, Attrs::new().with("momentum", AttrValue::Float(0.9)));
        let out = run(&mut n, 15, &[x, &[3], &[3], &[3], &[3]]).unwrap();
        assert_eq!(out[0].shape, x);
        assert_eq!(n.attrs, Attrs::new().with("epsilon", AttrValue::Float(f64::from(1e-5f32))));
        let mut training =
            node("BatchNormalization", 5, 1, Attrs::new().with("training_mode", AttrValue::Int(1)));
        let err = run(&mut training, 15, &[x, &[3], &[3], &[3], &[3]]).unwrap_err();
        assert!(err.0.contains("training_mode"), "{err}");
        assert!(
            run(
                &mut node("BatchNormalization", 5, 3, Attrs::new()),
                9,
                &[x, &[3], &[3], &[3], &[3]]
            )
            .is_err()
        );
        assert!(
            run(
                &mut node("BatchNormalization", 5, 1, Attrs::new()),
                15,
                &[x, &[4], &[3], &[3], &[3]]
            )
            .is_err()
        );
    }

    #[test]
    fn layer_norm_outputs_and_defaults() {
        let mut n = node("LayerNormalization", 3, 3, Attrs::new());
        n.inputs[2] = None;
        let out = run(&mut n, 17, &[&[2, 5, 8], &[8]]).unwrap();
        assert_eq!(n.inputs.len(), 2);
        assert_eq!(n.attrs.int("axis"), Ok(2));
        assert_eq!(
            out.iter().map(|d| d.shape.clone()).collect::<Vec<_>>(),
            [vec![2, 5, 8], vec![2, 5, 1], vec![2, 5, 1]]
        );
        let mut n = node("LayerNormalization", 2, 1, Attrs::new().with("axis", AttrValue::Int(-2)));
        assert_eq!(run(&mut n, 17, &[&[2, 5, 8], &[5, 8]]).unwrap().len(), 1);
        let mut bad = node("LayerNormalization", 2, 1, Attrs::new());
        assert!(run(&mut bad, 17, &[&[2, 5, 8], &[5]]).is_err());
    }

    #[test]
    fn rms_norm_is_layer_norm_without_bias_or_statistics() {
        let mut n =
            node("RMSNormalization", 2, 1, Attrs::new().with("stash_type", AttrValue::Int(1)));
        let out = run(&mut n, 23, &[&[2, 5, 8], &[8]]).unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].shape, [2, 5, 8]);
        assert_eq!(
            n.attrs,
            Attrs::new()
                .with("axis", AttrValue::Int(2))
                .with("epsilon", AttrValue::Float(f64::from(1e-5f32)))
        );
        let mut n = node("RMSNormalization", 2, 1, Attrs::new().with("axis", AttrValue::Int(-2)));
        assert_eq!(run(&mut n, 23, &[&[2, 5, 8], &[5, 1]]).unwrap().len(), 1);
        let mut bad = node("RMSNormalization", 2, 1, Attrs::new().with("axis", AttrValue::Int(1)));
        let err = run(&mut bad, 23, &[&[2, 5, 8], &[8, 8]]).unwrap_err();
        assert!(err.0.contains("RMSNormalization scale of shape [8, 8]"), "{err}");
        let mut three = node("RMSNormalization", 3, 1, Attrs::new());
        assert!(run(&mut three, 23, &[&[2, 5, 8], &[8], &[8]]).is_err());
        let mut stats = node("RMSNormalization", 2, 2, Attrs::new());
        assert!(run(&mut stats, 23, &[&[2, 5, 8], &[8]]).is_err());
    }

    #[test]
    fn group_norm_accepts_both_opsets_parameters() {
        let attrs = Attrs::new().with("num_groups", AttrValue::Int(2));
        let x: &[usize] = &[1, 4, 3, 3];
        assert!(
            run(&mut node("GroupNormalization", 3, 1, attrs.clone()), 21, &[x, &[4], &[4]]).is_ok()
        );
        assert!(
            run(&mut node("GroupNormalization", 3, 1, attrs.clone()), 18, &[x, &[2], &[2]]).is_ok()
        );
        assert!(run(&mut node("GroupNormalization", 3, 1, attrs), 21, &[x, &[3], &[3]]).is_err());
        let three = Attrs::new().with("num_groups", AttrValue::Int(3));
        assert!(run(&mut node("GroupNormalization", 3, 1, three), 21, &[x, &[4], &[4]]).is_err());
    }

    #[test]
    fn lrn_and_mvn_defaults() {
        let mut n = node("LRN", 1, 1, Attrs::new().with("size", AttrValue::Int(3)));
        run(&mut n, 13, &[&[1, 4, 2, 2]]).unwrap();
        assert_eq!(n.attrs.float("alpha"), Ok(1e-4));
        assert_eq!(n.attrs.float("beta"), Ok(0.75));
        assert_eq!(n.attrs.float("bias"), Ok(1.0));
        assert!(run(&mut node("LRN", 1, 1, Attrs::new()), 13, &[&[1, 4, 2, 2]]).is_err());
        let mut n = node("MeanVarianceNormalization", 1, 1, Attrs::new());
        run(&mut n, 13, &[&[1, 4, 2, 2]]).unwrap();
        assert_eq!(n.attrs.ints("axes").unwrap(), [0, 2, 3]);
        let mut n = node(
            "MeanVarianceNormalization",
            1,
            1,
            Attrs::new().with("axes", AttrValue::Ints(vec![-1, 1, 3])),
        );
        run(&mut n, 13, &[&[1, 4, 2, 2]]).unwrap();
        assert_eq!(n.attrs.ints("axes").unwrap(), [1, 3]);
    }
}
