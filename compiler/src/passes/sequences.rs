//! Sequences and optionals, resolved at compile time: the `lower` walk keeps each such value
//! in `Graph::containers` as the values it holds, and replaces each sequence op by the tensor
//! nodes it amounts to (or by nothing). A static graph knows every sequence's length, so a
//! position must be a constant once shapes are static, as Slice's starts must.
//!
//! - `SequenceEmpty`, `SequenceConstruct`, `SequenceInsert`, `SequenceErase`: a new list;
//! - `SequenceAt`: an `Identity` of the element; `SequenceLength`: a constant;
//! - `ConcatFromSequence`: a `Concat` of the elements (each first `Reshape`d to a new axis of
//!   one with `new_axis`);
//! - `SplitToSequence`: a `Slice` per piece (and a `Reshape` that drops the axis without
//!   `keepdims`);
//! - `SequenceMap`: its body copied once per element (`control::instantiate`), each copy's
//!   outputs an element of the output sequences.
//!
//! Optionals hold one value or none: `Optional` makes one, `OptionalHasElement` is a
//! constant, `OptionalGetElement` the element (a plain tensor or sequence is its own).
//! `Identity` of a container is the same container.
//!
//! At the graph's edges a container is the tensors it holds. The importer gives a sequence
//! input `x` of n elements the tensor inputs `x[0]` .. `x[n-1]` (`--input-sequence`), and an
//! absent optional input none (`--absent-input`); [`expose_outputs`] makes a sequence output
//! `y` the outputs `y[0]` .. and an optional one its element, under its own name, or nothing.

use super::{PassError, control};
use crate::ir::{Const, Container, Graph, Node, ValueId};
use ingot_ops::{Tensor, TensorError};
use ingot_schema::{AttrValue, Attrs};

/// The ops this file expands.
pub const OPS: &[&str] = &[
    "SequenceEmpty",
    "SequenceConstruct",
    "SequenceInsert",
    "SequenceErase",
    "SequenceAt",
    "SequenceLength",
    "ConcatFromSequence",
    "SplitToSequence",
    "SequenceMap",
    "Optional",
    "OptionalHasElement",
    "OptionalGetElement",
];

/// Whether [`expand`] handles `node`: a sequence op, or an `Identity` of a container.
pub fn expands(g: &Graph, node: &Node) -> bool {
    let reads_container =
        || node.inputs.first().copied().flatten().is_some_and(|v| g.containers.contains_key(&v));
    node.domain.is_empty()
        && (OPS.contains(&node.op.as_str()) || (node.op == "Identity" && reads_container()))
}

/// An error if `node`, which [`expand`] does not handle, reads a sequence or optional.
pub fn check_reader(g: &Graph, node: &Node) -> Result<(), PassError> {
    match node.inputs.iter().position(|v| v.is_some_and(|v| g.containers.contains_key(&v))) {
        None => Ok(()),
        Some(k) => Err(PassError::Node {
            node: node.label(),
            message: format!(
                "input {k} '{}' is a {}, which only the sequence and optional ops read",
                g.values[node.inputs[k].unwrap_or_default()].name,
                kind(&g.containers[&node.inputs[k].unwrap_or_default()])
            ),
        }),
    }
}

fn kind(c: &Container) -> &'static str {
    match c {
        Container::Sequence(_) => "sequence",
        Container::Optional(_) => "optional",
    }
}

/// Makes each graph output that is a container the tensors it holds (see the module's doc),
/// each written by an `Identity` appended to the graph; whether there were any.
pub fn expose_outputs(g: &mut Graph) -> Result<bool, PassError> {
    let held = g.outputs.iter().any(|v| g.containers.contains_key(v));
    if !held {
        return Ok(false);
    }
    let mut outputs = Vec::new();
    for v in std::mem::take(&mut g.outputs) {
        if !g.containers.contains_key(&v) {
            outputs.push(v);
            continue;
        }
        let name = g.values[v].name.clone();
        // The container's own value gives its name up to what it holds.
        g.values[v].name = format!("{name}:held");
        let mut tensors = Vec::new();
        flatten(g, v, name, &mut tensors);
        for (name, element) in tensors {
            let out = g.add_value(name.clone(), None);
            g.nodes.push(Node {
                name: format!("{name}:output"),
                op: "Identity".into(),
                domain: String::new(),
                inputs: vec![Some(element)],
                outputs: vec![out],
                attrs: Attrs::new(),
            });
            outputs.push(out);
        }
    }
    g.outputs = outputs;
    Ok(true)
}

