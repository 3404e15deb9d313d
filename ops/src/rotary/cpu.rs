//! RotaryEmbedding, float32 (position_ids int64): each row of X (one head of one token)
//! has its first `rot` elements rotated as `rot / 2` pairs by the token's cache row, and the
//! rest copied. A pair (x1, x2) with cache values (c, s) becomes (c x1 - s x2, s x1 + c x2),
//! ONNX's reference products in its order.

use super::geometry::Geometry;
use crate::cpu::parallel::for_each_chunk;
use crate::cpu::{Kernel, KernelError, OpCx, input_f32, output_mut};
use crate::invalid;
use crate::tensor::{TensorMut, TensorRef};
use ingot_schema::DType;

/// About this many elements of X per parallel task.
const TASK: usize = 1 << 15;

pub fn prepare(cx: &OpCx) -> Result<Box<dyn Kernel>, KernelError> {
    if cx.op != "RotaryEmbedding" {
        return Err(KernelError::UnknownOp(cx.op.to_string()));
    }
    cx.expect_arity(3..=4, 1)?;
    if let Some(d) = cx.inputs[..3].iter().chain(cx.outputs).find(|d| d.dtype != DType::F32) {
        return Err(cx.dtype_error(d.dtype));
    }
    if let Some(ids) = cx.inputs.get(3).filter(|d| d.dtype != DType::I64) {
        return Err(invalid!("RotaryEmbedding position_ids must be int64, got {}", ids.dtype));
    }
    let shapes: Vec<&[usize]> = cx.inputs.iter().map(|d| d.shape.as_slice()).collect();
    let g = Geometry::new(cx.attrs, &shapes).map_err(|e| invalid!("RotaryEmbedding: {e}"))?;
    let x = &cx.inputs[0].shape;
    if cx.outputs[0].shape != *x {
        return Err(invalid!("RotaryEmbedding of {x:?} declares output {:?}", cx.outputs[0].shape));
    }
    Ok(Box::new(Rotary(g)))
}

struct Rotary(Geometry);

