//! Data-dependent lengths, bounded. An op such as NonMaxSuppression, NonZero or Compress
//! fills a number of rows that only the run knows: its output is planned for the upper bound, and the op writes the
//! count it filled into an extra output. Everything downstream is computed on the bound too,
//! rows past the count included (their values are junk nobody reads), so every shape stays
//! static; the runtime hands the caller each such graph output cut to the count.
//!
//! That is sound only where the ops after it keep rows apart: output row `i` along the
//! bounded dim depends on input row `i` alone (elementwise ops, views, gathers by bounded
//! indices, concatenation along another dim, ...). [`outputs`] says, per op, where the
//! bounded dim of each output is, and refuses every other op with the reason: a reduction
//! over the rows, a Shape of them or a Reshape that mixes them would read the junk.

use crate::lower::{OpResult, op_err};
use crate::{Node, TensorDesc};

/// Where a bounded output's run-time length comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Length {
    /// The same count as input `k`'s.
    Input(usize),
    /// The op writes it: output `k`, an int64 scalar.
    Output(usize),
}

/// A tensor whose dim `axis` holds the bound, of which a run fills `length` rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounded {
    pub axis: usize,
    pub length: Length,
}

/// Which outputs of a canonical `node` are bounded, and along which dim, given which inputs
/// are (`bounded[k]`: input k's bounded dim). The caller checks that every bounded input
/// has the same count (one run-time length); an op that cannot keep the rows apart is an
/// error that says why.
pub fn outputs(
    node: &Node,
    inputs: &[&TensorDesc],
    bounded: &[Option<usize>],
    outputs: &[TensorDesc],
) -> OpResult<Vec<Option<Bounded>>> {
    let op = node.op.as_str();
    let first = bounded.iter().position(Option::is_some);
    let def = crate::lookup(op);
    if let Some(dim) = def.and_then(|d| d.def.bounded).and_then(|f| f(&node.attrs)) {
        if let Some(k) = first {
            return Err(refused(k, inputs, bounded, "it cannot read such rows"));
        }
        // Every output but the count, last.
        let count = outputs.len() - 1;
        let mut out = vec![Some(Bounded { axis: dim, length: Length::Output(count) }); count];
        out.push(None);
        return Ok(out);
    }
    let Some(k) = first else {
        return Ok(vec![None; outputs.len()]);
    };
    let axis = |a: usize| Ok(Some(Bounded { axis: a, length: Length::Input(k) }));
    let a = bounded[k].unwrap_or_default();
    let refuse = |why: &str| Err(refused(k, inputs, bounded, why));
    let attr_axis = || node.attrs.int("axis").map(|v| v as usize);
    let one = match op {
        "Identity" | "Dropout" | "Reshape" | "Flatten" | "Squeeze" | "Unsqueeze" => {
            match same_rows(&inputs[0].shape, a, &outputs[0].shape) {
                Some(b) => axis(b),
                None => refuse("the new shape merges or splits them"),
            }
        }
        "Transpose" => {
            let perm = node.attrs.ints("perm")?;
            match perm.iter().position(|&p| p as usize == a) {
                Some(b) => axis(b),
                None => refuse("its perm drops the dim"),
            }
        }
        "Slice" => {
            let (s, e, st) =
                (node.attrs.ints("starts")?, node.attrs.ints("ends")?, node.attrs.ints("steps")?);
            let whole = s.get(a) == Some(&0)
                && e.get(a) == Some(&(inputs[0].shape[a] as i64))
                && st.get(a) == Some(&1);
            if whole { axis(a) } else { refuse("it slices along the dim") }
        }
        "Concat" => {
            let along = attr_axis()?;
            if along == a || bounded.iter().any(|b| *b != Some(a)) {
                refuse("only inputs bounded alike can be joined, along another dim")
            } else {
                axis(a)
            }
        }
        "Gather" => {
            let along = attr_axis()?;
            match (bounded[0], bounded.get(1).copied().flatten()) {
                (Some(d), None) if d < along => axis(d),
                (Some(d), None) if d > along => axis(d + inputs[1].shape.len() - 1),
                (None, Some(j)) => axis(along + j),
                _ => refuse("it gathers along the dim"),
            }
        }
        "GatherElements" => match bounded {
            [None, Some(j)] => axis(*j),
            _ => refuse("only its indices may be bounded"),
        },
        "GatherND" => match bounded {
            [None, Some(j)]
                if node.attrs.int("batch_dims")? == 0 && *j + 1 < inputs[1].shape.len() =>
            {
                axis(*j)
            }
            _ => refuse("only its indices' leading dims may be bounded"),
        },
        "Split" | "TopK" | "ArgMax" | "ArgMin" | "Softmax" | "LogSoftmax" | "Hardmax" => {
            let along = attr_axis()?;
            let keeps = node.attrs.int_or("keepdims", 1)? == 1;
            // Softmax before opset 13 normalises over every dim from `axis` on.
            let over_rows = along == a || (node.attrs.int_or("coerce_2d", 0)? == 1 && a > along);
            match (over_rows, keeps || a < along) {
                (true, _) => refuse("it works along the dim"),
                (false, true) => axis(a),
                (false, false) => axis(a - 1),
            }
        }
        _ if op.starts_with("Reduce") => {
            let axes = node.attrs.ints("axes")?;
            let before = axes.iter().filter(|&&x| (x as usize) < a).count();
            // An empty list left by `noop_with_empty_axes` reduces nothing.
            if axes.contains(&(a as i64)) {
                refuse("it reduces over the dim")
            } else if node.attrs.int("keepdims")? == 1 {
                axis(a)
            } else {
                axis(a - before)
            }
        }
        // Rows of A times B: each output row is its row of A's.
        "MatMul" => {
            let rank = inputs[0].shape.len();
            match bounded {
                [Some(d), None] if rank >= 2 && *d == rank - 2 => axis(outputs[0].shape.len() - 2),
                _ => refuse("only A's rows may be bounded"),
            }
        }
        "Gemm" => {
            let c_has_rows = inputs.get(2).is_some_and(|c| c.shape.len() == 2 && c.shape[0] != 1);
            match bounded {
                [Some(0), None, ..]
                    if node.attrs.int("transA")? == 0
                        && !c_has_rows
                        && bounded.iter().skip(1).all(Option::is_none) =>
                {
                    axis(0)
                }
                _ => refuse("only A's rows may be bounded, with C one row or none"),
            }
        }
        "Shape" | "Size" => refuse("its value would be the bound, not the run's length"),
        _ if crate::elementwise::OPS.iter().any(|d| d.name == op) => {
            broadcast(inputs, bounded, &outputs[0].shape).map_or_else(refuse, axis)
        }
        _ => refuse("it may combine rows"),
    }?;
    // Every output of these ops has the dim where output 0 has it (Dropout's mask, TopK's
    // indices, each piece of a Split along another dim).
    Ok(vec![one; outputs.len()])
}