/// The tensors `v` holds, named from `name`, in order.
fn flatten(g: &Graph, v: ValueId, name: String, into: &mut Vec<(String, ValueId)>) {
    match g.containers.get(&v) {
        None => into.push((name, v)),
        Some(Container::Optional(None)) => {}
        Some(Container::Optional(Some(e))) => flatten(g, *e, name, into),
        Some(Container::Sequence(list)) => {
            for (i, &e) in list.iter().enumerate() {
                flatten(g, e, format!("{name}[{i}]"), into);
            }
        }
    }
}

/// The elements of sequence input `k` of `node`.
fn sequence(g: &Graph, node: &Node, k: usize) -> Result<Vec<ValueId>, PassError> {
    match node.inputs.get(k).copied().flatten().and_then(|v| g.containers.get(&v)) {
        Some(Container::Sequence(list)) => Ok(list.clone()),
        Some(c) => Err(err(node, format!("input {k} is an {}, not a sequence", kind(c)))),
        None => Err(err(node, format!("input {k} is not a sequence made by the ops before it"))),
    }
}

fn err(node: &Node, message: String) -> PassError {
    PassError::Node { node: node.label(), message }
}

/// Replaces the node at `g.nodes[at]`, which [`expands`], by the tensor nodes it amounts to,
/// walked next.
pub fn expand(g: &mut Graph, at: usize) -> Result<(), PassError> {
    let node = g.nodes.remove(at);
    let mut made = Made { g, at, name: node.name.clone(), count: 0 };
    let out = *node.outputs.first().ok_or_else(|| err(&node, "it has no output".into()))?;
    let int = |name: &str, default: i64| node.attrs.int_or(name, default);
    let int = |name: &str, default: i64| int(name, default).map_err(|e| err(&node, e.to_string()));
    let input = |k: usize| node.inputs.get(k).copied().flatten();
    let held = match node.op.as_str() {
        "SequenceEmpty" => Container::Sequence(Vec::new()),
        "SequenceConstruct" => Container::Sequence(
            node.inputs
                .iter()
                .map(|v| v.ok_or_else(|| err(&node, "an omitted input".into())))
                .collect::<Result<_, _>>()?,
        ),
        "SequenceInsert" => {
            let mut list = sequence(made.g, &node, 0)?;
            let t = input(1).ok_or_else(|| err(&node, "the tensor to insert is missing".into()))?;
            let at = position(made.g, &node, 2, list.len(), list.len() as i64, true)?;
            list.insert(at, t);
            Container::Sequence(list)
        }
        "SequenceErase" => {
            let mut list = sequence(made.g, &node, 0)?;
            let at = position(made.g, &node, 1, list.len(), -1, false)?;
            list.remove(at);
            Container::Sequence(list)
        }
        "SequenceAt" => {
            let list = sequence(made.g, &node, 0)?;
            let at = position(made.g, &node, 1, list.len(), i64::MIN, false)?;
            return made.alias(out, list[at]);
        }
        "SequenceLength" => {
            let n = sequence(made.g, &node, 0)?.len() as i64;
            return made.constant(out, Tensor::from_vec(Vec::new(), &[n]));
        }
        "ConcatFromSequence" => {
            let list = sequence(made.g, &node, 0)?;
            let first = list.first().and_then(|&v| made.g.ty(v)).cloned();
            let first = first.ok_or_else(|| err(&node, "the sequence is empty".into()))?;
            let new_axis = int("new_axis", 0)? != 0;
            let rank = first.shape.len() + usize::from(new_axis);
            let axis = normalize(int("axis", 0)?, rank).ok_or_else(|| {
                err(&node, format!("axis {} is out of range", int("axis", 0).unwrap_or(0)))
            })?;
            let mut parts = Vec::new();
            for v in list {
                let part = match new_axis {
                    false => v,
                    true => {
                        let mut shape = made.g.ty(v).map(|t| t.shape.clone()).unwrap_or_default();
                        shape.insert(axis.min(shape.len()), 1);
                        made.reshape(v, &shape)?
                    }
                };
                parts.push(part);
            }
            let attrs = Attrs::new().with("axis", AttrValue::Int(axis as i64));
            made.node("Concat", parts, attrs, Some(out));
            return Ok(());
        }
        "SplitToSequence" => Container::Sequence(split(&mut made, &node)?),
        "SequenceMap" => return map(&mut made, &node),
        "Optional" => Container::Optional(input(0)),
        "OptionalHasElement" => {
            let has = match input(0) {
                None => false,
                Some(v) => made.g.containers.get(&v) != Some(&Container::Optional(None)),
            };
            return made.constant(out, Tensor::from_bools(Vec::new(), &[has]));
        }
        "OptionalGetElement" => {
            let v = input(0).ok_or_else(|| err(&node, "its input is missing".into()))?;
            let element = match made.g.containers.get(&v) {
                Some(Container::Optional(Some(e))) => *e,
                Some(Container::Optional(None)) => {
                    return Err(err(&node, "the optional holds no element".into()));
                }
                _ => v, // a tensor or a sequence is its own element
            };
            return made.alias(out, element);
        }
        "Identity" => {
            let v = input(0).ok_or_else(|| err(&node, "its input is missing".into()))?;
            return made.alias(out, v);
        }
        op => return Err(err(&node, format!("{op} is not a sequence op"))),
    };
    made.g.containers.insert(out, held);
    Ok(())
}

