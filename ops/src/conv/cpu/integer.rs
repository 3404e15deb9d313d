//! ConvInteger: `(X - x_zero) * (W - w_zero)` summed in int32, exactly (wrapping as ONNX's
//! int32 reference does past its range). The padding is the zero point, which contributes
//! nothing. A direct loop nest: per output channel, each weight tap adds its product with a
//! shifted run of input rows to the output plane, the innermost loop over output columns
//! (vectorised). Dynamic quantization's `ConvInteger -> Cast` to float does not come here:
//! the compiler's `integer_products` pass makes it a Conv of 8-bit W, run by the float paths.
//!
//! QLinearConv is ConvInteger's product plus B, requantized as ONNX's reference does: per
//! output channel `x_scale * w_scale / y_scale` in float32, the sum times it in float64, plus
//! y's zero point, rounded half to even and saturated.

use super::{DIMS, Window, span};
use crate::cpu::{Kernel, KernelError, OpCx, input, output_mut};
use crate::invalid;
use crate::tensor::TensorDesc;
use crate::tensor::{TensorMut, TensorRef};
use ingot_schema::DType;

pub(super) struct ConvInteger {
    win: Window,
    /// N, C, M and the group count.
    n: usize,
    c: usize,
    m: usize,
    group: usize,
    x: DType,
    w: DType,
    /// Where the zero points are among the inputs, and how many W's holds (1 or M).
    x_zero: Option<usize>,
    w_zero: Option<(usize, usize)>,
}

impl ConvInteger {
    pub(super) fn new(cx: &OpCx) -> Result<ConvInteger, KernelError> {
        let given = |name: &str| cx.attrs.int(name).map(|v| v != 0);
        let (xz, wz) = (given("x_zero_point")?, given("w_zero_point")?);
        let own = 2 + usize::from(xz) + usize::from(wz);
        cx.expect_arity(own..=own, 1)?;
        let (x, w, y) = (&cx.inputs[0], &cx.inputs[1], &cx.outputs[0]);
        let bytes = |d: DType| matches!(d, DType::I8 | DType::U8);
        if !bytes(x.dtype) || !bytes(w.dtype) || y.dtype != DType::I32 {
            return Err(invalid!(
                "ConvInteger takes 8-bit X and W to int32, not {} and {} to {}",
                x.dtype,
                w.dtype,
                y.dtype
            ));
        }
        if x.shape.len() < 3 || w.shape.len() != x.shape.len() || y.shape.len() != x.shape.len() {
            return Err(invalid!("ConvInteger of X {:?}, W {:?}", x.shape, w.shape));
        }
        let group = usize::try_from(cx.attrs.int("group")?).ok().filter(|&g| g > 0);
        let group = group.ok_or_else(|| invalid!("ConvInteger's group must be positive"))?;
        let (n, c, m) = (x.shape[0], x.shape[1], w.shape[0]);
        if w.shape[1] * group != c || m % group != 0 || y.shape[..2] != [n, m] {
            return Err(invalid!(
                "ConvInteger of X {:?} and W {:?} in {group} groups to {:?}",
                x.shape,
                w.shape,
                y.shape
            ));
        }
        let win = Window::new(cx, &x.shape[2..], &w.shape[2..], &y.shape[2..])?;
        win.check_output(cx.op, Window::conv_output)?;
        let x_zero = xz.then_some(2);
        if let Some(i) = x_zero
            && (cx.inputs[i].dtype != x.dtype || cx.inputs[i].elements() != 1)
        {
            return Err(invalid!("x_zero_point must be one {}", x.dtype));
        }
        let w_zero = match wz.then_some(own - 1) {
            Some(i)
                if cx.inputs[i].dtype == w.dtype && [1, m].contains(&cx.inputs[i].elements()) =>
            {
                Some((i, cx.inputs[i].elements()))
            }
            Some(_) => {
                return Err(invalid!(
                    "w_zero_point must be one {} or one per output channel",
                    w.dtype
                ));
            }
            None => None,
        };
        Ok(ConvInteger { win, n, c, m, group, x: x.dtype, w: w.dtype, x_zero, w_zero })
    }