/// The dim of `to` that holds the same rows as dim `a` of `from`: the same length, after
/// dims of the same product (so every element keeps its place).
fn same_rows(from: &[usize], a: usize, to: &[usize]) -> Option<usize> {
    let before: usize = from[..a].iter().product();
    (0..to.len()).find(|&b| to[b] == from[a] && to[..b].iter().product::<usize>() == before)
}

/// The output dim that bounded inputs of an elementwise op broadcast to: every bounded input
/// lands on it with the whole length, every other input has length 1 there (or no such dim).
fn broadcast(
    inputs: &[&TensorDesc],
    bounded: &[Option<usize>],
    out: &[usize],
) -> Result<usize, &'static str> {
    let mut at = None;
    for (t, b) in inputs.iter().zip(bounded) {
        if let Some(a) = b {
            let d = out.len() - t.shape.len() + a;
            if at.is_some_and(|x| x != d) || t.shape[*a] != out[d] {
                return Err("its bounded inputs broadcast to different dims");
            }
            at = Some(d);
        }
    }
    let d = at.ok_or("no input is bounded")?;
    for (t, b) in inputs.iter().zip(bounded) {
        let lead = out.len() - t.shape.len();
        if b.is_none() && d >= lead && t.shape[d - lead] != 1 {
            return Err("another input has rows of its own along the dim");
        }
    }
    Ok(d)
}