/// SequenceMap: its body once per element of the first input, reading element i of each
/// sequence input and the whole of each tensor one; output j is the sequence of the copies'
/// output j.
fn map(made: &mut Made, node: &Node) -> Result<(), PassError> {
    let b = control::body_of(made.g, node, "body").map_err(|m| err(node, m))?;
    let own = made.g.bodies[b].inputs.len();
    let outputs = made.g.bodies[b].outputs.len();
    if own == 0 || own > node.inputs.len() || outputs != node.outputs.len() {
        return Err(err(
            node,
            format!(
                "its body takes {own} inputs and gives {outputs}; the node has {} and {}",
                node.inputs.len(),
                node.outputs.len()
            ),
        ));
    }
    let n = sequence(made.g, node, 0)?.len();
    let mut reads = Vec::with_capacity(own);
    for k in 0..own {
        let v = node.inputs[k].ok_or_else(|| err(node, format!("input {k} is missing")))?;
        reads.push(match made.g.containers.get(&v) {
            Some(Container::Sequence(list)) if list.len() == n => Some(list.clone()),
            Some(Container::Sequence(list)) => {
                return Err(err(
                    node,
                    format!("input {k} holds {} elements, input 0 holds {n}", list.len()),
                ));
            }
            Some(Container::Optional(_)) => {
                return Err(err(node, format!("input {k} is an optional")));
            }
            None => None,
        });
    }
    let mut lists = vec![Vec::with_capacity(n); outputs];
    for i in 0..n {
        let inputs: Vec<ValueId> = (0..own)
            .map(|k| reads[k].as_ref().map_or(node.inputs[k].unwrap_or_default(), |l| l[i]))
            .collect();
        let (nodes, outs) = control::instantiate(made.g, b, &inputs, &format!("{}#{i}", made.name));
        for n in nodes {
            made.g.nodes.insert(made.at, n);
            made.at += 1;
        }
        for (list, o) in lists.iter_mut().zip(outs) {
            list.push(o);
        }
    }
    for (&out, list) in node.outputs.iter().zip(lists) {
        made.g.containers.insert(out, Container::Sequence(list));
    }
    Ok(())
}

