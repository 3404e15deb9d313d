//! Movement kernels (ops and canonical attributes: ops/src/movement/cpu.rs).
//!
//! Most ops are one strided copy, as on the CPU ([`Copy`]): an invocation takes one element of
//! an iteration space, splits its index into coordinates, and reads the source at a literal
//! base plus, per dim, an affine term, a padded coordinate (Pad's modes, or the fill value),
//! or indices read from a second tensor (Gather, GatherND, GatherElements); Trilu adds a band
//! outside which it writes the fill value. It writes the destination at its own index, or
//! (Concat's slabs) at literal strides. Concat runs one dispatch per input, Split one per
//! output.
//!
//! Values move as u32 words, whatever the dtype: 4-byte types as one, 8-byte types as two (an
//! innermost dim of 2); 1- and 2-byte types as whole words where the copy groups into them,
//! else packed, one invocation per output word assembling its 4 or 2 elements (the last word
//! keeps the bytes past the tensor's end). Dims are merged where they step as one, and the copy
//! moves vec4 words when its innermost dim is a contiguous, aligned multiple of 4.
//!
//! CumSum (a prefix per output element, summed in the CPU's order), OneHot and the scatters
//! (the data copied, then the updates written; with a reduction, updates that may meet run in
//! order in one invocation) have their own small kernels.

use crate::no_kernel;
use crate::vulkan::{Binding, Dispatch, Grid, KernelCx, NoKernel, Slot, header};
use ingot_schema::{AttrValue, DType};
use std::fmt::Write;

#[derive(Clone, Copy, Debug, PartialEq)]
enum PadMode {
    Constant,
    Edge,
    Wrap,
    Reflect,
}

/// How a coordinate of one dim moves the source offset, in source units.
#[derive(Clone, Debug, PartialEq)]
enum Src {
    /// `c * stride`.
    Affine(i64),
    /// Source coordinate `c - before` of a dim of `n`, mapped by the mode (constant: outside
    /// reads the fill value), times `stride`.
    Pad { n: i64, before: i64, mode: PadMode, stride: i64 },
    /// Index tuple `c` of the index tensor (Gather: one component; GatherND: several):
    /// component j, wrapped into `[0, n_j)`, times `stride_j`; with batches (GatherND's
    /// batch dims), `(c / per_batch) * batch_stride` more.
    Index { comps: Vec<(i64, i64)>, batch: Option<(u64, i64)> },
    /// GatherElements: the index tensor's element at the iteration's own element, wrapped into
    /// `[0, n)`, times `stride`.
    Element { n: i64, stride: i64 },
}

impl Src {
    /// Every stride of the source offset.
    fn strides_mut(&mut self) -> Vec<&mut i64> {
        match self {
            Src::Affine(s) | Src::Pad { stride: s, .. } | Src::Element { stride: s, .. } => {
                vec![s]
            }
            Src::Index { comps, batch } => {
                comps.iter_mut().map(|(_, s)| s).chain(batch.as_mut().map(|(_, s)| s)).collect()
            }
        }
    }

