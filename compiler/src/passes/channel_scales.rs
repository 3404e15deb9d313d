//! Channel scales into the next conv: `Conv(X * S)` with S one factor per image and channel
//! (`[N, C, 1, 1]`) becomes one Conv that scales X's channels as it reads them (`ingot_ops`'
//! conv family, `scale_x`), where the product has no other reader and the conv is one that
//! takes scales (`ingot_ops::can_scale_x`: 1x1, stride 1, unpadded, one group).
//!
//! That is the end of every squeeze-and-excitation block (MobileNetV3, EfficientNet, PP-OCR's
//! direction classifier): the block's gate multiplies the features, and a pointwise
//! conv projects them. As two steps, the product is a whole tensor written and read again,
//! and one more dispatch on Vulkan, where PP-OCR cls's nine such products took 12% of its
//! device time on lavapipe (`ingot bench --devices vulkan:cpu --profile`). As one, the CPU
//! scales the weights instead (M x C products per image) and the Vulkan kernels each X value
//! as they load it.
//!
//! Runs after `fuse`, so that the conv already holds its post-ops, whose operands the scales
//! go before.

use super::PassError;
use crate::ir::{Const, Graph, Node, ValueId};
use ingot_ops::{Tensor, TensorDesc};
use ingot_schema::{AttrValue, DType};

pub fn run(g: &mut Graph) -> Result<(), PassError> {
    let producers = g.producers();
    let uses = g.use_counts();
    let mut rewrites = Vec::new();
    for (c, conv) in g.nodes.iter().enumerate() {
        let (Some(&Some(product)), Some(&Some(w))) = (conv.inputs.first(), conv.inputs.get(1))
        else {
            continue;
        };
        let eligible = conv.op == "Conv"
            && !ingot_ops::scales_x(&conv.attrs)
            && g.ty(w).is_some_and(|w| ingot_ops::can_scale_x(&conv.attrs, w))
            && uses[product] == 1;
        let Some(m) = producers[product].filter(|_| eligible) else {
            continue;
        };
        if let Some((x, s)) = factors(g, &g.nodes[m], product) {
            rewrites.push((c, x, s));
        }
    }
    for (c, x, s) in rewrites {
        let conv = &g.nodes[c];
        // The scales go after B, which the conv then needs (zeros where it has none), and
        // before the post-ops' operands, which need B too.
        let bias = match conv.inputs.get(2) {
            Some(&b) => b,
            None => {
                let y = conv.outputs[0];
                let m = g.ty(y).and_then(|t| t.shape.get(1).copied()).unwrap_or(0);
                let zeros = Tensor::zeros(TensorDesc::new(DType::F32, vec![m]));
                let name = format!("{}:bias", g.values[y].name);
                Some(g.add_constant(name, Const::owned(zeros)))
            }
        };
        let conv = &mut g.nodes[c];
        let operands = conv.inputs.get(3..).unwrap_or_default().to_vec();
        conv.inputs =
            [Some(x), conv.inputs[1], bias, Some(s)].into_iter().chain(operands).collect();
        conv.attrs.set("scale_x", AttrValue::Int(1));
    }
    // The products are read by nobody now.
    super::dce::run(g)
}

