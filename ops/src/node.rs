//! One operation of a graph as lowering and shape inference see it. The graph itself (values,
//! order) is the compiler's; a node names its operands by the compiler's value indices.

use crate::Tensor;
use crate::TensorDesc;
use ingot_schema::Attrs;
use std::sync::Arc;

/// Index of a value in the compiler's graph.
pub type ValueId = usize;

/// One operation, in ONNX terms until lowering makes it canonical.
#[derive(Clone, Debug)]
pub struct Node {
    pub name: String,
    pub op: String,
    pub domain: String,
    /// `None` marks an omitted optional input; canonical nodes have none.
    pub inputs: Vec<Option<ValueId>>,
    pub outputs: Vec<ValueId>,
    pub attrs: Attrs,
}

impl Node {
    /// The node as messages name it: `'conv_3' (Conv)`.
    pub fn label(&self) -> String {
        if self.name.is_empty() {
            format!("unnamed {} node", self.op)
        } else {
            format!("'{}' ({})", self.name, self.op)
        }
    }

    /// Inputs of a canonical node (all present).
    pub fn present_inputs(&self) -> impl Iterator<Item = ValueId> + '_ {
        self.inputs.iter().flatten().copied()
    }
}

/// A constant operand as lowering sees it: its type at once, its value only when asked (a
/// weight mapped from external data is not read unless lowering needs its numbers).
pub trait Constant {
    fn desc(&self) -> &TensorDesc;
    fn value(&self) -> Arc<Tensor>;

    /// The elements as i64 (for shape-like operands of any integer type).
    fn to_i64s(&self) -> Option<Vec<i64>> {
        Tensor::to_i64s(&self.value())
    }

    /// The elements as f64 (for scalar operands such as Clip bounds or Pad values).
    fn to_f64s(&self) -> Option<Vec<f64>> {
        Tensor::to_f64s(&self.value())
    }
}

impl Constant for Arc<Tensor> {
    fn desc(&self) -> &TensorDesc {
        Tensor::desc(self)
    }
    fn value(&self) -> Arc<Tensor> {
        self.clone()
    }
}