    /// Whether it reads the index tensor.
    fn reads_indices(&self) -> bool {
        match self {
            Src::Index { comps, .. } => !comps.is_empty(),
            Src::Element { .. } => true,
            _ => false,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
struct Dim {
    len: u64,
    src: Src,
    /// Destination stride.
    dst: i64,
}

/// Trilu's band: the element at (row, col), coordinates of dims `row` and `col`, is kept
/// where `col - row >= k` (upper) or `<= k` (lower), else it is the fill value.
#[derive(Clone, Copy, Debug)]
struct Band {
    row: usize,
    col: usize,
    k: i64,
    upper: bool,
}

/// A strided copy of one source tensor into one destination tensor.
#[derive(Clone, Debug)]
struct Copy {
    dims: Vec<Dim>,
    src_base: i64,
    dst_base: i64,
    /// The fill value's bytes, one element (constant Pad; empty: zeros).
    fill: Vec<u8>,
    /// u32 words per index of the index tensor (1 for int32, 2 for int64).
    index_words: u64,
    /// Iteration units per element (2 once 8-byte elements move as words).
    units: u64,
    band: Option<Band>,
}

impl Copy {
    /// Writes the destination contiguously, in the order of `dims`.
    fn new(dims: Vec<(u64, Src)>, src_base: i64) -> Copy {
        let mut out: Vec<Dim> =
            dims.into_iter().map(|(len, src)| Dim { len, src, dst: 0 }).collect();
        let mut p = 1i64;
        for d in out.iter_mut().rev() {
            d.dst = p;
            p *= d.len as i64;
        }
        Copy {
            dims: out,
            src_base,
            dst_base: 0,
            fill: Vec::new(),
            index_words: 1,
            units: 1,
            band: None,
        }
    }

    /// An affine copy: `(len, source stride)` per dim.
    fn affine(dims: &[(usize, i64)], src_base: i64) -> Copy {
        Copy::new(dims.iter().map(|&(len, s)| (len as u64, Src::Affine(s))).collect(), src_base)
    }

    fn len(&self) -> u64 {
        self.dims.iter().map(|d| d.len).product()
    }

    /// Elements of `words` u32 words: every unit scales, and a dim of `words` runs innermost.
    fn in_words(mut self, words: u64) -> Copy {
        if words == 1 {
            return self;
        }
        let w = words as i64;
        for d in &mut self.dims {
            d.dst *= w;
            d.src.strides_mut().into_iter().for_each(|s| *s *= w);
        }
        self.src_base *= w;
        self.dst_base *= w;
        self.units *= words;
        self.dims.push(Dim { len: words, src: Src::Affine(1), dst: 1 });
        self
    }

    /// Drops affine dims of 1 and merges neighbours that step as one (not with a band, whose
    /// dims keep their places).
    fn simplify(mut self) -> Copy {
        if self.band.is_some() {
            return self;
        }
        let mut dims: Vec<Dim> = Vec::with_capacity(self.dims.len());
        for d in std::mem::take(&mut self.dims) {
            if d.len == 1 && matches!(d.src, Src::Affine(_)) {
                continue;
            }
            if let (Some(o), Src::Affine(s)) = (dims.last_mut(), &d.src)
                && o.src == Src::Affine(s * d.len as i64)
                && o.dst == d.dst * d.len as i64
            {
                o.len *= d.len;
                o.src = Src::Affine(*s);
                o.dst = d.dst;
                continue;
            }
            dims.push(d);
        }
        self.dims = dims;
        self
    }

    /// The same copy in units of `k` of its units (vec4 of words, words of bytes), if its
    /// innermost dim is a contiguous run of whole units and every other step lines up.
    fn group(&self, k: i64) -> Option<Copy> {
        let last = self.dims.last()?;
        let fits = |v: i64| v % k == 0;
        let ok = self.band.is_none()
            && !self.dims.iter().any(|d| matches!(d.src, Src::Element { .. }))
            && last.src == Src::Affine(1)
            && last.dst == 1
            && fits(last.len as i64)
            && fits(self.src_base)
            && fits(self.dst_base)
            && self.dims[..self.dims.len() - 1].iter().all(|d| {
                let mut src = d.src.clone();
                fits(d.dst) && src.strides_mut().into_iter().all(|s| fits(*s))
            });
        if !ok {
            return None;
        }
        let mut v = self.clone();
        let n = v.dims.len();
        for (i, d) in v.dims.iter_mut().enumerate() {
            if i + 1 == n {
                d.len /= k as u64;
                continue;
            }
            d.dst /= k;
            d.src.strides_mut().into_iter().for_each(|s| *s /= k);
        }
        v.src_base /= k;
        v.dst_base /= k;
        Some(v.simplify())
    }

    /// Whether some elements are the fill value.
    fn fills(&self) -> bool {
        self.band.is_some()
            || self.dims.iter().any(|d| matches!(d.src, Src::Pad { mode: PadMode::Constant, .. }))
    }

    /// Whether some dim reads the index tensor.
    fn reads_indices(&self) -> bool {
        self.dims.iter().any(|d| d.src.reads_indices())
    }

    /// The least and greatest source and destination offsets it touches.
    fn ranges(&self) -> ((i64, i64), (i64, i64)) {
        let (mut src, mut dst) = ((self.src_base, self.src_base), (self.dst_base, self.dst_base));
        let add = |r: &mut (i64, i64), stride: i64, last: i64| {
            let (a, b) = (0, stride * last);
            r.0 += a.min(b);
            r.1 += a.max(b);
        };
        for d in &self.dims {
            let last = d.len as i64 - 1;
            add(&mut dst, d.dst, last);
            // An empty padded dim reads nothing.
            match &d.src {
                Src::Affine(s) => add(&mut src, *s, last),
                Src::Pad { n, stride, .. } | Src::Element { n, stride } => {
                    add(&mut src, *stride, (n - 1).max(0))
                }
                Src::Index { comps, batch } => {
                    for &(n, stride) in comps {
                        add(&mut src, stride, (n - 1).max(0));
                    }
                    if let Some((per, stride)) = *batch {
                        add(&mut src, stride, last / per.max(1) as i64);
                    }
                }
            }
        }
        (src, dst)
    }

    /// Whether each destination element is its source element at the same index.
    fn is_identity(&self) -> bool {
        self.src_base == self.dst_base
            && !self.fills()
            && self.dims.iter().all(|d| d.src == Src::Affine(d.dst))
            && self.contiguous()
    }

    /// Whether the destination offset is the iteration index.
    fn contiguous(&self) -> bool {
        let mut p = 1;
        for d in self.dims.iter().rev() {
            if d.dst != p {
                return false;
            }
            p *= d.len as i64;
        }
        self.dst_base == 0
    }
}

pub fn lower(cx: &KernelCx) -> Result<Vec<Dispatch>, NoKernel> {
    let attr_err = |e: ingot_schema::AttrError| no_kernel!("{}: {e}", cx.op);
    let (x, y) = match (cx.inputs.first(), cx.outputs.first()) {
        (Some(x), Some(y)) => (x, y),
        _ => return Err(no_kernel!("{} without an input or output", cx.op)),
    };
    match cx.op {
        "CumSum" => return cum_sum(cx),
        "OneHot" => return one_hot(cx),
        "ScatterND" | "ScatterElements" => return scatter(cx),
        _ => {}
    }
    let dt = x.desc.dtype;
    let esize = dt.size();
    // Gather's indices and Dropout's mask have their own types.
    let data = match cx.op {
        "Gather" | "GatherElements" | "GatherND" => &cx.inputs[..1],
        _ => cx.inputs,
    };
    let outs = match cx.op {
        "Dropout" => &cx.outputs[..1],
        _ => cx.outputs,
    };
    if let Some(o) = data.iter().chain(outs).find(|o| o.desc.dtype != dt) {
        return Err(cx.dtype(o.desc.dtype));
    }
    let shape = &x.desc.shape;
    let strides = contiguous(shape);
    let one = |copy: Copy| dispatch(cx, copy, 0, 0, esize);
    match cx.op {
        "Reshape" | "Flatten" | "Squeeze" | "Unsqueeze" | "Identity" => {
            one(Copy::affine(&[(x.desc.elements(), 1)], 0))
        }
        "Dropout" => {
            let mut d = one(Copy::affine(&[(x.desc.elements(), 1)], 0))?;
            if let Some(mask) = cx.outputs.get(1) {
                // Inference: the mask is all true, a fill with nothing to read.
                if mask.desc.dtype != DType::Bool {
                    return Err(cx.dtype(mask.desc.dtype));
                }
                let src = Src::Pad { n: 0, before: 0, mode: PadMode::Constant, stride: 0 };
                let mut ones = Copy::new(vec![(mask.desc.elements() as u64, src)], 0);
                ones.fill = vec![1];
                d.extend(dispatch(cx, ones, 0, 1, 1)?);
            }
            Ok(d)
        }
        "Transpose" => {
            let perm = cx.attrs.ints("perm").map_err(attr_err)?;
            let dims = perm
                .iter()
                .map(|&p| {
                    let p = usize::try_from(p).ok().filter(|&p| p < shape.len());
                    p.map(|p| (shape[p], strides[p]))
                        .ok_or_else(|| no_kernel!("Transpose perm {perm:?}"))
                })
                .collect::<Result<Vec<_>, _>>()?;
            one(Copy::affine(&dims, 0))
        }
        "Slice" => {
            let a = cx.attrs;
            let (starts, ends, steps) = (
                a.ints("starts").map_err(attr_err)?,
                a.ints("ends").map_err(attr_err)?,
                a.ints("steps").map_err(attr_err)?,
            );
            if [starts.len(), ends.len(), steps.len()] != [shape.len(); 3] {
                return Err(no_kernel!("Slice attributes do not match rank {}", shape.len()));
            }
            let mut dims = Vec::with_capacity(shape.len());
            let mut base = 0;
            for d in 0..shape.len() {
                let (s, e, k) = (starts[d], ends[d], steps[d]);
                let span = match k {
                    0 => return Err(no_kernel!("Slice step 0")),
                    k if k > 0 => i128::from(e) - i128::from(s),
                    _ => i128::from(s) - i128::from(e),
                };
                let len = span.max(0).unsigned_abs().div_ceil(k.unsigned_abs().into());
                let len = usize::try_from(len).map_err(|_| no_kernel!("Slice too long"))?;
                if len > 0 {
                    base += s * strides[d];
                }
                dims.push((len, k.saturating_mul(strides[d])));
            }
            one(Copy::affine(&dims, base))
        }
        "Pad" => {
            let pads = cx.attrs.ints("pads").map_err(attr_err)?;
            let rank = shape.len();
            if pads.len() != 2 * rank {
                return Err(no_kernel!("Pad pads {pads:?} for rank {rank}"));
            }
            let mode = match cx.attrs.text("mode").map_err(attr_err)? {
                "constant" => PadMode::Constant,
                "edge" => PadMode::Edge,
                "wrap" => PadMode::Wrap,
                "reflect" => PadMode::Reflect,
                m => return Err(no_kernel!("Pad mode {m}")),
            };
            let fill = match mode {
                PadMode::Constant => encode(cx.attrs.get("value"), dt)?,
                _ => Vec::new(),
            };
            let mut dims = Vec::with_capacity(rank);
            for d in 0..rank {
                let n = shape[d] as i64;
                let len = n + pads[d] + pads[d + rank];
                if len < 0 || (n == 0 && len > 0 && mode != PadMode::Constant) {
                    return Err(no_kernel!("Pad {pads:?} of {shape:?}"));
                }
                let src = Src::Pad { n, before: pads[d], mode, stride: strides[d] };
                dims.push((len as u64, src));
            }
            let mut copy = Copy::new(dims, 0);
            copy.fill = fill;
            one(copy)
        }
        "Tile" => {
            let reps = cx.attrs.ints("repeats").map_err(attr_err)?;
            if reps.len() != shape.len() || reps.iter().any(|&r| r < 0) {
                return Err(no_kernel!("Tile repeats {reps:?} for {shape:?}"));
            }
            // Output dim d of r * n is read as two dims: r (stride 0), then n.
            let dims: Vec<(usize, i64)> = (0..shape.len())
                .flat_map(|d| [(reps[d] as usize, 0), (shape[d], strides[d])])
                .collect();
            one(Copy::affine(&dims, 0))
        }
        "Expand" => {
            let out = &y.desc.shape;
            let off = out
                .len()
                .checked_sub(shape.len())
                .ok_or_else(|| no_kernel!("Expand of {shape:?} to {out:?}"))?;
            let dims = out
                .iter()
                .enumerate()
                .map(|(d, &n)| match d.checked_sub(off) {
                    Some(i) if shape[i] == n => Ok((n, strides[i])),
                    Some(i) if shape[i] != 1 => Err(no_kernel!("Expand of {shape:?} to {out:?}")),
                    _ => Ok((n, 0)),
                })
                .collect::<Result<Vec<_>, _>>()?;
            one(Copy::affine(&dims, 0))
        }
        "DepthToSpace" | "SpaceToDepth" => {
            let b = cx.attrs.int("blocksize").map_err(attr_err)?;
            let &[n, c, h, w] = shape.as_slice() else {
                return Err(no_kernel!("{} of rank {}", cx.op, shape.len()));
            };
            let b = usize::try_from(b)
                .ok()
                .filter(|&b| b > 0)
                .ok_or_else(|| no_kernel!("{} blocksize {b}", cx.op))?;
            let mode = cx.attrs.text("mode").map_err(attr_err)?;
            let s = |v: usize| v as i64;
            let dims = if cx.op == "DepthToSpace" {
                if c % (b * b) != 0 {
                    return Err(no_kernel!("DepthToSpace of {c} channels by {b}"));
                }
                let (oc, hw) = (c / (b * b), h * w);
                // Input channel of (c', b1, b2): DCR (b1 * b + b2) * oc + c', CRD (c' * b + b1) * b + b2.
                let (s_c, s_b1, s_b2) = match mode {
                    "DCR" => (hw, b * oc * hw, oc * hw),
                    "CRD" => (b * b * hw, b * hw, hw),
                    m => return Err(no_kernel!("DepthToSpace mode {m}")),
                };
                vec![(n, s(c * hw)), (oc, s(s_c)), (h, s(w)), (b, s(s_b1)), (w, 1), (b, s(s_b2))]
            } else {
                if h % b != 0 || w % b != 0 {
                    return Err(no_kernel!("SpaceToDepth of {h}x{w} by {b}"));
                }
                let (b1, b2, ch) = ((b, s(w)), (b, 1), (c, s(h * w)));
                let blocks = match mode {
                    "DCR" => [b1, b2, ch],
                    "CRD" => [ch, b1, b2],
                    m => return Err(no_kernel!("SpaceToDepth mode {m}")),
                };
                [(n, s(c * h * w))]
                    .into_iter()
                    .chain(blocks)
                    .chain([(h / b, s(b * w)), (w / b, s(b))])
                    .collect()
            };
            one(Copy::affine(&dims, 0))
        }
        "Split" | "Concat" => {
            let axis = cx.attrs.int("axis").map_err(attr_err)?;
            let (joined, parts) = if cx.op == "Split" { (x, cx.outputs) } else { (y, cx.inputs) };
            let js = &joined.desc.shape;
            let axis = usize::try_from(axis)
                .ok()
                .filter(|&a| a < js.len())
                .ok_or_else(|| no_kernel!("{} axis {axis} for rank {}", cx.op, js.len()))?;
            let outer = js[..axis].iter().product::<usize>();
            let inner = js[axis + 1..].iter().product::<usize>();
            let row = js[axis] * inner;
            let mut at = 0;
            let mut dispatches = Vec::new();
            for (k, p) in parts.iter().enumerate() {
                let ps = &p.desc.shape;
                let fits = ps.len() == js.len()
                    && ps.iter().zip(js).enumerate().all(|(d, (a, b))| d == axis || a == b);
                if !fits || at + ps[axis] > js[axis] {
                    return Err(no_kernel!("{} part {ps:?} of {js:?}", cx.op));
                }
                let (slab, start) = (ps[axis] * inner, (at * inner) as i64);
                dispatches.extend(if cx.op == "Split" {
                    let copy = Copy::affine(&[(outer, row as i64), (slab, 1)], start);
                    dispatch(cx, copy, 0, k, esize)?
                } else {
                    // The part is read contiguously and written at its slab's place.
                    let mut copy = Copy::affine(&[(outer, slab as i64), (slab, 1)], 0);
                    copy.dims[0].dst = row as i64;
                    copy.dst_base = start;
                    match dispatch(cx, copy, k, 0, esize) {
                        Ok(d) => d,
                        // Slabs that share output words: one kernel writes every word.
                        Err(_) if esize < 4 => {
                            return concat_packed(
                                cx,
                                outer,
                                row,
                                &slabs_of(parts, axis, inner),
                                esize,
                            );
                        }
                        Err(e) => return Err(e),
                    }
                });
                at += ps[axis];
            }
            if at != js[axis] {
                return Err(no_kernel!("{} parts of {js:?} add up to {at}", cx.op));
            }
            Ok(dispatches)
        }
        "Gather" | "GatherElements" | "GatherND" => {
            let [_, idx] = cx.inputs else {
                return Err(no_kernel!("{} with {} inputs", cx.op, cx.inputs.len()));
            };
            let index_words = index_words(cx, 1)?;
            let is = &idx.desc.shape;
            let rank = shape.len();
            let mut copy = match cx.op {
                "GatherND" => {
                    let b = cx.attrs.int("batch_dims").map_err(attr_err)?;
                    let b =
                        usize::try_from(b).map_err(|_| no_kernel!("GatherND batch_dims {b}"))?;
                    let k = is.last().copied().unwrap_or(0);
                    if is.is_empty()
                        || b >= rank.min(is.len())
                        || k > rank - b
                        || shape[..b] != is[..b]
                    {
                        return Err(no_kernel!("GatherND of {shape:?} by {is:?}"));
                    }
                    let tuples = is[..is.len() - 1].iter().product::<usize>() as u64;
                    let per_batch = is[b..is.len() - 1].iter().product::<usize>() as u64;
                    let comps = (b..b + k).map(|d| (shape[d] as i64, strides[d])).collect();
                    let batch_stride = if b > 0 { strides[b - 1] } else { 0 };
                    let slice = shape[b + k..].iter().product::<usize>();
                    Copy::new(
                        vec![
                            (
                                tuples,
                                Src::Index {
                                    comps,
                                    batch: (b > 0).then_some((per_batch, batch_stride)),
                                },
                            ),
                            (slice as u64, Src::Affine(1)),
                        ],
                        0,
                    )
                }
                "GatherElements" => {
                    let axis = axis_attr(cx, rank)?;
                    if is.len() != rank || *is != y.desc.shape {
                        return Err(no_kernel!("GatherElements of {shape:?} by {is:?}"));
                    }
                    let dims = (0..rank)
                        .map(|d| {
                            let src = if d == axis {
                                Src::Element { n: shape[d] as i64, stride: strides[d] }
                            } else {
                                Src::Affine(strides[d])
                            };
                            (is[d] as u64, src)
                        })
                        .collect();
                    Copy::new(dims, 0)
                }
                _ => {
                    let axis = axis_attr(cx, rank)?;
                    let inner = shape[axis + 1..].iter().product::<usize>() as i64;
                    let n = shape[axis] as i64;
                    let outer = shape[..axis].iter().product::<usize>() as u64;
                    Copy::new(
                        vec![
                            (outer, Src::Affine(n * inner)),
                            (
                                idx.desc.elements() as u64,
                                Src::Index { comps: vec![(n, inner)], batch: None },
                            ),
                            (inner as u64, Src::Affine(1)),
                        ],
                        0,
                    )
                }
            };
            copy.index_words = index_words;
            one(copy)
        }
        "Trilu" => {
            let &[.., rows, cols] = shape.as_slice() else {
                return Err(no_kernel!("Trilu of rank {}", shape.len()));
            };
            let batch = shape[..shape.len() - 2].iter().product::<usize>();
            let bound = (rows + cols) as i64;
            let mut copy =
                Copy::affine(&[(batch, (rows * cols) as i64), (rows, cols as i64), (cols, 1)], 0);
            copy.band = Some(Band {
                row: 1,
                col: 2,
                k: cx.attrs.int("k").map_err(attr_err)?.clamp(-bound, bound),
                upper: cx.attrs.int("upper").map_err(attr_err)? != 0,
            });
            one(copy)
        }
        op => Err(no_kernel!("no Vulkan kernel for {op}")),
    }
}

/// The u32 words per index of an index tensor (the low word of an int64 is the index).
fn index_words(cx: &KernelCx, i: usize) -> Result<u64, NoKernel> {
    match cx.inputs.get(i).map(|o| o.desc.dtype) {
        Some(DType::I32) => Ok(1),
        Some(DType::I64) => Ok(2),
        Some(other) => Err(cx.dtype(other)),
        None => Err(no_kernel!("{} without input {i}", cx.op)),
    }
}

/// WGSL wrapping index `raw` (an i32 expression) into `[0, n)`, clamping what is outside.
fn wrap(raw: &str, n: usize) -> String {
    format!("clamp(select({raw}, {raw} + {n}, {raw} < 0), 0, {})", n.max(1) - 1)
}

/// A kernel of one invocation per unit of `count`, from a body using `g`.
fn simple(
    cx: &KernelCx,
    label: String,
    bindings: Vec<Binding>,
    count: u64,
    prelude: &str,
    body: &str,
) -> Result<Vec<Dispatch>, NoKernel> {
    if count == 0 {
        return Ok(Vec::new());
    }
    for b in &bindings {
        let o = match b.slot {
            Slot::Input(i) => &cx.inputs[i],
            Slot::Output(i) => &cx.outputs[i],
        };
        if o.byte_offset % 4 != 0 || o.desc.bytes() == 0 {
            return Err(no_kernel!("{}: tensor '{}' is empty or not word-aligned", cx.op, b.name));
        }
    }
    let grid = Grid::new(count, 64)?;
    let mut s = header(&bindings);
    s.push_str(prelude);
    let _ = writeln!(s, "{} {{", grid.entry());
    let _ = writeln!(s, "    let g = {};", grid.index());
    let _ = writeln!(s, "    if (g >= {count}u) {{ return; }}");
    s.push_str(body);
    s.push_str("}\n");
    Ok(vec![Dispatch { label, wgsl: s, groups: grid.groups, bindings, ..Default::default() }])
}

/// CumSum: each output element sums its prefix along the axis, in the CPU's order (so floats
/// round the same). f32, i32, u32 (wrapping), int64 and uint64.
fn cum_sum(cx: &KernelCx) -> Result<Vec<Dispatch>, NoKernel> {
    let (x, y) = (&cx.inputs[0], &cx.outputs[0]);
    if x.desc != y.desc {
        return Err(no_kernel!("CumSum of {:?} to {:?}", x.desc, y.desc));
    }
    if cx.in_place().is_some() {
        return Err(no_kernel!("CumSum in place"));
    }
    let shape = &x.desc.shape;
    let axis = axis_attr(cx, shape.len())?;
    let flag = |name| cx.attrs.int(name).map(|v| v != 0).map_err(|e| no_kernel!("CumSum: {e}"));
    let (exclusive, reverse) = (flag("exclusive")?, flag("reverse")?);
    let (ty, zero, add, wide) = match x.desc.dtype {
        DType::F32 => ("f32", "0.0", "acc + v", false),
        DType::I32 => ("i32", "0i", "acc + v", false),
        DType::U32 => ("u32", "0u", "acc + v", false),
        DType::I64 | DType::U64 => (
            "vec2<u32>",
            "vec2<u32>(0u)",
            "vec2<u32>(acc.x + v.x, acc.y + v.y + select(0u, 1u, acc.x + v.x < acc.x))",
            true,
        ),
        other => return Err(cx.dtype(other)),
    };
    let n = shape[axis];
    let inner = shape[axis + 1..].iter().product::<usize>();
    let at = |e: &str| {
        if wide {
            format!("vec2<u32>(x[offsets.x + ({e}) * 2u], x[offsets.x + ({e}) * 2u + 1u])")
        } else {
            format!("x[offsets.x + {e}]")
        }
    };
    let step = if reverse { format!("{}u - t", n - 1) } else { "t".into() };
    let mut b = String::new();
    let _ = writeln!(b, "    let j = (g / {inner}u) % {n}u;");
    let _ = writeln!(b, "    let base = g - j * {inner}u;");
    let _ = writeln!(b, "    var acc = {zero};");
    let _ = writeln!(b, "    for (var t = 0u; t < {n}u; t = t + 1u) {{");
    let _ = writeln!(b, "        let jj = {step};");
    if exclusive {
        let _ = writeln!(b, "        if (jj == j) {{ break; }}");
    }
    let _ = writeln!(b, "        let v = {};", at(&format!("base + jj * {inner}u")));
    let _ = writeln!(b, "        acc = {add};");
    if !exclusive {
        let _ = writeln!(b, "        if (jj == j) {{ break; }}");
    }
    let _ = writeln!(b, "    }}");
    if wide {
        let _ = writeln!(
            b,
            "    y[offsets.y + g * 2u] = acc.x;\n    y[offsets.y + g * 2u + 1u] = acc.y;"
        );
    } else {
        let _ = writeln!(b, "    y[offsets.y + g] = acc;");
    }
    let storage = if wide { "u32" } else { ty };
    let bindings = vec![Binding::input("x", 0, storage), Binding::output("y", 0, storage)];
    let count = x.desc.elements() as u64;
    simple(cx, format!("cumsum_{count}_{n}"), bindings, count, "", &b)
}

/// OneHot: `[outer, depth, inner]`, `on` where the index at `[outer, inner]` (negative from
/// `depth`) is the middle coordinate, `off` elsewhere. Int32, int64 or f32 indices; values of
/// any 4- or 8-byte type.
fn one_hot(cx: &KernelCx) -> Result<Vec<Dispatch>, NoKernel> {
    let [idx, values] = cx.inputs else {
        return Err(no_kernel!("OneHot with {} inputs", cx.inputs.len()));
    };
    let y = &cx.outputs[0];
    let depth = cx.attrs.int("depth").map_err(|e| no_kernel!("OneHot: {e}"))?;
    let depth = usize::try_from(depth).map_err(|_| no_kernel!("OneHot depth {depth}"))?;
    let axis = axis_attr(cx, idx.desc.shape.len() + 1)?;
    let is = &idx.desc.shape;
    let shape = [&is[..axis], &[depth][..], &is[axis..]].concat();
    if values.desc.elements() != 2 || y.desc.shape != shape || y.desc.dtype != values.desc.dtype {
        return Err(no_kernel!("OneHot of {is:?} to {:?}", y.desc.shape));
    }
    let units = match values.desc.dtype.size() {
        4 => 1,
        8 => 2,
        _ => return Err(cx.dtype(values.desc.dtype)),
    };
    let inner = is[axis..].iter().product::<usize>();
    // The index as i32 `r`, and whether it is one (int64 or f32 values beyond i32 never are).
    let (load, valid) = match idx.desc.dtype {
        DType::I32 => ("    let r = bitcast<i32>(ix[offsets.ix + p]);\n", "true"),
        DType::I64 => (
            "    let r = bitcast<i32>(ix[offsets.ix + p * 2u]);\n",
            "ix[offsets.ix + p * 2u + 1u] == select(0u, 0xffffffffu, r < 0)",
        ),
        // As the CPU's `v as i64`: toward zero, NaN is 0.
        DType::F32 => (
            "    let w = ix[offsets.ix + p];\n    let nan = (w & 0x7fffffffu) > 0x7f800000u;\n    let f = bitcast<f32>(w);\n    let r = select(i32(trunc(clamp(f, -2147483648.0, 2147483520.0))), 0, nan);\n",
            "nan || abs(f) < 2147483648.0",
        ),
        other => return Err(cx.dtype(other)),
    };
    let mut b = String::new();
    let _ = writeln!(b, "    let e = g / {units}u;");
    let _ = writeln!(b, "    let j = i32((e / {inner}u) % {depth}u);");
    let _ = writeln!(b, "    let p = (e / {}u) * {inner}u + e % {inner}u;", depth * inner);
    b.push_str(load);
    let _ = writeln!(b, "    let hot = ({valid}) && select(r, r + {depth}, r < 0) == j;");
    let _ = writeln!(
        b,
        "    y[offsets.y + g] = v[offsets.v + g % {units}u + select(0u, {units}u, hot)];"
    );
    let bindings = vec![
        Binding::input("ix", 0, "u32"),
        Binding::input("v", 1, "u32"),
        Binding::output("y", 0, "u32"),
    ];
    let count = y.desc.elements() as u64 * units;
    simple(cx, format!("onehot_{count}"), bindings, count, "", &b)
}

/// ScatterND and ScatterElements: the data copied to the output, then each update written
/// where its index sends it. Without a reduction every update is a lane (4- and 8-byte types;
/// of duplicate indices one wins, where the CPU's last one does); with one (f32, i32, u32)
/// the updates that may meet run in order in one invocation, as on the CPU.
fn scatter(cx: &KernelCx) -> Result<Vec<Dispatch>, NoKernel> {
    let [data, _, updates] = cx.inputs else {
        return Err(no_kernel!("{} with {} inputs", cx.op, cx.inputs.len()));
    };
    let y = &cx.outputs[0];
    let dt = data.desc.dtype;
    if updates.desc.dtype != dt || y.desc != data.desc {
        return Err(no_kernel!("{} of {:?} by {:?}", cx.op, data.desc, updates.desc));
    }
    let units = match dt.size() {
        4 => 1u64,
        8 => 2,
        _ => return Err(cx.dtype(dt)),
    };
    let mut d: Vec<Dispatch> = if cx.in_place() == Some(0) {
        Vec::new()
    } else if cx.in_place().is_some() {
        return Err(no_kernel!("{} in place over its updates", cx.op));
    } else {
        dispatch(cx, Copy::affine(&[(data.desc.elements(), 1)], 0), 0, 0, dt.size())?
    };
    if cx.inputs[1].desc.elements() == 0 || updates.desc.elements() == 0 {
        return Ok(d);
    }
    let words = index_words(cx, 1)?;
    let shape = &data.desc.shape;
    let st = contiguous(shape);
    let us = &updates.desc.shape;
    let is = &cx.inputs[1].desc.shape;
    // `fn dst(e)`: where update element `e` goes, in elements.
    let mut f = String::from("fn dst(e: u32) -> u32 {\n");
    // The order a reduction must keep: updates that may meet, in the CPU's order, run in
    // one invocation; `lanes` of them run side by side, each a loop of `steps`.
    let (lanes, steps, update_at) = if cx.op == "ScatterND" {
        let k = is.last().copied().unwrap_or(0);
        let tuples = is[..is.len().saturating_sub(1)].iter().product::<usize>();
        let slice = shape.get(k..).map_or(0, |s| s.iter().product::<usize>());
        if is.is_empty() || k > shape.len() || updates.desc.elements() != tuples * slice {
            return Err(no_kernel!("ScatterND of {shape:?} by {is:?}"));
        }
        let _ = writeln!(f, "    let t = e / {}u;", slice.max(1));
        let mut terms = vec![format!("i32(e % {}u)", slice.max(1))];
        for j in 0..k {
            let _ = writeln!(
                f,
                "    let r{j} = bitcast<i32>(ix[offsets.ix + (t * {k}u + {j}u) * {words}u]);"
            );
            terms.push(format!("{} * {}", wrap(&format!("r{j}"), shape[j]), st[j]));
        }
        let _ = writeln!(f, "    return u32({});\n}}", terms.join(" + "));
        // Lane: an element of the slice; steps: the tuples.
        (slice, tuples, format!("s * {slice}u + g"))
    } else {
        let axis = axis_attr(cx, shape.len())?;
        let fits = is.len() == shape.len()
            && is == us
            && is.iter().zip(shape).enumerate().all(|(d, (i, n))| d == axis || i <= n);
        if !fits {
            return Err(no_kernel!("ScatterElements of {shape:?} by {is:?}"));
        }
        let _ = writeln!(f, "    let r = bitcast<i32>(ix[offsets.ix + e * {words}u]);");
        let ist = contiguous(is);
        let terms: Vec<String> = (0..shape.len())
            .map(|d| {
                let c = if d == axis {
                    wrap("r", shape[d])
                } else {
                    format!("i32((e / {}u) % {}u)", ist[d], is[d])
                };
                format!("{c} * {}", st[d])
            })
            .collect();
        let _ = writeln!(f, "    return u32({});\n}}", terms.join(" + "));
        // Lane: the coordinates off the axis; steps: along the axis.
        let inner = is[axis + 1..].iter().product::<usize>();
        let n = is[axis];
        (
            updates.desc.elements() / n.max(1),
            n,
            format!("((g / {inner}u) * {n}u + s) * {inner}u + g % {inner}u"),
        )
    };
    let combine = match cx.attrs.text("reduction") {
        Ok("none") => None,
        Ok("add") => Some("cur + upd"),
        Ok("mul") => Some("cur * upd"),
        // As the CPU: NaN updates lose.
        Ok("max") => Some("select(cur, upd, upd > cur)"),
        Ok("min") => Some("select(cur, upd, upd < cur)"),
        other => return Err(no_kernel!("{} reduction {other:?}", cx.op)),
    };
    let mut b = String::new();
    let (ty, count) = match combine {
        None => {
            let _ = writeln!(b, "    let e = g / {units}u;");
            let _ = writeln!(
                b,
                "    y[offsets.y + dst(e) * {units}u + g % {units}u] = u[offsets.u + g];"
            );
            ("u32", updates.desc.elements() as u64 * units)
        }
        Some(combine) => {
            let ty = match dt {
                DType::F32 => "f32",
                DType::I32 => "i32",
                DType::U32 => "u32",
                other => return Err(no_kernel!("{} reduction on {other}", cx.op)),
            };
            let _ = writeln!(b, "    for (var s = 0u; s < {steps}u; s = s + 1u) {{");
            let _ = writeln!(b, "        let e = {update_at};");
            let _ = writeln!(b, "        let at = offsets.y + dst(e);");
            let _ = writeln!(b, "        let cur = y[at];");
            let _ = writeln!(b, "        let upd = u[offsets.u + e];");
            let _ = writeln!(b, "        y[at] = {combine};\n    }}");
            (ty, lanes as u64)
        }
    };
    let bindings = vec![
        Binding::input("u", 2, ty),
        Binding::input("ix", 1, "u32"),
        Binding::output("y", 0, ty),
    ];
    d.extend(simple(cx, format!("{}_{count}", cx.op.to_lowercase()), bindings, count, &f, &b)?);
    Ok(d)
}

/// Each non-empty part's input index and slab length (elements per outer row).
fn slabs_of(parts: &[crate::vulkan::Operand], axis: usize, inner: usize) -> Vec<(usize, usize)> {
    parts
        .iter()
        .enumerate()
        .map(|(k, p)| (k, p.desc.shape.get(axis).copied().unwrap_or(0) * inner))
        .filter(|&(_, slab)| slab > 0)
        .collect()
}

/// Concat of 1- or 2-byte elements whose slabs do not fill whole output words: one
/// invocation per output word, each element read from the part whose slab holds it.
fn concat_packed(
    cx: &KernelCx,
    outer: usize,
    row: usize,
    slabs: &[(usize, usize)],
    esize: usize,
) -> Result<Vec<Dispatch>, NoKernel> {
    if slabs.iter().map(|&(_, s)| s).sum::<usize>() != row || cx.in_place().is_some() {
        return Err(no_kernel!("Concat of {row}-element rows from {slabs:?}"));
    }
    let n = (outer * row) as u64;
    let k = 4 / esize as u64;
    let bits = 8 * esize as u64;
    let mut f = format!(
        "fn elem(e: u32) -> u32 {{
    let o = e / {row}u;
    let j = e % {row}u;
"
    );
    let mut start = 0;
    let mut bindings = Vec::with_capacity(slabs.len() + 1);
    for &(i, slab) in slabs {
        let _ = writeln!(
            f,
            "    if (j < {}u) {{
        let s = o * {slab}u + j - {start}u;
        return (x{i}[offsets.x{i} + s / {k}u] >> ((s % {k}u) * {bits}u)) & {:#x}u;
    }}",
            start + slab,
            (1u64 << bits) - 1
        );
        bindings.push(Binding::input(&format!("x{i}"), i, "u32"));
        start += slab;
    }
    f.push_str(
        "    return 0u;
}
",
    );
    bindings.push(Binding::output("y", 0, "u32"));
    let mut b = format!(
        "    let i = g * {k}u;
    var w = 0u;
"
    );
    let _ = writeln!(
        b,
        "    for (var l = 0u; l < {k}u; l = l + 1u) {{
        if (i + l < {n}u) {{ w = w | (elem(i + l) << (l * {bits}u)); }}
    }}"
    );
    if !n.is_multiple_of(k) {
        // The last word keeps the bytes past the tensor's end.
        let _ = writeln!(
            b,
            "    if (i + {k}u > {n}u) {{ w = w | (y[offsets.y + g] & {:#x}u); }}",
            u32::MAX << ((n % k) * bits)
        );
    }
    b.push_str("    y[offsets.y + g] = w;\n");
    simple(cx, format!("concat_{n}_{k}per"), bindings, n.div_ceil(k), &f, &b)
}