    /// Input `i`'s `len` 8-bit values minus `zero` (one, or one per block of `block` values).
    fn widened(
        inputs: &[TensorRef],
        (i, len): (usize, usize),
        dtype: DType,
        zero: Option<(usize, usize)>,
        block: usize,
    ) -> Result<Vec<i32>, KernelError> {
        let t = inputs.get(i).ok_or_else(|| invalid!("input {i} is missing"))?;
        if t.bytes.len() != len {
            return Err(invalid!("input {i} has {} bytes, expected {len}", t.bytes.len()));
        }
        let level = |b: u8| if dtype == DType::I8 { i32::from(b as i8) } else { i32::from(b) };
        let zeros: Vec<i32> = match zero {
            None => vec![0],
            Some((z, _)) => {
                let z = inputs.get(z).ok_or_else(|| invalid!("a zero point is missing"))?;
                z.bytes.iter().map(|&b| level(b)).collect()
            }
        };
        Ok((t.bytes.iter().enumerate())
            .map(|(j, &b)| level(b) - zeros[if zeros.len() == 1 { 0 } else { j / block.max(1) }])
            .collect())
    }
}

impl Kernel for ConvInteger {
    fn run(&self, inputs: &[TensorRef], outputs: &mut [TensorMut]) -> Result<(), KernelError> {
        let win = &self.win;
        let (plane_in, plane_out): (usize, usize) =
            (win.input.iter().product(), win.output.iter().product());
        let taps: usize = win.kernel.iter().product();
        let cg = self.c / self.group;
        let mg = self.m / self.group;
        let x_len = self.n * self.c * plane_in;
        let x = Self::widened(inputs, (0, x_len), self.x, self.x_zero.map(|i| (i, 1)), 1)?;
        let w = Self::widened(inputs, (1, self.m * cg * taps), self.w, self.w_zero, cg * taps)?;
        let y = output_mut::<i32>(outputs, 0, self.n * self.m * plane_out)?;
        let [od, oh, ow] = win.output;
        let [ih, iw] = [win.input[1], win.input[2]];
        for (image, y) in y.chunks_exact_mut(self.m * plane_out).enumerate() {
            for (m, plane) in y.chunks_exact_mut(plane_out).enumerate() {
                plane.fill(0);
                let g = m / mg;
                for cc in 0..cg {
                    let x = &x[(image * self.c + g * cg + cc) * plane_in..][..plane_in];
                    let w = &w[(m * cg + cc) * taps..][..taps];
                    for (t, &wv) in w.iter().enumerate() {
                        if wv == 0 {
                            continue;
                        }
                        let k = [
                            t / (win.kernel[1] * win.kernel[2]),
                            t / win.kernel[2] % win.kernel[1],
                            t % win.kernel[2],
                        ];
                        let along = |d: usize, count: usize| {
                            span(count, win.input[d], win.strides[d], win.offset(d, k[d]))
                        };
                        let cols = along(DIMS - 1, ow);
                        let col_in = |o: usize| {
                            (o * win.strides[2]).wrapping_add_signed(win.offset(2, k[2]))
                        };
                        for o0 in along(0, od) {
                            let i0 = (o0 * win.strides[0]).wrapping_add_signed(win.offset(0, k[0]));
                            for o1 in along(1, oh) {
                                let i1 =
                                    (o1 * win.strides[1]).wrapping_add_signed(win.offset(1, k[1]));
                                let row = &x[(i0 * ih + i1) * iw..][..iw];
                                let out = &mut plane[(o0 * oh + o1) * ow..][..ow];
                                for o2 in cols.clone() {
                                    out[o2] =
                                        out[o2].wrapping_add(wv.wrapping_mul(row[col_in(o2)]));
                                }
                            }
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

pub(super) struct QLinearConv {
    product: ConvInteger,
    /// The product's shape (the output's) and elements per output channel plane.
    shape: Vec<usize>,
    plane: usize,
    bias: bool,
    y: DType,
}

impl QLinearConv {
    pub(super) fn new(cx: &OpCx) -> Result<QLinearConv, KernelError> {
        let bias = cx.attrs.int("bias")? != 0;
        cx.expect_arity(8 + usize::from(bias)..=8 + usize::from(bias), 1)?;
        let y = &cx.outputs[0];
        let (inputs, attrs) = (cx.inputs, crate::conv::qlinear_product_attrs(cx.attrs));
        let operands = [inputs[0].clone(), inputs[3].clone(), inputs[2].clone(), inputs[5].clone()];
        let sums = [TensorDesc::new(DType::I32, y.shape.clone())];
        let product = ConvInteger::new(&OpCx {
            op: "ConvInteger",
            attrs: &attrs,
            inputs: &operands,
            outputs: &sums,
        })?;
        let m = product.m;
        let floats = [1, 4, 6].iter().all(|&k| inputs[k].dtype == DType::F32);
        // One x_scale, y_scale and y_zero_point; one w_scale, or one per output channel.
        let counts = [1, 6, 7].iter().all(|&k| inputs[k].elements() == 1)
            && [1, m].contains(&inputs[4].elements());
        if !floats || !counts || y.dtype != inputs[7].dtype {
            return Err(invalid!(
                "QLinearConv's scales must be float32 (one each, w_scale one or one per output                  channel), its y of y_zero_point's type and y_zero_point one value"
            ));
        }
        let plane = y.shape[2..].iter().product();
        Ok(QLinearConv { product, shape: y.shape.clone(), plane, bias, y: y.dtype })
    }
}

impl Kernel for QLinearConv {
    fn run(&self, inputs: &[TensorRef], outputs: &mut [TensorMut]) -> Result<(), KernelError> {
        let m = self.product.m;
        let len = self.shape.iter().product::<usize>();
        let mut sums = vec![0i32; len];
        if inputs.len() < 8 {
            return Err(invalid!("QLinearConv has {} inputs", inputs.len()));
        }
        let operands = [0, 3, 2, 5].map(|k| inputs[k]);
        let mut out = [TensorMut {
            dtype: DType::I32,
            shape: &self.shape,
            bytes: bytemuck::cast_slice_mut(&mut sums),
        }];
        self.product.run(&operands, &mut out)?;
        let scale = |k: usize| input::<f32>(inputs, k, inputs.get(k).map_or(0, |t| t.elements()));
        let (xs, ws, ys) = (scale(1)?[0], scale(4)?, scale(6)?[0]);
        let bias = if self.bias { Some(input::<i32>(inputs, 8, m)?) } else { None };
        // The reference's `x_scale * w_scale / y_scale`, each operation in float32.
        let multiplier: Vec<f64> = ws.iter().map(|&w| f64::from(xs * w / ys)).collect();
        let zero = |bytes: &[u8]| match self.y {
            DType::I8 => f64::from(bytes[0] as i8),
            _ => f64::from(bytes[0]),
        };
        let y_zero = zero(inputs.get(7).ok_or_else(|| invalid!("y_zero_point is missing"))?.bytes);
        let (lo, hi) = if self.y == DType::I8 { (-128.0, 127.0) } else { (0.0, 255.0) };
        // One byte a value, of either type.
        let y = &mut outputs.get_mut(0).ok_or_else(|| invalid!("the output is missing"))?.bytes;
        if y.len() != len {
            return Err(invalid!("the output has {} bytes, expected {len}", y.len()));
        }
        for (j, (y, &s)) in y.iter_mut().zip(&sums).enumerate() {
            let c = (j / self.plane.max(1)) % m;
            let s = s.wrapping_add(bias.map_or(0, |b| b[c]));
            let v = f64::from(s) * multiplier[if multiplier.len() == 1 { 0 } else { c }] + y_zero;
            let v = v.clamp(lo, hi).round_ties_even();
            *y = if self.y == DType::I8 { (v as i8) as u8 } else { v as u8 };
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::conv::cpu::tests::attrs as window;
    use crate::cpu::eval;
    use crate::{Tensor, TensorDesc};
    use ingot_schema::{AttrValue, DType};

    /// ConvInteger against the float Conv of its operands minus their zero points (exact:
    /// short sums of 8-bit products), int8 X with a zero point, uint8 W with one per channel.
    #[test]
    fn int32_sums_are_the_float_convs_of_the_centred_operands() {
        for (x_shape, w_shape, out_shape, attrs) in [
            // 2-D, dilated and strided, padded unevenly, 2 groups.
            (
                vec![2, 4, 7, 6],
                vec![6, 2, 3, 2],
                vec![2, 6, 3, 6],
                window(&[3, 2], &[2, 1], &[2, 3], &[1, 0, 2, 3], 2),
            ),
            // 1-D.
            (vec![1, 3, 11], vec![4, 3, 3], vec![1, 4, 6], window(&[3], &[2], &[1], &[1, 1], 1)),
        ] {
            let (xn, wn): (usize, usize) = (x_shape.iter().product(), w_shape.iter().product());
            let m = w_shape[0];
            let x: Vec<i8> = (0..xn).map(|i| (i * 71 % 256) as u8 as i8).collect();
            let w: Vec<u8> = (0..wn).map(|i| (i * 37 % 256) as u8).collect();
            let xz = -7i8;
            let wz: Vec<u8> = (0..m).map(|j| (j * 60) as u8).collect();
            let real_x: Vec<f32> = x.iter().map(|&v| f32::from(v) - f32::from(xz)).collect();
            let real_w: Vec<f32> = (w.iter().enumerate())
                .map(|(i, &v)| f32::from(v) - f32::from(wz[i / (wn / m)]))
                .collect();
            let t = |s: &[usize], v: Vec<f32>| Tensor::from_vec(s.to_vec(), &v).unwrap();
            let out = [TensorDesc::new(DType::F32, out_shape.clone())];
            let float =
                eval("Conv", &attrs, &[&t(&x_shape, real_x), &t(&w_shape, real_w)], &out).unwrap();
            let want: Vec<i32> =
                float[0].to_vec::<f32>().unwrap().iter().map(|&v| v as i32).collect();
            let attrs = attrs
                .with("x_zero_point", AttrValue::Int(1))
                .with("w_zero_point", AttrValue::Int(1));
            let inputs = [
                Tensor::from_vec(x_shape.clone(), &x).unwrap(),
                Tensor::from_vec(w_shape.clone(), &w).unwrap(),
                Tensor::from_vec(vec![], &[xz]).unwrap(),
                Tensor::from_vec(vec![m], &wz).unwrap(),
            ];
            let refs: Vec<&Tensor> = inputs.iter().collect();
            let out = [TensorDesc::new(DType::I32, out_shape)];
            let got = eval("ConvInteger", &attrs, &refs, &out).unwrap();
            assert_eq!(got[0].to_vec::<i32>().unwrap(), want, "{x_shape:?} * {w_shape:?}");
        }
    }

    /// QLinearConv by hand: a 1x1 conv of uint8 x [10, 20, 30, 40] (zero 10, scale 0.5) by
    /// int8 w [2, -3] (zero 1, scales 0.25 and 0.5 per channel), B [4, -8], onto int8 y of
    /// scale 0.2 and zero -5. Channel 0: (x - 10) + 4 = 4, 14, 24, 34, times 0.625, minus 5:
    /// -2.5, 3.75, 10, 16.25, rounded half to even. Channel 1: -4 (x - 10) - 8 times 1.25,
    /// minus 5: -15, -65, -115, -165, the last saturated.
    #[test]
    fn qlinear_conv_requantizes_per_channel_as_the_reference() {
        let attrs = ingot_schema::Attrs::new()
            .with("kernel_shape", AttrValue::Ints(vec![1, 1]))
            .with("strides", AttrValue::Ints(vec![1, 1]))
            .with("dilations", AttrValue::Ints(vec![1, 1]))
            .with("pads", AttrValue::Ints(vec![0; 4]))
            .with("group", AttrValue::Int(1))
            .with("bias", AttrValue::Int(1));
        let t = |shape: Vec<usize>, v: &[f32]| Tensor::from_vec(shape, v).unwrap();
        let inputs = [
            Tensor::from_vec(vec![1, 1, 2, 2], &[10u8, 20, 30, 40]).unwrap(),
            t(vec![], &[0.5]),
            Tensor::from_vec(vec![], &[10u8]).unwrap(),
            Tensor::from_vec(vec![2, 1, 1, 1], &[2i8, -3]).unwrap(),
            t(vec![2], &[0.25, 0.5]),
            Tensor::from_vec(vec![], &[1i8]).unwrap(),
            t(vec![], &[0.2]),
            Tensor::from_vec(vec![], &[-5i8]).unwrap(),
            Tensor::from_vec(vec![2], &[4i32, -8]).unwrap(),
        ];
        let refs: Vec<&Tensor> = inputs.iter().collect();
        let out = [TensorDesc::new(DType::I8, [1, 2, 2, 2])];
        let y = eval("QLinearConv", &attrs, &refs, &out).unwrap();
        assert_eq!(y[0].as_slice::<i8>().unwrap(), [-2, 4, 10, 16, -15, -65, -115, -128]);
        // A hostile bundle's operand counts are refused, not indexed past: three w_scales
        // for two channels, no y_zero_point.
        let mut bad = inputs.clone();
        bad[4] = t(vec![3], &[0.25, 0.5, 1.0]);
        let refs: Vec<&Tensor> = bad.iter().collect();
        assert!(eval("QLinearConv", &attrs, &refs, &out).is_err());
        let mut bad = inputs.clone();
        bad[7] = Tensor::from_vec(vec![0], &[0i8; 0]).unwrap();
        let refs: Vec<&Tensor> = bad.iter().collect();
        assert!(eval("QLinearConv", &attrs, &refs, &out).is_err());
    }
}