/// The nodes an expansion inserts at `at`, in order.
struct Made<'g> {
    g: &'g mut Graph,
    at: usize,
    name: String,
    count: usize,
}

impl Made<'_> {
    /// Inserts `op(inputs)`; its output is `out`, or a new value.
    fn node(
        &mut self,
        op: &str,
        inputs: Vec<ValueId>,
        attrs: Attrs,
        out: Option<ValueId>,
    ) -> ValueId {
        let name = format!("{}:{op}{}", self.name, self.count);
        let out = out.unwrap_or_else(|| self.g.add_value(name.clone(), None));
        let node = Node {
            name,
            op: op.into(),
            domain: String::new(),
            inputs: inputs.into_iter().map(Some).collect(),
            outputs: vec![out],
            attrs,
        };
        self.g.nodes.insert(self.at, node);
        (self.at, self.count) = (self.at + 1, self.count + 1);
        out
    }

    /// Makes `out` the value `v` is: the same container, or an `Identity` of the tensor.
    fn alias(&mut self, out: ValueId, v: ValueId) -> Result<(), PassError> {
        match self.g.containers.get(&v).cloned() {
            Some(held) => {
                self.g.containers.insert(out, held);
            }
            None => {
                self.node("Identity", vec![v], Attrs::new(), Some(out));
            }
        }
        Ok(())
    }

    /// Makes `out`, which no node writes now, the constant `t`.
    fn constant(&mut self, out: ValueId, t: Result<Tensor, TensorError>) -> Result<(), PassError> {
        let t = t.map_err(|e| PassError::Graph(e.to_string()))?;
        let value = &mut self.g.values[out];
        value.ty = Some(t.desc().clone());
        value.constant = Some(Const::owned(t));
        Ok(())
    }

    fn ints(&mut self, values: &[i64]) -> Result<ValueId, PassError> {
        let t = Tensor::from_vec(vec![values.len()], values)
            .map_err(|e| PassError::Graph(e.to_string()))?;
        let name = format!("{}:ints{}", self.name, self.count);
        self.count += 1;
        Ok(self.g.add_constant(name, Const::owned(t)))
    }

    fn reshape(&mut self, v: ValueId, shape: &[usize]) -> Result<ValueId, PassError> {
        let dims: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
        let dims = self.ints(&dims)?;
        Ok(self.node("Reshape", vec![v, dims], Attrs::new(), None))
    }
}

/// SplitToSequence: a Slice per piece along `axis`, of the sizes `split` gives (one size: pieces
/// of it, the last shorter; none: pieces of one, without the axis unless `keepdims`).
fn split(made: &mut Made, node: &Node) -> Result<Vec<ValueId>, PassError> {
    let x = node.inputs.first().copied().flatten();
    let shape = x.and_then(|x| made.g.ty(x)).map(|t| t.shape.clone());
    let (Some(x), Some(shape)) = (x, shape) else {
        return Err(err(node, "its input's type is unknown".into()));
    };
    let axis = node.attrs.int_or("axis", 0).map_err(|e| err(node, e.to_string()))?;
    let axis = normalize(axis, shape.len()).filter(|&a| a < shape.len()).ok_or_else(|| {
        err(node, format!("axis {axis} is out of range for rank {}", shape.len()))
    })?;
    let len = shape[axis];
    // The sizes, and whether they came as one size for every piece.
    let split = match node.inputs.get(1).copied().flatten() {
        None => None,
        Some(s) => {
            let c = made.g.constant(s).ok_or_else(|| {
                err(node, "split (input 1) must be a constant once shapes are static".into())
            })?;
            let sizes =
                c.tensor().to_i64s().ok_or_else(|| err(node, "split is not integer".into()))?;
            Some((sizes, c.desc().shape.is_empty()))
        }
    };
    let sizes: Vec<usize> = match &split {
        None => vec![1; len],
        Some((sizes, true)) => match usize::try_from(sizes[0]) {
            Ok(size) if size > 0 => {
                (0..len.div_ceil(size)).map(|i| size.min(len - i * size)).collect()
            }
            _ => return Err(err(node, format!("split {} is not a positive size", sizes[0]))),
        },
        Some((sizes, false)) => {
            sizes.iter().map(|&s| usize::try_from(s).unwrap_or(usize::MAX)).collect()
        }
    };
    if sizes.iter().try_fold(0usize, |a, &s| a.checked_add(s)) != Some(len) {
        return Err(err(node, format!("split {sizes:?} does not add up to {len}")));
    }
    let keep = split.is_some() || node.attrs.int_or("keepdims", 1).unwrap_or(1) != 0;
    let mut start = 0;
    let mut pieces = Vec::new();
    for size in sizes {
        let starts = made.ints(&[start as i64])?;
        let ends = made.ints(&[(start + size) as i64])?;
        let axes = made.ints(&[axis as i64])?;
        let piece = made.node("Slice", vec![x, starts, ends, axes], Attrs::new(), None);
        let piece = match keep {
            true => piece,
            false => {
                let dropped: Vec<usize> = (shape.iter().enumerate())
                    .filter(|&(i, _)| i != axis)
                    .map(|(_, &d)| d)
                    .collect();
                made.reshape(piece, &dropped)?
            }
        };
        pieces.push(piece);
        start += size;
    }
    Ok(pieces)
}