fn axis_attr(cx: &KernelCx, rank: usize) -> Result<usize, NoKernel> {
    let axis = cx.attrs.int("axis").map_err(|e| no_kernel!("{}: {e}", cx.op))?;
    usize::try_from(axis)
        .ok()
        .filter(|&a| a < rank)
        .ok_or_else(|| no_kernel!("{} axis {axis} for rank {rank}", cx.op))
}

/// Row-major strides, in elements.
fn contiguous(shape: &[usize]) -> Vec<i64> {
    let mut s = vec![1i64; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1] as i64;
    }
    s
}

/// Pad's fill value as the bytes of one `dtype` element (integers wrap, floats round, as the
/// CPU's `Scalar::encode`).
fn encode(value: Option<&AttrValue>, dtype: DType) -> Result<Vec<u8>, NoKernel> {
    let (i, f) = match value {
        Some(&AttrValue::Int(v)) => (v, v as f64),
        Some(&AttrValue::Float(v)) => (v as i64, v),
        _ => return Err(no_kernel!("Pad value is not a number")),
    };
    Ok(match dtype {
        DType::F32 => (f as f32).to_le_bytes().to_vec(),
        DType::F64 => f.to_le_bytes().to_vec(),
        DType::F16 => half::f16::from_f64(f).to_le_bytes().to_vec(),
        DType::Bool => vec![u8::from(f != 0.0)],
        DType::I8 | DType::U8 => vec![i as u8],
        DType::I16 | DType::U16 => (i as u16).to_le_bytes().to_vec(),
        DType::I32 | DType::U32 => (i as u32).to_le_bytes().to_vec(),
        DType::I64 | DType::U64 => i.to_le_bytes().to_vec(),
    })
}

