//! RotaryEmbedding (opset 23): rotary positional embeddings. Attribute defaults and shape
//! rules; the sizes every stage reads are parsed in `geometry.rs`, the kernels are in
//! `cpu.rs` and `vulkan.rs`.
//!
//! Canonical attributes are exactly what the kernels read: `interleaved` (0 or 1),
//! `rotary_embedding_dim` (explicit: the head size where the model leaves it 0) and
//! `num_heads` (explicit: the 4-D input's head count, or the attribute for a 3-D input).
//! Inputs: X, cos_cache, sin_cache and, when the model gives it, position_ids (int64).

pub(crate) mod cpu;
mod geometry;
#[cfg(feature = "wgsl")]
pub(crate) mod vulkan;

pub(crate) const FAMILY: Family = Family {
    ops: OPS,
    cpu: cpu::prepare,
    // Each output element reads its pair's partner too.
    in_place: never,
    #[cfg(feature = "wgsl")]
    vulkan: vulkan::lower,
};

use crate::Node;
use crate::TensorDesc;
use crate::lower::{LowerCx, OpResult, op_err};
use crate::registry::{Family, OpDef, never};
use geometry::Geometry;
use ingot_schema::{AttrValue, Attrs, DType};

pub const OPS: &[OpDef] = &[OpDef::new("RotaryEmbedding", lower, infer)];

fn lower(node: &mut Node, cx: &LowerCx) -> OpResult<()> {
    for (i, what) in ["X", "cos_cache", "sin_cache"].iter().enumerate() {
        if !cx.has_input(i) {
            return Err(op_err!("RotaryEmbedding needs its {what} input"));
        }
    }
    if node.inputs.len() > 4 {
        return Err(op_err!("RotaryEmbedding takes at most 4 inputs, got {}", node.inputs.len()));
    }
    if node.inputs.get(3).is_some_and(Option::is_none) {
        node.inputs.truncate(3);
    }
    let x = &cx.input(0)?.shape;
    let a = &node.attrs;
    // A 4-D X says its head count; the attribute is then not read (as in ONNX's reference).
    let (heads, head) = match x.as_slice() {
        [_, h, _, d] => (*h as i64, *d as i64),
        [_, _, hidden] => match a.int_or("num_heads", 0)? {
            n if n > 0 && *hidden as i64 % n == 0 => (n, *hidden as i64 / n),
            n => {
                return Err(op_err!(
                    "a 3-D X needs num_heads, a positive divisor of its hidden size {hidden}; \
                     got {n}"
                ));
            }
        },
        s => return Err(op_err!("X must be 3-D or 4-D, got shape {s:?}")),
    };
    let rot = match a.int_or("rotary_embedding_dim", 0)? {
        0 => head,
        r => r,
    };
    let interleaved = i64::from(a.int_or("interleaved", 0)? != 0);
    node.attrs = Attrs::new()
        .with("interleaved", AttrValue::Int(interleaved))
        .with("num_heads", AttrValue::Int(heads))
        .with("rotary_embedding_dim", AttrValue::Int(rot));
    Ok(())
}

/// Y like X, after checking every operand against X.
fn infer(node: &Node, inputs: &[&TensorDesc]) -> OpResult<Vec<TensorDesc>> {
    let shapes: Vec<&[usize]> = inputs.iter().map(|d| d.shape.as_slice()).collect();
    Geometry::new(&node.attrs, &shapes).map_err(|e| op_err!("{e}"))?;
    let x = inputs[0];
    for (name, cache) in ["cos_cache", "sin_cache"].iter().zip(&inputs[1..3]) {
        if cache.dtype != x.dtype {
            return Err(op_err!("{name} is {} but X is {}", cache.dtype, x.dtype));
        }
    }
    if let Some(ids) = inputs.get(3).filter(|d| d.dtype != DType::I64) {
        return Err(op_err!("position_ids must be int64, got {}", ids.dtype));
    }
    Ok(vec![x.clone()])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(n_in: usize, attrs: Attrs) -> Node {
        Node {
            name: "n".into(),
            op: "RotaryEmbedding".into(),
            domain: String::new(),
            inputs: (0..n_in).map(Some).collect(),
            outputs: vec![n_in],
            attrs,
        }
    }

    /// Lowers then infers, as the compiler's passes do (position_ids, the fourth, int64).
    fn run(n: &mut Node, inputs: &[&[usize]]) -> OpResult<Vec<TensorDesc>> {
        let descs: Vec<TensorDesc> = inputs
            .iter()
            .enumerate()
            .map(|(i, s)| TensorDesc::new(if i == 3 { DType::I64 } else { DType::F32 }, s.to_vec()))
            .collect();
        let cx = LowerCx {
            opset: 23,
            inputs: n.inputs.iter().map(|i| i.map(|i| &descs[i])).collect(),
            consts: vec![None; n.inputs.len()],
        };
        lower(n, &cx)?;
        let present: Vec<&TensorDesc> = n.present_inputs().map(|i| &descs[i]).collect();
        infer(n, &present)
    }

    fn canonical(interleaved: i64, heads: i64, rot: i64) -> Attrs {
        Attrs::new()
            .with("interleaved", AttrValue::Int(interleaved))
            .with("num_heads", AttrValue::Int(heads))
            .with("rotary_embedding_dim", AttrValue::Int(rot))
    }

    #[test]
    fn defaults_become_explicit() {
        // 4-D: the heads from X, the whole head rotates.
        let mut n = node(4, Attrs::new());
        let out = run(&mut n, &[&[2, 4, 3, 8], &[50, 4], &[50, 4], &[2, 3]]).unwrap();
        assert_eq!(out, [TensorDesc::new(DType::F32, vec![2, 4, 3, 8])]);
        assert_eq!(n.attrs, canonical(0, 4, 8));
        // 3-D: the heads from the attribute; an omitted position_ids is dropped.
        let a = Attrs::new()
            .with("num_heads", AttrValue::Int(4))
            .with("interleaved", AttrValue::Int(5))
            .with("rotary_embedding_dim", AttrValue::Int(4));
        let mut n = node(4, a);
        n.inputs[3] = None;
        run(&mut n, &[&[2, 3, 32], &[2, 3, 2], &[2, 3, 2]]).unwrap();
        assert_eq!(n.attrs, canonical(1, 4, 4));
        assert_eq!(n.inputs.len(), 3);
    }

    #[test]
    fn inconsistent_operands_are_refused() {
        let three_d = run(&mut node(3, Attrs::new()), &[&[2, 3, 32], &[2, 3, 4], &[2, 3, 4]]);
        assert!(three_d.unwrap_err().0.contains("num_heads"));
        let wide = node(3, Attrs::new().with("rotary_embedding_dim", AttrValue::Int(16)));
        let err = run(&mut wide.clone(), &[&[2, 4, 3, 8], &[2, 3, 8], &[2, 3, 8]]).unwrap_err();
        assert!(err.0.contains("rotary_embedding_dim 16"), "{err}");
        let err =
            run(&mut node(3, Attrs::new()), &[&[2, 4, 3, 8], &[2, 3, 3], &[2, 3, 4]]).unwrap_err();
        assert!(err.0.contains("cos_cache has shape [2, 3, 3]"), "{err}");
        let mut n = node(3, Attrs::new());
        n.inputs[1] = None;
        assert!(run(&mut n, &[&[2, 4, 3, 8], &[2, 3, 4], &[2, 3, 4]]).is_err());
    }
}
