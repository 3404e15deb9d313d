//! Dequantize late: a `DequantizeLinear` of a constant table that only a `Gather` reads (an
//! embedding lookup) moves after the Gather, so that each run dequantizes the rows it takes
//! instead of the whole table, and the table stays int8 in the bundle (the `lower` pass leaves
//! such a DequantizeLinear unfolded: `ingot_ops::keeps_constant_narrow`).
//!
//! `Gather(DequantizeLinear(x, scale, zero), ids)` becomes `DequantizeLinear(Gather(x, ids),
//! scale', zero')`: with one scale for the table, or one per index of an axis the Gather does
//! not take, the same scales (that axis renumbered); with one scale per row of a 2-D table
//! gathered by rows, the rows' scales gathered too, as a column ([ids..., 1]: blocks as long as
//! a row).

use super::PassError;
use crate::ir::{Const, Graph, Node, ValueId};
use ingot_ops::{Tensor, TensorDesc};
use ingot_schema::{AttrValue, Attrs};

pub fn run(g: &mut Graph) -> Result<(), PassError> {
    let uses = g.use_counts();
    let producers = g.producers();
    let mut i = 0;
    while i < g.nodes.len() {
        let Some(nodes) = rewrite(g, i, &uses, &producers) else {
            i += 1;
            continue;
        };
        let n = nodes.len();
        g.nodes.splice(i..=i, nodes);
        i += n;
    }
    // The moved DequantizeLinears are read by nobody now.
    super::dce::run(g)
}

