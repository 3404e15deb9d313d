//! The loss functions in f64, whatever X's float type: SoftmaxCrossEntropyLoss first takes
//! the log softmax of each lane of X along C, then both gather each target's negative
//! log-probability. A target class outside `[0, C)` that is not `ignore_index` is an error of
//! the run.

use crate::cpu::{Kernel, KernelError, OpCx, input, read_f64s, write_f64s};
use crate::invalid;
use crate::tensor::{TensorMut, TensorRef};
use ingot_schema::DType;

pub fn prepare(cx: &OpCx) -> Result<Box<dyn Kernel>, KernelError> {
    let softmax = match cx.op {
        "NegativeLogLikelihoodLoss" => false,
        "SoftmaxCrossEntropyLoss" => true,
        op => return Err(KernelError::UnknownOp(op.to_string())),
    };
    let outs = if softmax { cx.outputs.len().clamp(1, 2) } else { 1 };
    cx.expect_arity(2..=3, outs)?;
    let x = &cx.inputs[0];
    super::check(x, &cx.inputs[1], cx.inputs.get(2)).map_err(|e| invalid!("{}: {e}", cx.op))?;
    let reduction = match cx.attrs.text("reduction")? {
        "none" => Reduction::None,
        "sum" => Reduction::Sum,
        "mean" => Reduction::Mean,
        other => return Err(invalid!("{}: reduction '{other}'", cx.op)),
    };
    let ignore = cx.attrs.contains("ignore_index").then(|| cx.attrs.int("ignore_index"));
    Ok(Box::new(Loss {
        n: x.shape[0],
        c: x.shape[1],
        d: x.shape[2..].iter().product(),
        target: cx.inputs[1].dtype,
        weighted: cx.inputs.len() == 3,
        softmax,
        reduction,
        ignore: ignore.transpose()?,
    }))
}

#[derive(Clone, Copy, PartialEq)]
enum Reduction {
    None,
    Sum,
    Mean,
}

/// X seen as `[n, c, d]`.
struct Loss {
    n: usize,
    c: usize,
    d: usize,
    target: DType,
    weighted: bool,
    softmax: bool,
    reduction: Reduction,
    ignore: Option<i64>,
}

impl Loss {
    /// Each lane of `x` along C minus its log-sum-exp.
    fn log_softmax(&self, x: &mut [f64]) {
        let (c, d) = (self.c, self.d);
        for sample in x.chunks_exact_mut(c * d) {
            for j in 0..d {
                let lane = (0..c).map(|k| sample[k * d + j]);
                let max = lane.clone().fold(f64::NEG_INFINITY, f64::max);
                let sum: f64 = lane.map(|v| (v - max).exp()).sum();
                let shift = max + sum.ln();
                (0..c).for_each(|k| sample[k * d + j] -= shift);
            }
        }
    }
}