/// The dispatch of `copy` (in elements of `esize` bytes) from input `from` to output `to`.
fn dispatch(
    cx: &KernelCx,
    copy: Copy,
    from: usize,
    to: usize,
    esize: usize,
) -> Result<Vec<Dispatch>, NoKernel> {
    let (x, y) = (&cx.inputs[from], &cx.outputs[to]);
    let copy = copy.simplify();
    if copy.len() == 0 {
        return Ok(Vec::new());
    }
    let ((src_lo, src_hi), (dst_lo, dst_hi)) = copy.ranges();
    let (x_len, y_len) = (x.desc.elements() as i64, y.desc.elements() as i64);
    let reads = copy.dims.iter().all(|d| match d.src {
        Src::Pad { n, .. } => n > 0,
        _ => true,
    });
    if (reads && (src_lo < 0 || src_hi >= x_len)) || dst_lo < 0 || dst_hi >= y_len {
        return Err(no_kernel!(
            "{}: the copy reaches outside its tensors ({src_lo}..={src_hi} of {x_len}, {dst_lo}..={dst_hi} of {y_len})",
            cx.op
        ));
    }
    if cx.in_place().is_some() {
        // Only a copy onto itself is safe in place, and it has nothing to do.
        return if from == 0 && to == 0 && copy.is_identity() {
            Ok(Vec::new())
        } else {
            Err(no_kernel!("{} in place", cx.op))
        };
    }
    let index = cx.inputs.get(1).filter(|_| copy.reads_indices());
    if let Some(o) = [x, y].into_iter().chain(index).find(|o| o.byte_offset % 4 != 0) {
        return Err(no_kernel!(
            "{}: a tensor at byte {} is not word-aligned",
            cx.op,
            o.byte_offset
        ));
    }
    let fill = copy.fill.clone();
    let mut fill_word = 0u32;
    // The plan in u32 words, or (`packed`, 1- and 2-byte elements that do not group into
    // words) in elements, four or two to an output word.
    let (plan, packed) = match esize {
        4 => (copy, None),
        8 => {
            if copy.fills() && fill.get(..4) != fill.get(4..) {
                return Err(no_kernel!("{}: a fill value with differing words", cx.op));
            }
            (copy.in_words(2).simplify(), None)
        }
        1 | 2 => {
            let k = (4 / esize) as i64;
            match copy.group(k) {
                Some(words) => {
                    fill_word = u32::from_le_bytes(std::array::from_fn(|b| {
                        fill.get(b % esize).copied().unwrap_or(0)
                    }));
                    (words, None)
                }
                None if copy.contiguous() => (copy, Some(k as u64)),
                None => return Err(no_kernel!("{} of {esize}-byte elements at strides", cx.op)),
            }
        }
        _ => return Err(no_kernel!("{} of {esize}-byte elements", cx.op)),
    };
    if esize >= 4 && plan.fills() {
        fill_word = u32::from_le_bytes(std::array::from_fn(|b| fill.get(b).copied().unwrap_or(0)));
    }
    let vector = packed
        .is_none()
        .then(|| plan.group(4))
        .flatten()
        .filter(|_| x.aligned16() && y.aligned16());
    let vectorised = vector.is_some();
    let (plan, ty) = match vector {
        Some(v) => (v, "vec4<u32>"),
        None => (plan, "u32"),
    };
    // Invocations: one per unit, or per output word when packed.
    let n = plan.len();
    let count = packed.map_or(n, |k| n.div_ceil(k));
    let grid = Grid::new(count, 64)?;
    let mut bindings = vec![Binding::input("x", from, ty), Binding::output("y", to, ty)];
    if index.is_some() {
        bindings.push(Binding::input("ix", 1, "u32"));
    }
    let mut s = header(&bindings);
    s.push_str(&source_fn(&plan));
    if !plan.contiguous() {
        s.push_str(&dest_fn(&plan));
    }
    let fill_lit = format!("{ty}({fill_word}u)");
    let _ = writeln!(s, "{} {{", grid.entry());
    let _ = writeln!(s, "    let g = {};", grid.index());
    let _ = writeln!(s, "    if (g >= {count}u) {{ return; }}");
    match packed {
        None => {
            let dst = if plan.contiguous() { "g" } else { "dst(g)" };
            let _ = writeln!(s, "    let s = src(g);");
            if plan.fills() {
                let _ = writeln!(s, "    var v = {fill_lit};");
                let _ = writeln!(s, "    if (s >= 0) {{ v = x[offsets.x + u32(s)]; }}");
                let _ = writeln!(s, "    y[offsets.y + {dst}] = v;");
            } else {
                let _ = writeln!(s, "    y[offsets.y + {dst}] = x[offsets.x + u32(s)];");
            }
        }
        Some(k) => {
            let bits = 32 / k;
            let mask = (1u64 << bits) - 1;
            let fill_bits = fill.iter().rev().fold(0u32, |acc, &b| (acc << 8) | u32::from(b));
            let _ = writeln!(s, "    let i = g * {k}u;");
            let _ = writeln!(s, "    var w = 0u;");
            let _ = writeln!(s, "    for (var l = 0u; l < {k}u; l = l + 1u) {{");
            let _ = writeln!(s, "        if (i + l >= {n}u) {{ break; }}");
            let _ = writeln!(s, "        let s = src(i + l);");
            let _ = writeln!(s, "        var e = {fill_bits}u;");
            let _ = writeln!(
                s,
                "        if (s >= 0) {{ e = (x[offsets.x + u32(s) / {k}u] >> ((u32(s) % {k}u) * {bits}u)) & {mask}u; }}"
            );
            let _ = writeln!(s, "        w = w | (e << (l * {bits}u));");
            let _ = writeln!(s, "    }}");
            if !n.is_multiple_of(k) {
                // The last word keeps the bytes past the tensor's end.
                let _ = writeln!(
                    s,
                    "    if (i + {k}u > {n}u) {{ w = w | (y[offsets.y + g] & {:#x}u); }}",
                    u32::MAX << ((n % k) * bits)
                );
            }
            let _ = writeln!(s, "    y[offsets.y + g] = w;");
        }
    }
    s.push_str("}\n");
    let shape: Vec<String> = plan.dims.iter().map(|d| d.len.to_string()).collect();
    Ok(vec![Dispatch {
        label: format!(
            "{}_{}{}",
            cx.op.to_lowercase(),
            shape.join("x"),
            match (vectorised, packed) {
                (true, _) => "_v4".to_string(),
                (false, Some(k)) => format!("_{k}per"),
                _ => String::new(),
            }
        ),
        wgsl: s,
        groups: grid.groups,
        bindings,
        ..Default::default()
    }])
}