/// The (X, S) of node `mul` if it is a `Mul` whose output `product` is X times S: X of the
/// product's shape, S float32 `[N, C, 1, ..]`.
fn factors(g: &Graph, mul: &Node, product: ValueId) -> Option<(ValueId, ValueId)> {
    let (&[Some(a), Some(b)], "Mul") = (&mul.inputs[..], mul.op.as_str()) else {
        return None;
    };
    let out = g.ty(product)?;
    let gate: Vec<usize> =
        out.shape.iter().enumerate().map(|(d, &e)| if d < 2 { e } else { 1 }).collect();
    let fits = |x: ValueId, s: ValueId| {
        let (xt, st) = (g.ty(x)?, g.ty(s)?);
        let ok = x != s && xt == out && st.dtype == DType::F32 && st.shape == gate;
        ok.then_some((x, s))
    };
    fits(a, b).or_else(|| fits(b, a))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir;
    use crate::passes::testing::{Builder, assert_agrees};
    use ingot_schema::Attrs;

    /// A squeeze-and-excitation block's end on `x` [2, 6, 4, 5]: the gate
    /// `HardSigmoid(Conv1x1(GlobalAveragePool(x)))`, `x * gate` (or `gate * x`), then a conv
    /// with `kernel` and `group`, with a bias where `bias`, plus a residual where `residual`.
    fn excitation(swap: bool, kernel: usize, group: i64, bias: bool, residual: bool) -> Graph {
        let mut b = Builder::new();
        let x = b.input("x", &[2, 6, 4, 5]);
        let pooled = b.op("GlobalAveragePool", &[x]);
        let wg = b.constant("wg", &[6, 6, 1, 1], &[], 1);
        let logits = b.op("Conv", &[pooled, wg]);
        let gate = b.op("HardSigmoid", &[logits]);
        let product = if swap { b.op("Mul", &[gate, x]) } else { b.op("Mul", &[x, gate]) };
        let w = b.constant("w", &[4, 6 / group as usize, kernel, kernel], &[], 2);
        let mut ins = vec![product, w];
        if bias {
            ins.push(b.constant("b", &[4], &[], 3));
        }
        let pads = AttrValue::Ints(vec![(kernel / 2) as i64; 4]);
        let attrs = Attrs::new().with("group", AttrValue::Int(group)).with("pads", pads);
        let mut y = b.node("Conv", &ins, attrs);
        if residual {
            let r = b.input("r", &[2, 4, 4, 5]);
            y = b.op("Add", &[y, r]);
        }
        b.finish(&[y])
    }

    /// Runs `fuse` and this pass on `g`; returns the result's ops, which compute what `g` does.
    fn rewritten(g: &Graph) -> (Graph, Vec<String>) {
        let mut m = g.clone();
        crate::passes::fuse::run(&mut m).unwrap();
        run(&mut m).unwrap();
        ir::check(&m).unwrap();
        assert_agrees(&m, g);
        let ops = m.nodes.iter().map(|n| n.op.clone()).collect();
        (m, ops)
    }

    #[test]
    fn the_gate_product_becomes_the_projections_scales() {
        for (swap, bias, residual) in
            [(false, true, false), (true, false, true), (false, false, false)]
        {
            let (m, ops) = rewritten(&excitation(swap, 1, 1, bias, residual));
            assert_eq!(ops, ["GlobalAveragePool", "Conv", "Conv"], "no Mul is left");
            let conv = &m.nodes[2];
            assert!(ingot_ops::scales_x(&conv.attrs));
            // X, W, B (zeros where the model has none), the gate, then the residual.
            let gate = m.nodes[1].outputs[0];
            assert_eq!(conv.inputs.len(), 4 + usize::from(residual));
            assert_eq!((conv.inputs[0], conv.inputs[3]), (Some(m.inputs[0]), Some(gate)));
            let bias = m.constant(conv.inputs[2].unwrap()).unwrap();
            assert_eq!(bias.desc().shape, [4]);
            if residual {
                assert_eq!(conv.inputs[4], Some(m.inputs[1]));
                assert_eq!(conv.attrs.text("post_ops").unwrap(), "Add");
            }
        }
    }

    #[test]
    fn other_convs_and_shared_products_are_left_alone() {
        // A 3x3 conv, and a grouped 1x1 one, take no scales.
        for (kernel, group) in [(3, 1), (1, 2)] {
            let (_, ops) = rewritten(&excitation(false, kernel, group, true, false));
            assert_eq!(ops, ["GlobalAveragePool", "Conv", "Mul", "Conv"]);
        }
        // The product is also a graph output.
        let mut g = excitation(false, 1, 1, true, false);
        let product = g.nodes.iter().find(|n| n.op == "Mul").unwrap().outputs[0];
        g.outputs.push(product);
        let (_, ops) = rewritten(&g);
        assert!(ops.contains(&"Mul".to_string()));
    }
}