/// The nodes that replace the Gather at `at`, if it reads a table to dequantize late.
fn rewrite(
    g: &mut Graph,
    at: usize,
    uses: &[usize],
    producers: &[Option<usize>],
) -> Option<Vec<Node>> {
    let gather = &g.nodes[at];
    if gather.op != "Gather" {
        return None;
    }
    let (table, ids) = match gather.inputs[..] {
        [Some(table), Some(ids)] => (table, ids),
        _ => return None,
    };
    let dq = &g.nodes[producers[table]?];
    if dq.op != "DequantizeLinear" || uses[table] != 1 || g.outputs.contains(&table) {
        return None;
    }
    let operands: Vec<ValueId> = dq.inputs.iter().copied().collect::<Option<_>>()?;
    if operands.iter().any(|&v| g.constant(v).is_none()) || dq.attrs.int("block_size").ok()? != 0 {
        return None;
    }
    let (x, scale) = (g.ty(operands[0])?.clone(), g.ty(operands[1])?.clone());
    let ids_ty = g.ty(ids)?.clone();
    let gather_axis = usize::try_from(gather.attrs.int("axis").ok()?).ok()?;
    let dq_axis = usize::try_from(dq.attrs.int("axis").ok()?).ok()?;
    let (to, out) = (dq.attrs.int("to").ok()?, gather.outputs[0]);
    let rows_shape = |shape: &[usize], axis: usize| -> Vec<usize> {
        [&shape[..axis], &ids_ty.shape[..], &shape[axis + 1..]].concat()
    };
    let gathered_rank = x.shape.len() - 1 + ids_ty.shape.len();
    let per_tensor = scale.elements() == 1;
    // The DequantizeLinear's axis and block size after the Gather, and whether its scales
    // (and zero points) must be gathered too.
    let (axis, block, gather_scales) = if per_tensor {
        (0, 0, false)
    } else if dq_axis != gather_axis {
        let axis = if dq_axis < gather_axis { dq_axis } else { dq_axis - 1 + ids_ty.shape.len() };
        (axis, 0, false)
    } else if gather_axis == 0 && x.shape.len() == 2 {
        (gathered_rank - 1, x.shape[1], true)
    } else {
        return None;
    };

    let name = |g: &Graph, v: ValueId, what: &str| format!("{}.{what}", g.values[v].name);
    let mut nodes = Vec::new();
    // Gathers `data` along `axis` by the ids into a new value.
    let mut add_gather = |g: &mut Graph, data: ValueId, axis: usize, what: &str| -> ValueId {
        let desc = g.ty(data).expect("constants are typed").clone();
        let v = g.add_value(
            name(g, data, what),
            Some(TensorDesc::new(desc.dtype, rows_shape(&desc.shape, axis))),
        );
        g.inherit(out, v);
        nodes.push(Node {
            name: name(g, out, what),
            op: "Gather".into(),
            domain: String::new(),
            inputs: vec![Some(data), Some(ids)],
            outputs: vec![v],
            attrs: Attrs::new().with("axis", AttrValue::Int(axis as i64)),
        });
        v
    };
    let rows = add_gather(g, operands[0], gather_axis, "rows");
    let mut dq_inputs = vec![Some(rows)];
    for &v in &operands[1..] {
        if !gather_scales {
            dq_inputs.push(Some(v));
            continue;
        }
        // One value per row, as a column: [rows, 1].
        let c = g.constant(v)?;
        let column =
            Tensor::from_bytes(TensorDesc::new(c.desc().dtype, [x.shape[0], 1]), c.bytes()).ok()?;
        let column = g.add_constant(name(g, v, "column"), Const::owned(column));
        dq_inputs.push(Some(add_gather(g, column, 0, "rows")));
    }
    nodes.push(Node {
        name: name(g, out, "dequantize"),
        op: "DequantizeLinear".into(),
        domain: String::new(),
        inputs: dq_inputs,
        outputs: vec![out],
        attrs: Attrs::new()
            .with("axis", AttrValue::Int(axis as i64))
            .with("block_size", AttrValue::Int(block as i64))
            .with("to", AttrValue::Int(to)),
    });
    Some(nodes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir;
    use crate::passes::{lower, testing::evaluate};
    use ingot_schema::DType;

    /// `Gather(DequantizeLinear(table, scale, zero, axis), ids, gather_axis)` over an int8
    /// table of `shape`, lowered; `scales` values per index of `axis` (1: per tensor).
    fn lookup(shape: &[usize], axis: i64, scales: usize, gather_axis: i64) -> Graph {
        let mut g = Graph { opset: 17, ..Default::default() };
        let n: usize = shape.iter().product();
        let table: Vec<i8> = (0..n).map(|i| (i * 37 % 251) as i8).collect();
        let table = g
            .add_constant("table", Const::owned(Tensor::from_vec(shape.to_vec(), &table).unwrap()));
        let s: Vec<f32> = (0..scales).map(|i| 0.5 + i as f32 / 8.0).collect();
        let z: Vec<i8> = (0..scales).map(|i| i as i8 - 3).collect();
        let dims = if scales == 1 { vec![] } else { vec![scales] };
        let scale =
            g.add_constant("scale", Const::owned(Tensor::from_vec(dims.clone(), &s).unwrap()));
        let zero = g.add_constant("zero", Const::owned(Tensor::from_vec(dims, &z).unwrap()));
        let ids = g.add_value("ids", Some(TensorDesc::new(DType::I64, [2, 3])));
        g.inputs.push(ids);
        let (real, out) = (g.add_value("real", None), g.add_value("out", None));
        let node = |op: &str, inputs: Vec<ValueId>, output, attrs| Node {
            name: op.into(),
            op: op.into(),
            domain: String::new(),
            inputs: inputs.into_iter().map(Some).collect(),
            outputs: vec![output],
            attrs,
        };
        g.nodes = vec![
            node(
                "DequantizeLinear",
                vec![table, scale, zero],
                real,
                Attrs::new().with("axis", AttrValue::Int(axis)),
            ),
            node(
                "Gather",
                vec![real, ids],
                out,
                Attrs::new().with("axis", AttrValue::Int(gather_axis)),
            ),
        ];
        g.outputs = vec![out];
        lower::run(&mut g).unwrap();
        g
    }

    /// Moves the dequantization, checks the ops left and that the outputs are the same bits.
    fn moved(g: &Graph, ops: &[&str]) {
        let mut m = g.clone();
        run(&mut m).unwrap();
        ir::check(&m).unwrap();
        let left: Vec<&str> = m.nodes.iter().map(|n| n.op.as_str()).collect();
        assert_eq!(left, ops);
        let ids = Tensor::from_vec(vec![2, 3], &[3i64, 0, 1, 1, 2, 0]).unwrap();
        let (got, want) = (evaluate(&m, std::slice::from_ref(&ids)), evaluate(g, &[ids]));
        assert_eq!(got[0].desc(), want[0].desc());
        assert_eq!(got[0].bytes(), want[0].bytes());
    }

    #[test]
    fn lookups_dequantize_the_rows_they_take() {
        // The table (2048 values, a weight) stays int8: its DequantizeLinear was not folded.
        assert_eq!(lookup(&[64, 32], 0, 64, 0).nodes[0].op, "DequantizeLinear");
        // One scale per row, gathered by rows: the scales are gathered as a column too.
        moved(&lookup(&[64, 32], 0, 64, 0), &["Gather", "Gather", "Gather", "DequantizeLinear"]);
        // One scale for the table.
        moved(&lookup(&[64, 32], 1, 1, 0), &["Gather", "DequantizeLinear"]);
        // One scale per column, rows gathered: the axis moves past the ids' two dims.
        moved(&lookup(&[64, 32], 1, 32, 0), &["Gather", "DequantizeLinear"]);
        // Columns gathered of a table quantized per row: the axis stays.
        moved(&lookup(&[32, 64], 0, 32, 1), &["Gather", "DequantizeLinear"]);
    }

    #[test]
    fn other_layouts_stay_as_they_are() {
        // Per row of a 3-D table: its scales would vary along two dims of the rows.
        moved(&lookup(&[16, 8, 16], 0, 16, 0), &["DequantizeLinear", "Gather"]);
    }
}