/// The coordinate of each dim of iteration index `g`, as WGSL i32 `let`s `c0`, `c1`...
fn coords(plan: &Copy) -> String {
    let mut s = String::new();
    let mut p = 1u64;
    let mut lines = vec![String::new(); plan.dims.len()];
    for (k, d) in plan.dims.iter().enumerate().rev() {
        let c = match (k, p) {
            (0, 1) => "g".to_string(),
            (0, p) => format!("g / {p}u"),
            (_, 1) => format!("g % {}u", d.len),
            (_, p) => format!("(g / {p}u) % {}u", d.len),
        };
        lines[k] = format!("    let c{k} = i32({c});\n");
        p *= d.len;
    }
    lines.iter().for_each(|l| s.push_str(l));
    s
}

/// WGSL `fn src(g: u32) -> i32`: where iteration index `g` reads the source, or -1 for the fill
/// value.
fn source_fn(plan: &Copy) -> String {
    let mut s = String::from("fn src(g: u32) -> i32 {\n");
    s.push_str(&coords(plan));
    let mut terms = vec![plan.src_base.to_string()];
    let mut checks = Vec::new();
    for (k, d) in plan.dims.iter().enumerate() {
        match d.src {
            Src::Affine(0) => {}
            Src::Affine(st) => terms.push(format!("c{k} * {st}")),
            Src::Pad { n, before, mode, stride } => {
                let p = format!("(c{k} - {before})");
                let mapped = match mode {
                    PadMode::Constant => {
                        checks.push(format!("p{k} >= 0 && p{k} < {n}"));
                        p
                    }
                    PadMode::Edge => format!("clamp({p}, 0, {})", n - 1),
                    PadMode::Wrap => format!("(({p} % {n}) + {n}) % {n}"),
                    PadMode::Reflect if n == 1 => "0".into(),
                    PadMode::Reflect => {
                        let period = 2 * (n - 1);
                        let _ =
                            writeln!(s, "    let r{k} = (({p} % {period}) + {period}) % {period};");
                        format!("select(r{k}, {period} - r{k}, r{k} >= {n})")
                    }
                };
                let _ = writeln!(s, "    let p{k} = {mapped};");
                terms.push(format!("p{k} * {stride}"));
            }
            Src::Index { ref comps, batch } => {
                // The low word of an int64 is the index for every value in [-n, n); others
                // were errors on the CPU: clamp them, never read outside.
                for (j, &(n, stride)) in comps.iter().enumerate() {
                    let at =
                        format!("(u32(c{k}) * {}u + {j}u) * {}u", comps.len(), plan.index_words);
                    let _ = writeln!(s, "    let r{k}_{j} = bitcast<i32>(ix[offsets.ix + {at}]);");
                    let _ = writeln!(
                        s,
                        "    let p{k}_{j} = clamp(select(r{k}_{j}, r{k}_{j} + {n}, r{k}_{j} < 0), 0, {});",
                        n - 1
                    );
                    terms.push(format!("p{k}_{j} * {stride}"));
                }
                if let Some((per, stride)) = batch {
                    terms.push(format!("(c{k} / {per}) * {stride}"));
                }
            }
            Src::Element { n, stride } => {
                let at = format!("(g / {}u) * {}u", plan.units, plan.index_words);
                let _ = writeln!(s, "    let r{k} = bitcast<i32>(ix[offsets.ix + {at}]);");
                let _ = writeln!(
                    s,
                    "    let p{k} = clamp(select(r{k}, r{k} + {n}, r{k} < 0), 0, {});",
                    n - 1
                );
                terms.push(format!("p{k} * {stride}"));
            }
        }
    }
    if let Some(b) = plan.band {
        let (r, c, k) = (b.row, b.col, b.k);
        checks.push(if b.upper {
            format!("c{c} - c{r} >= {k}")
        } else {
            format!("c{c} - c{r} <= {k}")
        });
    }
    if !checks.is_empty() {
        let _ = writeln!(s, "    if (!({})) {{ return -1; }}", checks.join(" && "));
    }
    let _ = writeln!(s, "    return {};\n}}", terms.join(" + "));
    s
}