impl Kernel for Rotary {
    fn run(&self, inputs: &[TensorRef], outputs: &mut [TensorMut]) -> Result<(), KernelError> {
        let g = &self.0;
        let (n, half, tokens) = (g.elements(), g.rot / 2, g.batch * g.seq);
        let x = input_f32(inputs, 0, n)?;
        let cache_rows = g.positions.unwrap_or(tokens);
        let cos = input_f32(inputs, 1, cache_rows * half)?;
        let sin = input_f32(inputs, 2, cache_rows * half)?;
        // Each token's cache row, every position id checked before anything is written.
        let rows: Vec<usize> = match g.positions {
            None => (0..tokens).collect(),
            Some(positions) => {
                let ids = inputs.get(3).ok_or_else(|| invalid!("position_ids are missing"))?;
                let ids = ids.as_slice::<i64>()?;
                if ids.len() != tokens {
                    return Err(invalid!(
                        "position_ids has {} elements, expected {tokens}",
                        ids.len()
                    ));
                }
                ids.iter()
                    .map(|&id| {
                        usize::try_from(id).ok().filter(|&p| p < positions).ok_or_else(|| {
                            KernelError::Data(format!(
                                "position id {id} is outside the cos/sin caches' {positions} \
                                 positions"
                            ))
                        })
                    })
                    .collect::<Result<_, _>>()?
            }
        };
        let y = output_mut::<f32>(outputs, 0, n)?;
        if n == 0 {
            return Ok(());
        }
        // Whole rows per task, in parallel; each row is computed alone, so results do not
        // depend on how rows are shared out.
        let per_task = (TASK / g.head).max(1);
        let task_len = per_task * g.head;
        for_each_chunk(y, task_len, &|task, ys| {
            let xs = &x[task * task_len..];
            let rows_of = ys.chunks_exact_mut(g.head).zip(xs.chunks_exact(g.head));
            for (j, (yr, xr)) in rows_of.enumerate() {
                let at = rows[g.token(task * per_task + j)] * half;
                let (c, s) = (&cos[at..at + half], &sin[at..at + half]);
                for k in 0..half {
                    let (i1, i2) = if g.interleaved { (2 * k, 2 * k + 1) } else { (k, k + half) };
                    let (x1, x2) = (xr[i1], xr[i2]);
                    yr[i1] = c[k] * x1 - s[k] * x2;
                    yr[i2] = s[k] * x1 + c[k] * x2;
                }
                yr[g.rot..].copy_from_slice(&xr[g.rot..]);
            }
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::cpu::{KernelError, eval};
    use crate::rotary::geometry::canonical as attrs;
    use crate::tensor::{Tensor, TensorDesc};
    use ingot_schema::DType;

    /// Deterministic values in [-1, 1).
    fn values(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2_654_435_761).max(1);
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s % 2000) as f32 / 1000.0 - 1.0
            })
            .collect()
    }

    /// ONNX's reference, step by step on [batch, seq, heads, head] (numpy's transposes and
    /// splits written out as indices).
    #[allow(clippy::too_many_arguments)]
    fn reference(
        x: &[f32],
        shape: &[usize],
        cos: &[f32],
        sin: &[f32],
        ids: Option<&[i64]>,
        heads: usize,
        rot: usize,
        interleaved: bool,
    ) -> Vec<f32> {
        let (b, s, d) = match *shape {
            [b, _, s, d] => (b, s, d),
            [b, s, hidden] => (b, s, hidden / heads),
            _ => unreachable!(),
        };
        let at = |bi: usize, si: usize, h: usize, e: usize| match shape.len() {
            4 => ((bi * heads + h) * s + si) * d + e,
            _ => ((bi * s + si) * heads + h) * d + e,
        };
        let half = rot / 2;
        let mut y = x.to_vec();
        for bi in 0..b {
            for si in 0..s {
                let row = ids.map_or(bi * s + si, |ids| ids[bi * s + si] as usize);
                for h in 0..heads {
                    for k in 0..half {
                        let (e1, e2) = if interleaved { (2 * k, 2 * k + 1) } else { (k, k + half) };
                        let (x1, x2) = (x[at(bi, si, h, e1)], x[at(bi, si, h, e2)]);
                        let (c, sn) = (cos[row * half + k], sin[row * half + k]);
                        y[at(bi, si, h, e1)] = c * x1 - sn * x2;
                        y[at(bi, si, h, e2)] = sn * x1 + c * x2;
                    }
                }
            }
        }
        y
    }

    #[test]
    fn every_layout_matches_the_reference() {
        for (shape, heads) in [(vec![2, 4, 3, 8], 4), (vec![2, 3, 32], 4), (vec![1, 2, 5, 6], 2)] {
            let n: usize = shape.iter().product();
            let head = n / (shape[0] * heads * if shape.len() == 4 { shape[2] } else { shape[1] });
            let (b, s) = (shape[0], if shape.len() == 4 { shape[2] } else { shape[1] });
            for rot in [head, head - 2] {
                for interleaved in [false, true] {
                    for with_ids in [false, true] {
                        let half = rot / 2;
                        let rows = if with_ids { 50 } else { b * s };
                        let cache_shape = if with_ids { vec![50, half] } else { vec![b, s, half] };
                        let xv = values(n, 1);
                        let (cv, sv) = (values(rows * half, 2), values(rows * half, 3));
                        let ids: Vec<i64> = (0..b * s).map(|t| (t as i64 * 7 + 3) % 50).collect();
                        let x = Tensor::from_vec(shape.clone(), &xv).unwrap();
                        let c = Tensor::from_vec(cache_shape.clone(), &cv).unwrap();
                        let sn = Tensor::from_vec(cache_shape, &sv).unwrap();
                        let p = Tensor::from_vec(vec![b, s], &ids).unwrap();
                        let mut inputs = vec![&x, &c, &sn];
                        if with_ids {
                            inputs.push(&p);
                        }
                        let out = TensorDesc::new(DType::F32, shape.clone());
                        let y = eval(
                            "RotaryEmbedding",
                            &attrs(interleaved, heads, rot),
                            &inputs,
                            &[out],
                        )
                        .unwrap();
                        let ids = with_ids.then_some(ids.as_slice());
                        let expected =
                            reference(&xv, &shape, &cv, &sv, ids, heads, rot, interleaved);
                        let case =
                            format!("{shape:?} rot {rot} interleaved {interleaved} ids {with_ids}");
                        assert_eq!(y[0].as_slice::<f32>().unwrap(), expected, "{case}");
                    }
                }
            }
        }
    }

    #[test]
    fn a_position_outside_the_caches_is_a_data_error() {
        let x = Tensor::from_vec(vec![1, 1, 2, 4], &[1f32; 8]).unwrap();
        let cache = Tensor::from_vec(vec![3, 2], &[0.5f32; 6]).unwrap();
        let out = [TensorDesc::new(DType::F32, vec![1, 1, 2, 4])];
        for bad in [3i64, -1, i64::MAX] {
            let ids = Tensor::from_vec(vec![1, 2], &[0, bad]).unwrap();
            let err =
                eval("RotaryEmbedding", &attrs(false, 1, 4), &[&x, &cache, &cache, &ids], &out)
                    .unwrap_err();
            match err {
                KernelError::Data(m) => assert!(m.contains(&format!("position id {bad}")), "{m}"),
                e => panic!("{e}"),
            }
        }
        let ids = Tensor::from_vec(vec![1, 2], &[2i64, 0]).unwrap();
        assert!(
            eval("RotaryEmbedding", &attrs(false, 1, 4), &[&x, &cache, &cache, &ids], &out).is_ok()
        );
    }

    #[test]
    fn wrong_types_and_shapes_are_refused() {
        let x = Tensor::from_vec(vec![1, 1, 2, 4], &[1f32; 8]).unwrap();
        let cache = Tensor::from_vec(vec![3, 2], &[0.5f32; 6]).unwrap();
        let out = [TensorDesc::new(DType::F32, vec![1, 1, 2, 4])];
        let ids = Tensor::from_vec(vec![1, 2], &[0i32, 1]).unwrap();
        let err = eval("RotaryEmbedding", &attrs(false, 1, 4), &[&x, &cache, &cache, &ids], &out)
            .unwrap_err();
        assert!(err.to_string().contains("int64"), "{err}");
        let err =
            eval("RotaryEmbedding", &attrs(false, 1, 4), &[&x, &cache, &cache], &out).unwrap_err();
        assert!(err.to_string().contains("cos_cache has shape [3, 2]"), "{err}");
    }
}