impl Kernel for Loss {
    fn run(&self, inputs: &[TensorRef], outputs: &mut [TensorMut]) -> Result<(), KernelError> {
        let (n, c, d) = (self.n, self.c, self.d);
        let floats = |i: usize, len: usize| -> Result<Vec<f64>, KernelError> {
            let t = inputs.get(i).ok_or_else(|| invalid!("input {i} is missing"))?;
            let v = read_f64s(t)?;
            match v.len() == len {
                true => Ok(v),
                false => Err(invalid!("input {i} has {} elements, expected {len}", v.len())),
            }
        };
        let mut x = floats(0, n * c * d)?;
        let targets: Vec<i64> = match self.target {
            DType::I32 => input::<i32>(inputs, 1, n * d)?.iter().map(|&t| i64::from(t)).collect(),
            _ => input::<i64>(inputs, 1, n * d)?.to_vec(),
        };
        let weight = match self.weighted {
            true => Some(floats(2, c)?),
            false => None,
        };
        if self.softmax {
            self.log_softmax(&mut x);
        }
        let mut losses = vec![0.0; n * d];
        let mut weights = 0.0;
        for (e, (&t, loss)) in targets.iter().zip(&mut losses).enumerate() {
            if Some(t) == self.ignore {
                continue;
            }
            let class = usize::try_from(t).ok().filter(|&t| t < c).ok_or_else(|| {
                invalid!("target {t} is not a class of 0 to {} nor ignore_index", c - 1)
            })?;
            let w = weight.as_ref().map_or(1.0, |w| w[class]);
            *loss = -w * x[(e / d * c + class) * d + e % d];
            weights += w;
        }
        let loss = match self.reduction {
            Reduction::None => losses,
            Reduction::Sum => vec![losses.iter().sum()],
            Reduction::Mean => vec![losses.iter().sum::<f64>() / weights],
        };
        let (first, rest) = outputs.split_first_mut().ok_or_else(|| invalid!("no output"))?;
        write_f64s(first, &loss)?;
        if let Some(log_prob) = rest.first_mut() {
            write_f64s(log_prob, &x)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu;
    use crate::{Tensor, TensorDesc};
    use ingot_schema::{AttrValue, Attrs};

    fn loss(op: &str, reduction: &str, ignore: Option<i64>, weight: bool) -> Vec<Tensor> {
        // X [2, 3, 2]: two samples of three classes at two positions.
        let x: Vec<f32> = (0..12).map(|i| (i as f32 * 0.37).sin()).collect();
        let x = Tensor::from_vec(vec![2, 3, 2], &x).unwrap();
        let t = Tensor::from_vec(vec![2, 2], &[0i64, 2, 1, 1]).unwrap();
        let w = Tensor::from_vec(vec![3], &[0.5f32, 2.0, 1.5]).unwrap();
        let mut attrs = Attrs::new().with("reduction", AttrValue::Text(reduction.into()));
        if let Some(i) = ignore {
            attrs.set("ignore_index", AttrValue::Int(i));
        }
        let mut ins = vec![&x, &t];
        if weight {
            ins.push(&w);
        }
        let shape = if reduction == "none" { vec![2, 2] } else { vec![] };
        let mut outs = vec![TensorDesc::new(DType::F32, shape)];
        if op == "SoftmaxCrossEntropyLoss" {
            outs.push(TensorDesc::new(DType::F32, vec![2, 3, 2]));
        }
        cpu::eval(op, &attrs, &ins, &outs).unwrap()
    }

    #[test]
    fn losses_are_the_negative_log_probabilities_of_the_targets() {
        let x: Vec<f64> = (0..12).map(|i| f64::from((i as f32 * 0.37).sin())).collect();
        // Element (n, j) of target t reads x[n, t, j] = x[(n * 3 + t) * 2 + j].
        let picked = [x[0], x[5], x[8], x[9]];
        let got = loss("NegativeLogLikelihoodLoss", "none", None, false);
        let want: Vec<f32> = picked.iter().map(|&v| -v as f32).collect();
        assert_eq!(got[0].as_slice::<f32>().unwrap(), want);
        // Weighted, the class-1 targets ignored: the mean is over the weights of the rest.
        let got = loss("NegativeLogLikelihoodLoss", "mean", Some(1), true);
        let want = (-0.5 * picked[0] - 1.5 * picked[1]) / 2.0;
        assert_eq!(got[0].as_slice::<f32>().unwrap(), [want as f32]);
        let got = loss("NegativeLogLikelihoodLoss", "sum", None, false);
        assert_eq!(got[0].as_slice::<f32>().unwrap(), [-picked.iter().sum::<f64>() as f32]);
        // The softmax form: X's log softmax along C, and the same loss of it.
        let got = loss("SoftmaxCrossEntropyLoss", "none", None, false);
        let log_prob = got[1].as_slice::<f32>().unwrap();
        for (n, j) in [(0, 0), (1, 1)] {
            let lane: Vec<f64> = (0..3).map(|k| x[(n * 3 + k) * 2 + j]).collect();
            let lse = lane.iter().map(|v| v.exp()).sum::<f64>().ln();
            for k in 0..3 {
                let want = (lane[k] - lse) as f32;
                assert!((log_prob[(n * 3 + k) * 2 + j] - want).abs() < 1e-6);
            }
        }
        let loss0 = got[0].as_slice::<f32>().unwrap()[0];
        assert!((loss0 + log_prob[0]).abs() < 1e-6, "class 0 at (0, 0)");
    }

    #[test]
    fn a_target_outside_the_classes_is_an_error() {
        let x = Tensor::from_vec(vec![1, 2], &[0.1f32, 0.2]).unwrap();
        let t = Tensor::from_vec(vec![1], &[2i64]).unwrap();
        let attrs = Attrs::new().with("reduction", AttrValue::Text("sum".into()));
        let outs = [TensorDesc::new(DType::F32, vec![])];
        let e = cpu::eval("NegativeLogLikelihoodLoss", &attrs, &[&x, &t], &outs).unwrap_err();
        assert!(e.to_string().contains("target 2 is not a class of 0 to 1"), "{e}");
    }
}