/// WGSL `fn dst(g: u32) -> u32`: where iteration index `g` writes (Concat's slabs).
fn dest_fn(plan: &Copy) -> String {
    let mut s = String::from("fn dst(g: u32) -> u32 {\n");
    s.push_str(&coords(plan));
    let mut terms = vec![plan.dst_base.to_string()];
    terms.extend(
        (0..plan.dims.len())
            .filter(|&k| plan.dims[k].dst != 0)
            .map(|k| format!("c{k} * {}", plan.dims[k].dst)),
    );
    let _ = writeln!(s, "    return u32({});\n}}", terms.join(" + "));
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TensorDesc;
    use crate::vulkan::{DeviceClass, Operand, compile};
    use ingot_schema::Attrs;

    fn t(dtype: DType, shape: &[usize], byte_offset: u64) -> Operand {
        Operand::arena(TensorDesc::new(dtype, shape), byte_offset)
    }

    fn f32s(shape: &[usize], byte_offset: u64) -> Operand {
        t(DType::F32, shape, byte_offset)
    }

    fn try_lower(
        op: &str,
        attrs: &Attrs,
        inputs: &[Operand],
        outputs: &[Operand],
    ) -> Result<Vec<Dispatch>, NoKernel> {
        let cx = KernelCx { class: DeviceClass::Any, op, name: "t", attrs, inputs, outputs };
        lower(&cx)
    }

    /// Lowers one step and checks that every kernel passes naga's validation.
    fn lower_ok(op: &str, attrs: &Attrs, inputs: &[Operand], outputs: &[Operand]) -> Vec<Dispatch> {
        let ds = try_lower(op, attrs, inputs, outputs).unwrap_or_else(|e| panic!("{op}: {e}"));
        for d in &ds {
            compile(&d.wgsl, &[]).unwrap_or_else(|e| panic!("{op}: {e}\n{}", d.wgsl));
        }
        ds
    }

    fn ints(v: &[i64]) -> AttrValue {
        AttrValue::Ints(v.to_vec())
    }

    #[test]
    fn copies_merge_into_one_vectorised_run() {
        let d = lower_ok("Reshape", &Attrs::new(), &[f32s(&[2, 8], 0)], &[f32s(&[16], 64)]);
        assert_eq!(d[0].label, "reshape_4_v4");
        assert!(d[0].wgsl.contains("y[offsets.y + g] = x[offsets.x + u32(s)]"));
        // int64 moves as pairs of words; an odd count stays scalar.
        let d = lower_ok(
            "Identity",
            &Attrs::new(),
            &[t(DType::I64, &[3], 0)],
            &[t(DType::I64, &[3], 64)],
        );
        assert_eq!(d[0].label, "identity_6");
        // In place there is nothing to do.
        assert!(lower_ok("Identity", &Attrs::new(), &[f32s(&[4], 0)], &[f32s(&[4], 0)]).is_empty());
        // Bytes move as words where they group into words.
        let d = lower_ok(
            "Identity",
            &Attrs::new(),
            &[t(DType::Bool, &[8], 0)],
            &[t(DType::Bool, &[8], 64)],
        );
        assert_eq!(d[0].label, "identity_2");
    }

    #[test]
    fn transpose_reads_at_permuted_strides() {
        let attrs = Attrs::new().with("perm", ints(&[0, 2, 3, 1]));
        let d =
            lower_ok("Transpose", &attrs, &[f32s(&[1, 3, 4, 5], 0)], &[f32s(&[1, 4, 5, 3], 256)]);
        // Dims of 1 are dropped; the output's (4, 5) read as one dim of 20 with stride 1.
        assert_eq!(d[0].label, "transpose_20x3");
        assert!(d[0].wgsl.contains("c0 * 1 + c1 * 20"), "{}", d[0].wgsl);
    }

    #[test]
    fn slices_with_negative_steps() {
        // x[1:, ::-2] of [3, 5]: rows 1, 2; columns 4, 2, 0.
        let attrs = Attrs::new()
            .with("starts", ints(&[1, 4]))
            .with("ends", ints(&[3, -1]))
            .with("steps", ints(&[1, -2]));
        let d = lower_ok("Slice", &attrs, &[f32s(&[3, 5], 0)], &[f32s(&[2, 3], 64)]);
        assert!(d[0].wgsl.contains("return 9 + c0 * 5 + c1 * -2;"), "{}", d[0].wgsl);
    }

    #[test]
    fn pads_in_every_mode() {
        for mode in ["constant", "edge", "wrap", "reflect"] {
            let attrs = Attrs::new()
                .with("pads", ints(&[0, 1, -1, 2]))
                .with("mode", AttrValue::Text(mode.into()))
                .with("value", AttrValue::Float(1.5));
            let d = lower_ok("Pad", &attrs, &[f32s(&[3, 4], 0)], &[f32s(&[2, 7], 64)]);
            assert_eq!(d[0].wgsl.contains("1069547520u"), mode == "constant", "{}", d[0].wgsl);
        }
        // int64 with a value whose words differ has no kernel; -1 does.
        let pad = |v: i64| {
            let attrs = Attrs::new()
                .with("pads", ints(&[1, 1]))
                .with("mode", AttrValue::Text("constant".into()))
                .with("value", AttrValue::Int(v));
            try_lower("Pad", &attrs, &[t(DType::I64, &[3], 0)], &[t(DType::I64, &[5], 64)])
        };
        assert!(pad(7).is_err());
        compile(&pad(-1).unwrap()[0].wgsl, &[]).unwrap();
    }

    #[test]
    fn tile_expand_and_depth_space() {
        let attrs = Attrs::new().with("repeats", ints(&[2, 3]));
        lower_ok("Tile", &attrs, &[f32s(&[2, 4], 0)], &[f32s(&[4, 12], 64)]);
        let attrs = Attrs::new().with("shape", ints(&[2, 3, 4]));
        let d = lower_ok("Expand", &attrs, &[f32s(&[3, 1], 0)], &[f32s(&[2, 3, 4], 64)]);
        assert!(d[0].wgsl.contains("c1 * 0") || !d[0].wgsl.contains("c2 *"), "{}", d[0].wgsl);
        for op in ["DepthToSpace", "SpaceToDepth"] {
            for mode in ["DCR", "CRD"] {
                let attrs = Attrs::new()
                    .with("blocksize", AttrValue::Int(2))
                    .with("mode", AttrValue::Text(mode.into()));
                let (i, o) = if op == "DepthToSpace" {
                    ([1, 8, 2, 3], [1, 2, 4, 6])
                } else {
                    ([1, 2, 4, 6], [1, 8, 2, 3])
                };
                lower_ok(op, &attrs, &[f32s(&i, 0)], &[f32s(&o, 256)]);
            }
        }
    }

    #[test]
    fn concat_writes_one_slab_per_input_and_split_reads_one() {
        let attrs = Attrs::new().with("axis", AttrValue::Int(1));
        let parts = [f32s(&[2, 3, 4], 0), f32s(&[2, 1, 4], 256), f32s(&[2, 0, 4], 512)];
        let joined = f32s(&[2, 4, 4], 1024);
        let d = lower_ok("Concat", &attrs, &parts, std::slice::from_ref(&joined));
        assert_eq!(d.len(), 2, "the empty part has no dispatch");
        assert_eq!(d[1].bindings[0].slot, crate::vulkan::Slot::Input(1));
        assert!(d[1].wgsl.contains("u32(3 + c0 * 4"), "{}", d[1].wgsl);
        let d = lower_ok("Split", &attrs, std::slice::from_ref(&joined), &parts);
        assert_eq!(d.len(), 2);
        assert_eq!(d[1].bindings[1].slot, crate::vulkan::Slot::Output(1));
        assert!(d[1].wgsl.contains("return 3 + c0 * 4;"), "{}", d[1].wgsl);
        // Parts that do not add up are refused.
        assert!(try_lower("Concat", &attrs, &parts[..2], &[f32s(&[2, 5, 4], 1024)]).is_err());
    }

    #[test]
    fn gather_reads_int64_and_int32_indices() {
        let attrs = Attrs::new().with("axis", AttrValue::Int(1));
        for (dt, words) in [(DType::I64, 2), (DType::I32, 1)] {
            let d = lower_ok(
                "Gather",
                &attrs,
                &[f32s(&[2, 5, 8], 0), t(dt, &[3], 512)],
                &[f32s(&[2, 3, 8], 1024)],
            );
            assert!(d[0].wgsl.contains(&format!("* {words}u]")), "{}", d[0].wgsl);
            assert_eq!(d[0].bindings.len(), 3);
        }
        // int64 data along the last axis.
        let attrs = Attrs::new().with("axis", AttrValue::Int(0));
        lower_ok(
            "Gather",
            &attrs,
            &[t(DType::I64, &[5], 0), t(DType::I64, &[2, 2], 64)],
            &[t(DType::I64, &[2, 2], 128)],
        );
    }

    #[test]
    fn bytes_that_do_not_group_are_packed_into_words() {
        // A bool transpose: four elements per invocation, the last word keeps its 3rd and
        // 4th bytes (6 elements).
        let attrs = Attrs::new().with("perm", ints(&[1, 0]));
        let d = lower_ok(
            "Transpose",
            &attrs,
            &[t(DType::Bool, &[2, 3], 0)],
            &[t(DType::Bool, &[3, 2], 64)],
        );
        assert_eq!(d[0].label, "transpose_3x2_4per");
        assert_eq!(d[0].groups, [1, 1, 1]);
        assert!(d[0].wgsl.contains("& 0xffff0000u)"), "{}", d[0].wgsl);
        // f16 padding: two to a word, with the fill's bits.
        let attrs = Attrs::new()
            .with("pads", ints(&[1, 0]))
            .with("mode", AttrValue::Text("constant".into()))
            .with("value", AttrValue::Float(1.0));
        let d = lower_ok("Pad", &attrs, &[t(DType::F16, &[3], 0)], &[t(DType::F16, &[4], 64)]);
        assert!(d[0].wgsl.contains("var e = 15360u;"), "{}", d[0].wgsl);
        // A bool concat whose slabs share words: one kernel writes each word from its parts.
        let attrs = Attrs::new().with("axis", AttrValue::Int(1));
        let parts = [t(DType::Bool, &[2, 3], 0), t(DType::Bool, &[2, 1], 16)];
        let d = lower_ok("Concat", &attrs, &parts, &[t(DType::Bool, &[2, 4], 32)]);
        assert_eq!((d.len(), d[0].label.as_str()), (1, "concat_8_4per"));
        assert_eq!(d[0].bindings.len(), 3);
        // Whole words: one word copy per part.
        let parts = [t(DType::Bool, &[2, 4], 0), t(DType::Bool, &[2, 8], 16)];
        let d = lower_ok("Concat", &attrs, &parts, &[t(DType::Bool, &[2, 12], 32)]);
        assert_eq!(d.len(), 2);
        // Bytes not on a word boundary cannot be addressed.
        let odd = [t(DType::Bool, &[4], 2)];
        assert!(try_lower("Identity", &Attrs::new(), &odd, &[t(DType::Bool, &[4], 64)]).is_err());
    }

    #[test]
    fn dropout_writes_an_all_true_mask() {
        let d = lower_ok(
            "Dropout",
            &Attrs::new(),
            &[f32s(&[5], 0)],
            &[f32s(&[5], 64), t(DType::Bool, &[5], 128)],
        );
        assert_eq!(d.len(), 2);
        assert!(d[1].wgsl.contains("var e = 1u;"), "{}", d[1].wgsl);
        assert!(d[1].wgsl.contains("return -1;"), "{}", d[1].wgsl);
    }

    #[test]
    fn index_driven_gathers() {
        let axis = |a| Attrs::new().with("axis", AttrValue::Int(a));
        // GatherElements along axis 1: the index at the element's own position.
        let d = lower_ok(
            "GatherElements",
            &axis(1),
            &[f32s(&[2, 5], 0), t(DType::I64, &[2, 3], 64)],
            &[f32s(&[2, 3], 128)],
        );
        assert!(d[0].wgsl.contains("ix[offsets.ix + (g / 1u) * 2u]"), "{}", d[0].wgsl);
        // int64 data: two words per element, the index read per element.
        let d = lower_ok(
            "GatherElements",
            &axis(0),
            &[t(DType::I64, &[4, 2], 0), t(DType::I32, &[3, 2], 64)],
            &[t(DType::I64, &[3, 2], 128)],
        );
        assert!(d[0].wgsl.contains("(g / 2u) * 1u"), "{}", d[0].wgsl);
        // GatherND with a batch dim: tuples of 1 component, the batch from the tuple number.
        let attrs = Attrs::new().with("batch_dims", AttrValue::Int(1));
        let d = lower_ok(
            "GatherND",
            &attrs,
            &[f32s(&[2, 3, 4], 0), t(DType::I64, &[2, 5, 1], 128)],
            &[f32s(&[2, 5, 4], 256)],
        );
        assert!(d[0].wgsl.contains("(c0 / 5) * 3"), "{}", d[0].wgsl);
        let attrs = Attrs::new().with("batch_dims", AttrValue::Int(0));
        lower_ok(
            "GatherND",
            &attrs,
            &[f32s(&[2, 3, 4], 0), t(DType::I32, &[5, 2], 128)],
            &[f32s(&[5, 4], 256)],
        );
    }

    #[test]
    fn trilu_keeps_a_band() {
        for (upper, cmp) in [(1, ">= -1"), (0, "<= -1")] {
            let attrs =
                Attrs::new().with("upper", AttrValue::Int(upper)).with("k", AttrValue::Int(-1));
            let d = lower_ok("Trilu", &attrs, &[f32s(&[2, 3, 4], 0)], &[f32s(&[2, 3, 4], 128)]);
            assert!(d[0].wgsl.contains(&format!("c2 - c1 {cmp}")), "{}", d[0].wgsl);
        }
        let attrs =
            Attrs::new().with("upper", AttrValue::Int(1)).with("k", AttrValue::Int(i64::MAX));
        lower_ok("Trilu", &attrs, &[t(DType::I64, &[3, 3], 0)], &[t(DType::I64, &[3, 3], 128)]);
    }

    #[test]
    fn cum_sum_one_hot_and_scatters() {
        for (dt, ex, rev) in [(DType::F32, 0, 0), (DType::I64, 1, 1), (DType::I32, 1, 0)] {
            let attrs = Attrs::new()
                .with("axis", AttrValue::Int(1))
                .with("exclusive", AttrValue::Int(ex))
                .with("reverse", AttrValue::Int(rev));
            lower_ok("CumSum", &attrs, &[t(dt, &[2, 5, 3], 0)], &[t(dt, &[2, 5, 3], 256)]);
        }
        for (idx, vals) in
            [(DType::I64, DType::F32), (DType::F32, DType::I64), (DType::I32, DType::I32)]
        {
            let attrs =
                Attrs::new().with("axis", AttrValue::Int(1)).with("depth", AttrValue::Int(4));
            lower_ok(
                "OneHot",
                &attrs,
                &[t(idx, &[2, 3], 0), t(vals, &[2], 64)],
                &[t(vals, &[2, 4, 3], 128)],
            );
        }
        let none = |axis| {
            Attrs::new()
                .with("reduction", AttrValue::Text("none".into()))
                .with("axis", AttrValue::Int(axis))
        };
        let d = lower_ok(
            "ScatterND",
            &none(0),
            &[f32s(&[4, 3], 0), t(DType::I64, &[2, 1], 64), f32s(&[2, 3], 128)],
            &[f32s(&[4, 3], 256)],
        );
        assert_eq!(d.len(), 2, "copy, then scatter");
        lower_ok(
            "ScatterElements",
            &none(1),
            &[t(DType::I64, &[4, 3], 0), t(DType::I32, &[4, 2], 128), t(DType::I64, &[4, 2], 192)],
            &[t(DType::I64, &[4, 3], 256)],
        );
        // Reductions keep the CPU's order: one invocation per slice element here.
        let add = Attrs::new().with("reduction", AttrValue::Text("add".into()));
        let d = lower_ok(
            "ScatterND",
            &add,
            &[f32s(&[4, 3], 0), t(DType::I64, &[2, 1], 64), f32s(&[2, 3], 128)],
            &[f32s(&[4, 3], 256)],
        );
        assert!(d[1].wgsl.contains("for (var s = 0u; s < 2u;"), "{}", d[1].wgsl);
        assert_eq!(d[1].groups, [1, 1, 1]);
        let max = Attrs::new()
            .with("reduction", AttrValue::Text("max".into()))
            .with("axis", AttrValue::Int(0));
        lower_ok(
            "ScatterElements",
            &max,
            &[t(DType::I32, &[4, 3], 0), t(DType::I64, &[2, 3], 64), t(DType::I32, &[2, 3], 128)],
            &[t(DType::I32, &[4, 3], 256)],
        );
    }

    #[test]
    fn large_copies_use_two_grid_dimensions() {
        let n = 65535 * 64 * 4 + 3;
        let attrs = Attrs::new().with("perm", ints(&[1, 0]));
        let d = lower_ok("Transpose", &attrs, &[f32s(&[n, 2], 0)], &[f32s(&[2, n], 0x1000_0000)]);
        assert!(d[0].groups[1] > 1);
        // Not in place.
        assert!(try_lower("Transpose", &attrs, &[f32s(&[n, 2], 0)], &[f32s(&[2, n], 0)]).is_err());
    }
}