/// The position input `k` of `node` in a list of `len` (negative counts from the end), or
/// `default` where the input is omitted (`i64::MIN`: it is required); `end`: `len` itself
/// is a position (an insertion at the back).
fn position(
    g: &Graph,
    node: &Node,
    k: usize,
    len: usize,
    default: i64,
    end: bool,
) -> Result<usize, PassError> {
    let pos = match node.inputs.get(k).copied().flatten() {
        None if default != i64::MIN => default,
        None => return Err(err(node, format!("the position (input {k}) is missing"))),
        Some(v) => match g.constant(v).and_then(|c| c.tensor().to_i64s()).as_deref() {
            Some(&[p]) => p,
            _ => {
                return Err(err(
                    node,
                    format!(
                        "the position (input {k}) must be a constant once shapes are static; \
                         it is computed at run time"
                    ),
                ));
            }
        },
    };
    let last = len + usize::from(end);
    let at = if pos < 0 { pos + len as i64 } else { pos };
    usize::try_from(at)
        .ok()
        .filter(|&a| a < last)
        .ok_or_else(|| err(node, format!("position {pos} is out of range for a sequence of {len}")))
}

/// `axis` (negative counts from the end) as an index below `rank`, or `None`.
fn normalize(axis: i64, rank: usize) -> Option<usize> {
    let a = if axis < 0 { axis + rank as i64 } else { axis };
    usize::try_from(a).ok().filter(|&a| a < rank.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::passes::testing::{Builder, data, evaluate};
    use ingot_ops::TensorDesc;
    use ingot_schema::DType;

    fn int(v: i64) -> AttrValue {
        AttrValue::Int(v)
    }

    /// Lowers `b`'s graph with output `out`: the ops left, or the error.
    fn lowered(mut b: Builder, out: ValueId) -> Result<Graph, String> {
        b.g.outputs = vec![out];
        let mut g = b.g;
        super::super::lower::run(&mut g).map_err(|e| e.to_string())?;
        crate::ir::check(&g).map_err(|e| e.to_string())?;
        Ok(g)
    }

    #[test]
    fn sequences_become_the_tensor_nodes_they_amount_to() {
        // x [5, 2] split in pieces of 2 along 0 ([2], [2], [1] rows), its first piece erased,
        // y inserted at the front, the third read back, and all stacked on a new axis 1.
        let mut b = Builder::new();
        let x = b.input("x", &[5, 2]);
        let y = b.input("y", &[1, 2]);
        let two = b.g.add_constant("two", Const::owned(Tensor::from_vec(vec![], &[2i64]).unwrap()));
        let pieces = b.node("SplitToSequence", &[x, two], Attrs::new());
        let zero =
            b.g.add_constant("zero", Const::owned(Tensor::from_vec(vec![], &[0i64]).unwrap()));
        let rest = b.node("SequenceErase", &[pieces, zero], Attrs::new());
        let seq = b.node("SequenceInsert", &[rest, y, zero], Attrs::new());
        let last =
            b.g.add_constant("last", Const::owned(Tensor::from_vec(vec![], &[-1i64]).unwrap()));
        let third = b.node("SequenceAt", &[seq, last], Attrs::new());
        let pair = b.node("SequenceConstruct", &[third, y], Attrs::new());
        let out = b.node(
            "ConcatFromSequence",
            &[pair],
            Attrs::new().with("axis", int(1)).with("new_axis", int(1)),
        );
        let g = lowered(b, out).unwrap();
        let ops: Vec<&str> = g.nodes.iter().map(|n| n.op.as_str()).collect();
        assert!(!ops.iter().any(|op| op.contains("Sequence")), "{ops:?}");
        let (xs, ys) = (data(10, 1), data(2, 2));
        let inputs = [
            Tensor::from_vec(vec![5, 2], &xs).unwrap(),
            Tensor::from_vec(vec![1, 2], &ys).unwrap(),
        ];
        let got = &evaluate(&g, &inputs)[0];
        // The last piece is row 4 of x, [1, 2]; stacked with y on axis 1: [1, 2, 2].
        assert_eq!(got.desc().shape, [1, 2, 2]);
        assert_eq!(got.as_slice::<f32>().unwrap(), [xs[8], xs[9], ys[0], ys[1]]);
    }

    #[test]
    fn sequence_lengths_are_constants_and_pieces_may_drop_their_axis() {
        let mut b = Builder::new();
        let x = b.input("x", &[2, 3]);
        let pieces = b.node(
            "SplitToSequence",
            &[x],
            Attrs::new().with("axis", int(-1)).with("keepdims", int(0)),
        );
        let one = b.g.add_constant("one", Const::owned(Tensor::from_vec(vec![], &[1i64]).unwrap()));
        let column = b.node("SequenceAt", &[pieces, one], Attrs::new());
        let g = lowered(b, column).unwrap();
        let xs = data(6, 3);
        let got = &evaluate(&g, &[Tensor::from_vec(vec![2, 3], &xs).unwrap()])[0];
        assert_eq!(got.desc().shape, [2]);
        assert_eq!(got.as_slice::<f32>().unwrap(), [xs[1], xs[4]]);

        let mut b = Builder::new();
        let x = b.input("x", &[2, 3]);
        let pieces = b.node("SplitToSequence", &[x], Attrs::new().with("axis", int(1)));
        let n = b.node("SequenceLength", &[pieces], Attrs::new());
        let g = lowered(b, n).unwrap();
        let n = g.constant(g.outputs[0]).unwrap().tensor().to_i64s().unwrap();
        assert_eq!(n, [3]);
    }

    #[test]
    fn optionals_hold_one_element_or_none() {
        // Optional(x) holds x; Optional() holds nothing; a plain tensor is an element.
        for (wrapped, has) in [(true, true), (false, false)] {
            let mut b = Builder::new();
            let x = b.input("x", &[2]);
            let opt = match wrapped {
                true => b.node("Optional", &[x], Attrs::new()),
                false => b.node("Optional", &[], Attrs::new()),
            };
            let out = b.node("OptionalHasElement", &[opt], Attrs::new());
            let g = lowered(b, out).unwrap();
            let got = evaluate(&g, &[Tensor::from_vec(vec![2], &[1.0f32, 2.0]).unwrap()]);
            assert_eq!(got[0].bytes(), [u8::from(has)]);
        }
        let mut b = Builder::new();
        let x = b.input("x", &[2]);
        let opt = b.node("Optional", &[x], Attrs::new());
        let out = b.node("OptionalGetElement", &[opt], Attrs::new());
        let g = lowered(b, out).unwrap();
        let got = evaluate(&g, &[Tensor::from_vec(vec![2], &[1.0f32, 2.0]).unwrap()]);
        assert_eq!(got[0].as_slice::<f32>().unwrap(), [1.0, 2.0]);
        let mut b = Builder::new();
        let opt = b.node("Optional", &[], Attrs::new());
        let out = b.node("OptionalGetElement", &[opt], Attrs::new());
        assert!(lowered(b, out).unwrap_err().contains("the optional holds no element"));
    }

    #[test]
    fn container_outputs_are_the_tensors_they_hold() {
        // y = [x, relu(x)] gives outputs y[0] and y[1]; o = Optional(relu(x)) its element,
        // named o; an empty optional nothing. An optional holding a sequence is the sequence,
        // and an Identity of a container the same container.
        let mut b = Builder::new();
        let x = b.input("x", &[3]);
        let r = b.op("Relu", &[x]);
        let y = b.node("SequenceConstruct", &[x, r], Attrs::new());
        let o = b.node("Optional", &[r], Attrs::new());
        let none = b.node("Optional", &[], Attrs::new());
        let held = b.node("Optional", &[y], Attrs::new());
        let s = b.node("OptionalGetElement", &[held], Attrs::new());
        let s = b.node("Identity", &[s], Attrs::new());
        for (v, name) in [(y, "y"), (o, "o"), (none, "n"), (s, "s")] {
            b.g.values[v].name = name.into();
        }
        b.g.outputs = vec![y, o, none, s];
        let mut g = b.g;
        super::super::lower::run(&mut g).unwrap();
        crate::ir::check(&g).unwrap();
        let names: Vec<&str> = g.outputs.iter().map(|&v| g.values[v].name.as_str()).collect();
        assert_eq!(names, ["y[0]", "y[1]", "o", "s[0]", "s[1]"]);
        assert!(g.containers.is_empty());
        let xs = [-1.0f32, 0.5, 2.0];
        let got = evaluate(&g, &[Tensor::from_vec(vec![3], &xs).unwrap()]);
        let relu = [0.0f32, 0.5, 2.0];
        let want: [&[f32]; 5] = [&xs, &relu, &relu, &xs, &relu];
        for (got, want) in got.iter().zip(want) {
            assert_eq!(got.as_slice::<f32>().unwrap(), want);
        }
    }

    #[test]
    fn what_a_static_graph_cannot_hold_is_an_error_naming_it() {
        // A position computed at run time.
        let mut b = Builder::new();
        let x = b.input("x", &[2]);
        let pos = b.g.add_value("pos", Some(TensorDesc::new(DType::I64, vec![])));
        b.g.inputs.push(pos);
        let seq = b.node("SequenceConstruct", &[x, x], Attrs::new());
        let at = b.node("SequenceAt", &[seq, pos], Attrs::new());
        let e = lowered(b, at).unwrap_err();
        assert!(e.contains("SequenceAt") && e.contains("must be a constant"), "{e}");
        // A sequence read by a tensor op.
        let mut b = Builder::new();
        let x = b.input("x", &[2]);
        let seq = b.node("SequenceConstruct", &[x], Attrs::new());
        let y = b.node("Relu", &[seq], Attrs::new());
        let e = lowered(b, y).unwrap_err();
        assert!(e.contains("Relu") && e.contains("is a sequence, which only"), "{e}");
        // An optional's element read as a sequence.
        let mut b = Builder::new();
        let x = b.input("x", &[2]);
        let opt = b.node("Optional", &[x], Attrs::new());
        let n = b.node("SequenceLength", &[opt], Attrs::new());
        let e = lowered(b, n).unwrap_err();
        assert!(e.contains("input 0 is an optional, not a sequence"), "{e}");
        // Past the end.
        let mut b = Builder::new();
        let x = b.input("x", &[2]);
        let seq = b.node("SequenceConstruct", &[x], Attrs::new());
        let two = b.g.add_constant("two", Const::owned(Tensor::from_vec(vec![], &[2i64]).unwrap()));
        let at = b.node("SequenceAt", &[seq, two], Attrs::new());
        let e = lowered(b, at).unwrap_err();
        assert!(e.contains("position 2 is out of range for a sequence of 1"), "{e}");
    }
}