fn refused(
    k: usize,
    inputs: &[&TensorDesc],
    bounded: &[Option<usize>],
    why: &str,
) -> crate::lower::OpError {
    let a = bounded[k].unwrap_or_default();
    op_err!(
        "input {k} has a data-dependent length along dim {a} (at most {}, known only at run \
         time), and this op cannot run on such rows: {why}",
        inputs[k].shape.get(a).copied().unwrap_or_default()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use ingot_schema::{AttrValue, Attrs, DType};

    fn node(op: &str, attrs: Attrs) -> Node {
        Node {
            name: "n".into(),
            op: op.into(),
            domain: String::new(),
            inputs: vec![Some(0), Some(1)],
            outputs: vec![2],
            attrs,
        }
    }

    fn desc(shape: &[usize]) -> TensorDesc {
        TensorDesc::new(DType::F32, shape)
    }

    /// The bounded dim of output 0, or the error.
    fn axis(
        op: &str,
        attrs: Attrs,
        ins: &[&[usize]],
        b: &[Option<usize>],
        out: &[usize],
    ) -> Result<Option<usize>, String> {
        let ins: Vec<TensorDesc> = ins.iter().map(|s| desc(s)).collect();
        let refs: Vec<&TensorDesc> = ins.iter().collect();
        outputs(&node(op, attrs), &refs, b, &[desc(out)])
            .map(|o| o[0].map(|x| x.axis))
            .map_err(|e| e.0)
    }

    #[test]
    fn row_preserving_ops_carry_the_dim() {
        let ax = |v: i64| Attrs::new().with("axis", AttrValue::Int(v));
        // A column of NMS' [K, 3] rows, then the boxes it picks, then those joined.
        assert_eq!(axis("Gather", ax(1), &[&[9, 3], &[]], &[Some(0), None], &[9]), Ok(Some(0)));
        assert_eq!(
            axis("Gather", ax(0), &[&[100, 4], &[9]], &[None, Some(0)], &[9, 4]),
            Ok(Some(0))
        );
        assert_eq!(
            axis("Gather", ax(1), &[&[1, 100, 4], &[9]], &[None, Some(0)], &[1, 9, 4]),
            Ok(Some(1))
        );
        assert_eq!(
            axis("Concat", ax(1), &[&[9, 4], &[9, 1]], &[Some(0), Some(0)], &[9, 5]),
            Ok(Some(0))
        );
        assert_eq!(axis("Unsqueeze", Attrs::new(), &[&[9]], &[Some(0)], &[1, 9, 1]), Ok(Some(1)));
        assert_eq!(
            axis("Reshape", Attrs::new(), &[&[1, 9, 4]], &[Some(1)], &[9, 2, 2]),
            Ok(Some(0))
        );
        let perm = Attrs::new().with("perm", AttrValue::Ints(vec![1, 0]));
        assert_eq!(axis("Transpose", perm, &[&[9, 4]], &[Some(0)], &[4, 9]), Ok(Some(1)));
        // Elementwise: a per-column scale broadcasts along the rows.
        assert_eq!(
            axis("Mul", Attrs::new(), &[&[9, 4], &[4]], &[Some(0), None], &[9, 4]),
            Ok(Some(0))
        );
        assert_eq!(axis("Cast", Attrs::new(), &[&[9, 3]], &[Some(0)], &[9, 3]), Ok(Some(0)));
        assert_eq!(axis("Relu", Attrs::new(), &[&[2, 2]], &[None], &[2, 2]), Ok(None));
        // Along other dims: the best class of each row, a softmax over the classes, a sum.
        let arg = ax(1).with("keepdims", AttrValue::Int(0));
        assert_eq!(axis("ArgMax", arg, &[&[9, 4]], &[Some(0)], &[9]), Ok(Some(0)));
        assert_eq!(axis("Softmax", ax(1), &[&[9, 4]], &[Some(0)], &[9, 4]), Ok(Some(0)));
        let sum = |keep: i64| {
            Attrs::new()
                .with("axes", AttrValue::Ints(vec![0]))
                .with("keepdims", AttrValue::Int(keep))
        };
        assert_eq!(axis("ReduceSum", sum(0), &[&[2, 9, 4]], &[Some(1)], &[9, 4]), Ok(Some(0)));
        assert_eq!(axis("ReduceSum", sum(1), &[&[2, 9, 4]], &[Some(1)], &[1, 9, 4]), Ok(Some(1)));
        // Boxes times a transform.
        assert_eq!(
            axis("MatMul", Attrs::new(), &[&[9, 4], &[4, 4]], &[Some(0), None], &[9, 4]),
            Ok(Some(0))
        );
    }

    #[test]
    fn ops_that_mix_rows_are_refused_with_the_reason() {
        let ax = |v: i64| Attrs::new().with("axis", AttrValue::Int(v));
        let err = |r: Result<Option<usize>, String>| r.unwrap_err();
        let sum =
            Attrs::new().with("axes", AttrValue::Ints(vec![0])).with("keepdims", AttrValue::Int(1));
        assert!(
            err(axis("ReduceSum", sum, &[&[9, 4]], &[Some(0)], &[1, 4])).contains("reduces over")
        );
        assert!(
            err(axis("Softmax", ax(0), &[&[9, 4]], &[Some(0)], &[9, 4])).contains("along the dim")
        );
        assert!(
            err(axis("MatMul", Attrs::new(), &[&[4, 9], &[9, 4]], &[Some(1), None], &[4, 4]))
                .contains("A's rows")
        );
        assert!(
            err(axis("Conv", Attrs::new(), &[&[9, 4]], &[Some(0)], &[1, 4]))
                .contains("may combine rows")
        );
        assert!(
            err(axis("Reshape", Attrs::new(), &[&[9, 4]], &[Some(0)], &[36]))
                .contains("merges or splits")
        );
        assert!(
            err(axis("Concat", ax(0), &[&[9, 4], &[9, 4]], &[Some(0), Some(0)], &[18, 4]))
                .contains("joined")
        );
        assert!(
            err(axis("Gather", ax(0), &[&[9, 4], &[]], &[Some(0), None], &[4]))
                .contains("gathers along")
        );
        assert!(
            err(axis("Add", Attrs::new(), &[&[9, 4], &[9, 4]], &[Some(0), None], &[9, 4]))
                .contains("rows of its own")
        );
        let slice = Attrs::new()
            .with("starts", AttrValue::Ints(vec![1, 0]))
            .with("ends", AttrValue::Ints(vec![9, 4]))
            .with("steps", AttrValue::Ints(vec![1, 1]));
        let e = err(axis("Slice", slice, &[&[9, 4]], &[Some(0)], &[8, 4]));
        assert!(e.contains("input 0 has a data-dependent length along dim 0 (at most 9"), "{e}");
    }
}
