//! Movement kernels (ops and canonical attributes: ops/src/movement/cpu.rs).
//!
//! Most ops are one strided copy, as on the CPU ([`Copy`], `copy.wgsl`): an invocation takes
//! one unit of an iteration space, splits its index into coordinates, and reads the source at a
//! base plus, per dim, the coordinate times a stride; Gather and GatherElements read one dim's
//! coordinate from the index tensor. The destination is the invocation's own index, or
//! (Concat's slabs) a base plus strides. Pad maps its coordinates by its mode or reads the fill
//! value (`pad.wgsl`), GatherND reads tuples of coordinates (`gather_nd.wgsl`), Trilu keeps a
//! band (`trilu.wgsl`). Concat runs one dispatch per input, Split one per output. Every shape,
//! stride and base is a push-constant param: one module serves every step of a form.
//!
//! Values move as u32 words, whatever the dtype: 4-byte types as one, 8-byte types as two (an
//! innermost dim of 2); 1- and 2-byte types as whole words where the copy groups into them,
//! else packed, one invocation per output word assembling its 4 or 2 elements (the last word
//! keeps the bytes past the tensor's end). Dims are merged where they step as one, and the copy
//! moves vec4 words when its innermost dim is a contiguous, aligned multiple of 4. Coordinates
//! come from the fast `divmod` (`Spec::divmod`) where the dims allow.
//!
//! CumSum (a prefix per output element, summed in the CPU's order), OneHot, the scatters (the
//! data copied, then the updates written; with a reduction, updates that may meet run in order
//! in one invocation) and Concat of bytes that share words have their own small kernels.

use crate::vulkan::{Binding, Dispatch, Grid, KernelCx, NoKernel, Slot, Spec, Wgsl};
use crate::{no_kernel, wgsl};
use ingot_schema::{AttrValue, DType};

static COPY: Wgsl = wgsl!("movement/copy.wgsl");
static PAD: Wgsl = wgsl!("movement/pad.wgsl");
static GATHER_ND: Wgsl = wgsl!("movement/gather_nd.wgsl");
static TRILU: Wgsl = wgsl!("movement/trilu.wgsl");
static CUMSUM: Wgsl = wgsl!("movement/cumsum.wgsl");
static ONE_HOT: Wgsl = wgsl!("movement/one_hot.wgsl");
static SCATTER: Wgsl = wgsl!("movement/scatter.wgsl");
static CONCAT_BYTES: Wgsl = wgsl!("movement/concat_bytes.wgsl");
static TENSOR_SCATTER: Wgsl = wgsl!("movement/tensor_scatter.wgsl");

/// The family's kernel files.
#[cfg(test)]
static FILES: [&Wgsl; 9] =
    [&COPY, &PAD, &GATHER_ND, &TRILU, &CUMSUM, &ONE_HOT, &SCATTER, &CONCAT_BYTES, &TENSOR_SCATTER];

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
    /// DynamicSlice: `c` past where the index tensor's one value starts a window of the dim's
    /// length in a dim of `n` (from the end where negative, clamped into the dim), times
    /// `stride`.
    Window { n: i64, stride: i64 },
}

impl Src {
    /// Every stride of the source offset.
    fn strides_mut(&mut self) -> Vec<&mut i64> {
        match self {
            Src::Affine(s)
            | Src::Pad { stride: s, .. }
            | Src::Element { stride: s, .. }
            | Src::Window { stride: s, .. } => vec![s],
            Src::Index { comps, batch } => {
                comps.iter_mut().map(|(_, s)| s).chain(batch.as_mut().map(|(_, s)| s)).collect()
            }
        }
    }

    /// Whether it reads the index tensor.
    fn reads_indices(&self) -> bool {
        match self {
            Src::Index { comps, .. } => !comps.is_empty(),
            Src::Element { .. } | Src::Window { .. } => true,
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
                Src::Pad { n, stride, .. }
                | Src::Element { n, stride }
                | Src::Window { n, stride } => add(&mut src, *stride, (n - 1).max(0)),
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
        "CumSum" | "CumProd" => return cumulative(cx),
        "OneHot" => return one_hot(cx),
        "ScatterND" | "ScatterElements" => return scatter(cx),
        "TensorScatter" => return tensor_scatter(cx),
        _ => {}
    }
    let dt = x.desc.dtype;
    let esize = dt.size();
    // Gather's indices and Dropout's mask have their own types.
    let data = match cx.op {
        "Gather" | "GatherElements" | "GatherND" | "DynamicSlice" => &cx.inputs[..1],
        _ => cx.inputs,
    };
    let outs = match cx.op {
        "Dropout" => &cx.outputs[..1],
        // Its output's type is another of the same width.
        "BitCast" => &[],
        _ => cx.outputs,
    };
    if let Some(o) = data.iter().chain(outs).find(|o| o.desc.dtype != dt) {
        return Err(cx.dtype(o.desc.dtype));
    }
    let shape = &x.desc.shape;
    let strides = contiguous(shape);
    let one = |copy: Copy| dispatch(cx, copy, 0, 0, esize);
    match cx.op {
        "Reshape" | "Flatten" | "Squeeze" | "Unsqueeze" | "Identity" | "BitCast" => {
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
        "Pad" | "CenterCropPad" => {
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
        "DynamicSlice" => {
            let (axes, sizes) = (
                cx.attrs.ints("axes").map_err(attr_err)?,
                cx.attrs.ints("sizes").map_err(attr_err)?,
            );
            let (&[a], &[size]) = (axes, sizes) else {
                return Err(no_kernel!("DynamicSlice over {} axes", axes.len()));
            };
            let a = usize::try_from(a).ok().filter(|&a| a < shape.len());
            let a = a.ok_or_else(|| no_kernel!("DynamicSlice axis {a:?} of {shape:?}"))?;
            let dims = (0..shape.len())
                .map(|d| match d == a {
                    true => (size as u64, Src::Window { n: shape[d] as i64, stride: strides[d] }),
                    false => (shape[d] as u64, Src::Affine(strides[d])),
                })
                .collect();
            let mut copy = Copy::new(dims, 0);
            copy.index_words = index_words(cx, 1)?;
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

/// The workgroup size of every movement kernel.
const WG: u32 = 64;

/// The most dims `copy.wgsl` (and the index components `gather_nd.wgsl` and `scatter.wgsl`)
/// take, and `pad.wgsl`.
const MAX_DIMS: usize = 8;
const MAX_PAD_DIMS: usize = 7;

/// A value as a u32 param word: two's complement for negative strides, whose wrapping sums
/// come back inside the tensor (the copy's `ranges` were checked).
fn word(v: i64) -> u32 {
    v as u32
}

/// `values` as a param array of `len` words, zeros past them.
fn array(values: impl IntoIterator<Item = u32>, len: usize) -> Vec<u32> {
    let mut v: Vec<u32> = values.into_iter().collect();
    v.resize(len, 0);
    v
}

/// Fails unless every tensor a dispatch binds starts on a word and has bytes to bind.
fn bindable(cx: &KernelCx, bindings: &[Binding]) -> Result<(), NoKernel> {
    for b in bindings {
        let o = match b.slot {
            Slot::Input(i) => &cx.inputs[i],
            Slot::Output(i) => &cx.outputs[i],
        };
        if o.byte_offset % 4 != 0 || o.desc.bytes() == 0 {
            return Err(no_kernel!("{}: tensor '{}' is empty or not word-aligned", cx.op, b.name));
        }
    }
    Ok(())
}

/// The one dispatch of `spec` over `count` invocations (none for none), its divisions made fast
/// where `dividers` (the run-time divisors of an index below `count`) allow.
fn launch(
    spec: Spec,
    label: String,
    count: u64,
    dividers: &[u32],
    bindings: Vec<Binding>,
    params: Vec<u32>,
) -> Result<Vec<Dispatch>, NoKernel> {
    if count == 0 {
        return Ok(Vec::new());
    }
    let grid = Grid::new(count, WG)?;
    let fast = !dividers.is_empty()
        && count < 1 << 31
        && dividers.iter().all(|&d| (1..1 << 24).contains(&d));
    let spec = if fast { spec.divmod() } else { spec };
    let d = spec.set("WG", WG).dispatch(label, grid.groups, bindings, params)?;
    Ok(vec![d])
}

/// CumSum and CumProd: each output element sums or multiplies its prefix along the axis, in
/// the CPU's order (so floats round the same). f32, i32, u32 (wrapping); sums of int64 and
/// uint64 too.
fn cumulative(cx: &KernelCx) -> Result<Vec<Dispatch>, NoKernel> {
    let (op, x, y) = (cx.op, &cx.inputs[0], &cx.outputs[0]);
    if x.desc != y.desc {
        return Err(no_kernel!("{op} of {:?} to {:?}", x.desc, y.desc));
    }
    if cx.in_place().is_some() {
        return Err(no_kernel!("{op} in place"));
    }
    let shape = &x.desc.shape;
    let axis = axis_attr(cx, shape.len())?;
    let flag = |name| cx.attrs.int(name).map(|v| v != 0).map_err(|e| no_kernel!("{op}: {e}"));
    let product = op == "CumProd";
    let (ty, wide) = match x.desc.dtype {
        DType::F32 => ("f32", false),
        DType::I32 => ("i32", false),
        DType::U32 => ("u32", false),
        DType::I64 | DType::U64 if !product => ("u32", true),
        other => return Err(cx.dtype(other)),
    };
    let n = shape[axis];
    let inner = shape[axis + 1..].iter().product::<usize>();
    let bindings = vec![Binding::input("x", 0, ty), Binding::output("y", 0, ty)];
    bindable(cx, &bindings)?;
    let count = x.desc.elements() as u64;
    let spec = Spec::new(&CUMSUM)
        .alias("T", ty)
        .set("EXCLUSIVE", flag("exclusive")?)
        .set("REVERSE", flag("reverse")?)
        .set("WIDE", wide);
    // Set only for products: CumSum's modules stay as they were.
    let spec = if product { spec.set("PRODUCT", true) } else { spec };
    let params = vec![count as u32, n as u32, inner as u32];
    let label = format!("{}_{count}_{n}", op.to_lowercase());
    launch(spec, label, count, &[], bindings, params)
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
        4 => 1u32,
        8 => 2,
        _ => return Err(cx.dtype(values.desc.dtype)),
    };
    let index = match idx.desc.dtype {
        DType::I32 => 0u32,
        DType::I64 => 1,
        DType::F32 => 2,
        other => return Err(cx.dtype(other)),
    };
    let inner = is[axis..].iter().product::<usize>();
    let bindings = vec![
        Binding::input("ix", 0, "u32"),
        Binding::input("v", 1, "u32"),
        Binding::output("y", 0, "u32"),
    ];
    bindable(cx, &bindings)?;
    let count = y.desc.elements() as u64 * u64::from(units);
    let spec = Spec::new(&ONE_HOT).set("UNITS", units).set("INDEX", index);
    let params = vec![count as u32, depth as u32, inner as u32];
    launch(spec, format!("onehot_{count}"), count, &[], bindings, params)
}

/// TensorScatter: one gather per output word, from the update or the cache.
fn tensor_scatter(cx: &KernelCx) -> Result<Vec<Dispatch>, NoKernel> {
    let (cache, update) = match cx.inputs {
        [cache, update] | [cache, update, _] => (cache, update),
        _ => return Err(no_kernel!("TensorScatter with {} inputs", cx.inputs.len())),
    };
    let y = &cx.outputs[0];
    let shape = &cache.desc.shape;
    let axis = axis_attr(cx, shape.len())?;
    if axis == 0 || update.desc.dtype != cache.desc.dtype || y.desc != cache.desc {
        return Err(no_kernel!("TensorScatter of {:?} into {:?}", update.desc, cache.desc));
    }
    let units = match cache.desc.dtype.size() {
        4 => 1u32,
        8 => 2,
        _ => return Err(cx.dtype(cache.desc.dtype)),
    };
    let circular = match cx.attrs.text("mode").map_err(|e| no_kernel!("TensorScatter: {e}"))? {
        "linear" => false,
        "circular" => true,
        mode => return Err(no_kernel!("TensorScatter mode {mode}")),
    };
    let indices = cx.inputs.len() == 3;
    let mut bindings = vec![
        Binding::input("x", 0, "u32"),
        Binding::input("u", 1, "u32"),
        Binding::output("y", 0, "u32"),
    ];
    if indices {
        bindings.push(Binding::input("w", 2, "u32"));
    }
    bindable(cx, &bindings)?;
    let inner = shape[axis + 1..].iter().product::<usize>() as u32;
    let (rows, seq) = (shape[axis] as u32, update.desc.shape[axis] as u32);
    let per_batch = shape[1..axis].iter().product::<usize>() as u32;
    let count = y.desc.elements() as u64 * u64::from(units);
    let spec = Spec::new(&TENSOR_SCATTER)
        .set("UNITS", units)
        .set("CIRCULAR", circular)
        .set("INDICES", indices);
    let params = vec![count as u32, inner, rows, seq, per_batch];
    launch(spec, format!("tensor_scatter_{count}"), count, &[inner, rows], bindings, params)
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
        4 => 1u32,
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
    let words = index_words(cx, 1)? as u32;
    let shape = &data.desc.shape;
    let st = contiguous(shape);
    let us = &updates.desc.shape;
    let is = &cx.inputs[1].desc.shape;
    // The update order a reduction must keep: invocation g takes `steps` updates, `inner`
    // apart; `lanes` invocations.
    if shape.len() > MAX_DIMS {
        return Err(no_kernel!("{} of rank {}", cx.op, shape.len()));
    }
    let (form, params, lanes) = if cx.op == "ScatterND" {
        let k = is.last().copied().unwrap_or(0);
        let tuples = is[..is.len().saturating_sub(1)].iter().product::<usize>();
        let slice = shape.get(k..).map_or(0, |s| s.iter().product::<usize>());
        if is.is_empty() || k > shape.len() || updates.desc.elements() != tuples * slice {
            return Err(no_kernel!("ScatterND of {shape:?} by {is:?}"));
        }
        let slice = slice.max(1) as u32;
        let mut params = vec![tuples as u32, slice, slice, k as u32, 0, 0];
        params.extend(array(shape[..k].iter().map(|&n| n as u32), MAX_DIMS));
        params.extend(array(st[..k].iter().map(|&s| word(s)), MAX_DIMS));
        (0u32, params, slice as usize)
    } else {
        let axis = axis_attr(cx, shape.len())?;
        let fits = is.len() == shape.len()
            && is == us
            && is.iter().zip(shape).enumerate().all(|(d, (i, n))| d == axis || i <= n);
        if !fits {
            return Err(no_kernel!("ScatterElements of {shape:?} by {is:?}"));
        }
        let rank = is.len();
        let inner = is[axis + 1..].iter().product::<usize>();
        let n = is[axis];
        let mut params = vec![n as u32, inner as u32, 1, rank as u32];
        params.extend([(rank - 1 - axis) as u32, shape[axis] as u32]);
        params.extend(array(is.iter().rev().map(|&n| n as u32), MAX_DIMS));
        params.extend(array(st.iter().rev().map(|&s| word(s)), MAX_DIMS));
        (1, params, updates.desc.elements() / n.max(1))
    };
    let reduction = match cx.attrs.text("reduction") {
        Ok("none") => 0u32,
        Ok("add") => 1,
        Ok("mul") => 2,
        Ok("max") => 3,
        Ok("min") => 4,
        other => return Err(no_kernel!("{} reduction {other:?}", cx.op)),
    };
    let (ty, count) = match (reduction, dt) {
        (0, _) => ("u32", updates.desc.elements() as u64 * u64::from(units)),
        (_, DType::F32) => ("f32", lanes as u64),
        (_, DType::I32) => ("i32", lanes as u64),
        (_, DType::U32) => ("u32", lanes as u64),
        (_, other) => return Err(no_kernel!("{} reduction on {other}", cx.op)),
    };
    let bindings = vec![
        Binding::input("u", 2, ty),
        Binding::input("ix", 1, "u32"),
        Binding::output("y", 0, ty),
    ];
    bindable(cx, &bindings)?;
    let spec = Spec::new(&SCATTER)
        .alias("T", ty)
        .set("FORM", form)
        .set("REDUCTION", reduction)
        .set("UNITS", units)
        .set("INDEX_WORDS", words);
    let params = [vec![count as u32], params].concat();
    let label = format!("{}_{count}", cx.op.to_lowercase());
    d.extend(launch(spec, label, count, &[], bindings, params)?);
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
    if slabs.iter().map(|&(_, s)| s).sum::<usize>() != row
        || cx.in_place().is_some()
        || slabs.len() > 8
    {
        return Err(no_kernel!("Concat of {row}-element rows from {slabs:?}"));
    }
    let n = (outer * row) as u64;
    let k = 4 / esize as u32;
    let mut bindings = vec![Binding::output("y", 0, "u32")];
    let mut ends = Vec::with_capacity(slabs.len());
    for (j, &(i, slab)) in slabs.iter().enumerate() {
        bindings.push(Binding::input(&format!("x{j}"), i, "u32"));
        ends.push(ends.last().copied().unwrap_or(0) + slab as u32);
    }
    bindable(cx, &bindings)?;
    let spec = Spec::new(&CONCAT_BYTES).set("PACK", k).set("PARTS", slabs.len() as u32);
    let params = [vec![n as u32, row as u32], array(ends, 8)].concat();
    let label = format!("concat_{n}_{k}per");
    launch(spec, label, n.div_ceil(u64::from(k)), &[], bindings, params)
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
        d @ (DType::I4 | DType::U4 | DType::I2 | DType::U2) => {
            vec![crate::movement::cpu::sub_byte_int(i, d)]
        }
        d @ (DType::F8E4M3FN
        | DType::F8E4M3FNUZ
        | DType::F8E5M2
        | DType::F8E5M2FNUZ
        | DType::F8E8M0
        | DType::F4E2M1) => vec![crate::movement::cpu::minifloat_bits(d, f)],
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
    if copy.len() >= 1 << 31 {
        return Err(no_kernel!("{} of {} elements", cx.op, copy.len()));
    }
    // The fill value as a whole word: one element, or the element's bytes repeated.
    let fill_word = u32::from_le_bytes(std::array::from_fn(|b| {
        copy.fill.get(b % esize.min(4)).copied().unwrap_or(0)
    }));
    // The plan in u32 words, or (`packed`, 1- and 2-byte elements that do not group into
    // words) in elements, four or two to an output word.
    let (plan, packed) = match esize {
        4 => (copy, None),
        8 => {
            if copy.fills() && copy.fill.get(..4) != copy.fill.get(4..) {
                return Err(no_kernel!("{}: a fill value with differing words", cx.op));
            }
            (copy.in_words(2).simplify(), None)
        }
        1 | 2 => {
            let k = (4 / esize) as i64;
            match copy.group(k) {
                Some(words) => (words, None),
                None if copy.contiguous() => (copy, Some(k as u32)),
                None => return Err(no_kernel!("{} of {esize}-byte elements at strides", cx.op)),
            }
        }
        _ => return Err(no_kernel!("{} of {esize}-byte elements", cx.op)),
    };
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
    let pack = packed.unwrap_or(1);
    // Invocations: one per unit, or per output word when packed.
    let n = plan.len();
    let count = n.div_ceil(u64::from(pack));
    let shape: Vec<String> = plan.dims.iter().map(|d| d.len.to_string()).collect();
    let label = format!(
        "{}_{}{}",
        cx.op.to_lowercase(),
        shape.join("x"),
        match (vectorised, packed) {
            (true, _) => "_v4".to_string(),
            (false, Some(k)) => format!("_{k}per"),
            _ => String::new(),
        }
    );
    let mut bindings = vec![Binding::input("x", from, ty), Binding::output("y", to, ty)];
    if index.is_some() {
        bindings.push(Binding::input("ix", 1, "u32"));
    }
    // Dims innermost first, as the kernels take them; every one but the outermost divides.
    let dims: Vec<&Dim> = plan.dims.iter().rev().collect();
    let dividers: Vec<u32> =
        dims[..dims.len().saturating_sub(1)].iter().map(|d| d.len as u32).collect();
    let lens = || dims.iter().map(|d| d.len as u32);
    if let Some(band) = plan.band {
        return trilu(&plan, band, label, count, bindings, pack);
    }
    if plan.dims.iter().any(|d| matches!(d.src, Src::Pad { .. })) {
        if dims.len() > MAX_PAD_DIMS {
            return Err(no_kernel!("{} over {} dims", cx.op, dims.len()));
        }
        // Every dim as padded: an affine one (8-byte elements' words) pads nothing.
        let pads: Vec<(u32, i64, u32, PadMode)> = dims
            .iter()
            .map(|d| match d.src {
                Src::Pad { n, before, mode, stride } => (n as u32, before, word(stride), mode),
                Src::Affine(s) => (d.len as u32, 0, word(s), PadMode::Constant),
                _ => unreachable!("a pad copy's dims are padded or affine"),
            })
            .collect();
        let mode = pads.iter().map(|p| p.3).find(|&m| m != PadMode::Constant);
        let mode = mode.unwrap_or(PadMode::Constant) as u32;
        let params = [
            vec![n as u32, fill_word],
            array(lens(), MAX_PAD_DIMS),
            array(pads.iter().map(|p| p.0), MAX_PAD_DIMS),
            array(pads.iter().map(|p| word(p.1)), MAX_PAD_DIMS),
            array(pads.iter().map(|p| p.2), MAX_PAD_DIMS),
        ]
        .concat();
        let spec =
            Spec::new(&PAD).set("DIMS", dims.len() as u32).set("MODE", mode).set("PACK", pack);
        return launch(spec, label, count, &dividers, bindings, params);
    }
    if dims.iter().any(|d| matches!(&d.src, Src::Index { comps, .. } if comps.is_empty())) {
        // GatherND whose tuples have no components: every tuple picks the same slice.
        return Err(no_kernel!("{} with index tuples of no components", cx.op));
    }
    let index_dim = dims.iter().position(|d| d.src.reads_indices());
    let gather = index_dim.map(|k| (k, &dims[k].src));
    if let Some((_, Src::Index { comps, batch })) = gather
        && (comps.len() != 1 || batch.is_some())
    {
        return gather_nd(&plan, label, bindings, ty);
    }
    if dims.len() > MAX_DIMS {
        return Err(no_kernel!("{} over {} dims", cx.op, dims.len()));
    }
    // (GATHER, axis, axis_n, the axis's source stride)
    let (form, axis, axis_n, axis_stride) = match gather {
        Some((k, Src::Index { comps, .. })) => (1u32, k, comps[0].0, comps[0].1),
        Some((k, &Src::Element { n, stride })) => (2, k, n, stride),
        Some((k, &Src::Window { n, stride })) => (3, k, n, stride),
        _ => (0, 0, 0, 0),
    };
    let strides = dims.iter().enumerate().map(|(k, d)| match d.src {
        Src::Affine(s) => word(s),
        _ if k == axis => word(axis_stride),
        _ => unreachable!("one dim of a copy reads indices"),
    });
    let contiguous = plan.contiguous();
    let params = [
        vec![n as u32, word(plan.src_base), word(plan.dst_base), axis as u32, axis_n as u32],
        array(lens(), MAX_DIMS),
        array(strides, MAX_DIMS),
        array(dims.iter().map(|d| word(d.dst)).filter(|_| !contiguous), MAX_DIMS),
    ]
    .concat();
    let spec = Spec::new(&COPY)
        .alias("W", ty)
        .set("DIMS", dims.len() as u32)
        .set("CONTIGUOUS", contiguous)
        .set("PACK", pack)
        .set("GATHER", form)
        .set("UNITS", plan.units as u32)
        .set("INDEX_WORDS", plan.index_words as u32);
    launch(spec, label, count, &dividers, bindings, params)
}

/// GatherND's copy: tuples of index components, each picking a slice of contiguous units.
fn gather_nd(
    plan: &Copy,
    label: String,
    bindings: Vec<Binding>,
    ty: &'static str,
) -> Result<Vec<Dispatch>, NoKernel> {
    let (Src::Index { comps, batch }, inner) = (&plan.dims[0].src, plan.dims.get(1)) else {
        return Err(no_kernel!("a GatherND copy that does not start with its tuples"));
    };
    let inner_len = match inner {
        None => 1,
        Some(d) if d.src == Src::Affine(1) && plan.dims.len() == 2 => d.len,
        Some(_) => return Err(no_kernel!("a GatherND copy of strided slices")),
    };
    if !plan.contiguous() || plan.src_base != 0 || comps.len() > MAX_DIMS {
        return Err(no_kernel!("GatherND of {} components", comps.len()));
    }
    let (per, batch_stride) = batch.unwrap_or((1, 0));
    let params = [
        vec![plan.len() as u32, inner_len as u32, comps.len() as u32, per as u32],
        vec![word(batch_stride)],
        array(comps.iter().map(|c| c.0 as u32), MAX_DIMS),
        array(comps.iter().map(|c| word(c.1)), MAX_DIMS),
    ]
    .concat();
    let spec = Spec::new(&GATHER_ND).alias("W", ty).set("INDEX_WORDS", plan.index_words as u32);
    launch(spec, label, plan.len(), &[inner_len as u32], bindings, params)
}

/// Trilu's copy: the identity inside the band, zeros outside.
fn trilu(
    plan: &Copy,
    band: Band,
    label: String,
    count: u64,
    bindings: Vec<Binding>,
    pack: u32,
) -> Result<Vec<Dispatch>, NoKernel> {
    let (rows, cols) = (plan.dims[band.row].len, plan.dims[band.col].len);
    let identity = plan.dims.iter().all(|d| d.src == Src::Affine(d.dst));
    if pack != 1 || !identity || !plan.contiguous() || plan.src_base != 0 {
        return Err(no_kernel!("Trilu of elements smaller than a word"));
    }
    let params = vec![count as u32, rows as u32, cols as u32, word(band.k)];
    let spec = Spec::new(&TRILU).set("UNITS", plan.units as u32).set("UPPER", band.upper);
    launch(spec, label, count, &[rows as u32, cols as u32], bindings, params)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TensorDesc;
    use crate::reduce::vulkan::tests::specialised;
    use crate::vulkan::valid;
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

    /// Lowers one step and checks every kernel against its module (naga's validation, the
    /// bindings and params it declares).
    /// CPU-type devices' dispatches are checked alike.
    fn lower_ok(op: &str, attrs: &Attrs, inputs: &[Operand], outputs: &[Operand]) -> Vec<Dispatch> {
        let ds = try_lower(op, attrs, inputs, outputs).unwrap_or_else(|e| panic!("{op}: {e}"));
        valid(&ds);
        let cpu = lower_cpu(op, attrs, inputs, outputs);
        assert_eq!(cpu.len(), ds.len());
        ds
    }

    fn lower_cpu(
        op: &str,
        attrs: &Attrs,
        inputs: &[Operand],
        outputs: &[Operand],
    ) -> Vec<Dispatch> {
        let cx = KernelCx { class: DeviceClass::Cpu, op, name: "t", attrs, inputs, outputs };
        let ds = lower(&cx).unwrap_or_else(|e| panic!("{op}: {e}"));
        valid(&ds);
        ds
    }

    /// One line per dispatch: label, file, overrides, bindings and params.
    fn summary(d: &[Dispatch]) -> String {
        d.iter()
            .map(|d| {
                let first = d.wgsl.lines().next();
                let file = FILES.iter().find(|f| f.source.lines().next() == first).unwrap();
                let overrides: Vec<String> =
                    d.overrides.iter().map(|(n, v)| format!("{n}={v}")).collect();
                let bindings: Vec<String> = d
                    .bindings
                    .iter()
                    .map(|b| format!("{}:{:?}:{}", b.name, b.slot, b.ty))
                    .collect();
                format!(
                    "{} {} {} | {} | {:?}\n",
                    d.label,
                    file.path,
                    overrides.join(" "),
                    bindings.join(" "),
                    d.params
                )
            })
            .collect()
    }

    fn override_of(d: &Dispatch, name: &str) -> Option<f64> {
        d.overrides.iter().find(|o| o.0 == name).map(|o| o.1)
    }

    fn ints(v: &[i64]) -> AttrValue {
        AttrValue::Ints(v.to_vec())
    }

    #[test]
    fn every_file_is_a_valid_module() {
        for file in FILES {
            if let Err(e) = compile(file.source, &[]) {
                panic!("{}:\n{e}", file.path);
            }
        }
        crate::vulkan::assert_all_files_listed("movement", &FILES);
    }

    #[test]
    fn copies_merge_into_one_vectorised_run() {
        let d = lower_ok("Reshape", &Attrs::new(), &[f32s(&[2, 8], 0)], &[f32s(&[16], 64)]);
        assert_eq!(d[0].label, "reshape_4_v4");
        assert_eq!(d[0].bindings[0].ty, "vec4<u32>");
        assert_eq!(override_of(&d[0], "DIMS"), Some(1.0));
        // int64 moves as pairs of words; an odd count stays scalar.
        let d = lower_ok(
            "Identity",
            &Attrs::new(),
            &[t(DType::I64, &[3], 0)],
            &[t(DType::I64, &[3], 64)],
        );
        assert_eq!((d[0].label.as_str(), d[0].bindings[0].ty), ("identity_6", "u32"));
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
        // Steps of one op and types share one module: only the params differ.
        let a = lower_ok("Identity", &Attrs::new(), &[f32s(&[5], 0)], &[f32s(&[5], 64)]);
        let b = lower_ok("Identity", &Attrs::new(), &[f32s(&[7], 0)], &[f32s(&[7], 64)]);
        assert_eq!((&a[0].wgsl, &a[0].overrides), (&b[0].wgsl, &b[0].overrides));
        assert_ne!(a[0].params, b[0].params);
    }

    #[test]
    fn strides_and_bases_are_params() {
        // Transpose [1, 3, 4, 5] -> [1, 4, 5, 3]: dims of 1 dropped, the output's (4, 5) read
        // as one dim of 20 at stride 1; innermost first: 3 at stride 20, then 20 at stride 1.
        let attrs = Attrs::new().with("perm", ints(&[0, 2, 3, 1]));
        let d =
            lower_ok("Transpose", &attrs, &[f32s(&[1, 3, 4, 5], 0)], &[f32s(&[1, 4, 5, 3], 256)]);
        assert_eq!(d[0].label, "transpose_20x3");
        let p = &d[0].params;
        assert_eq!((p[0], p[1], p[2]), (60, 0, 0), "count, source and destination base");
        assert_eq!((&p[5..7], &p[13..15]), (&[3, 20][..], &[20, 1][..]), "lens, strides");
        // x[1:, ::-2] of [3, 5]: rows 1, 2; columns 4, 2, 0: base 9, a stride of -2 in two's
        // complement.
        let attrs = Attrs::new()
            .with("starts", ints(&[1, 4]))
            .with("ends", ints(&[3, -1]))
            .with("steps", ints(&[1, -2]));
        let d = lower_ok("Slice", &attrs, &[f32s(&[3, 5], 0)], &[f32s(&[2, 3], 64)]);
        let p = &d[0].params;
        assert_eq!((p[1], &p[5..7], &p[13..15]), (9, &[3, 2][..], &[(-2i32) as u32, 5][..]));
        // Concat writes each part at its slab's place: destination strides and base.
        let attrs = Attrs::new().with("axis", AttrValue::Int(1));
        let parts = [f32s(&[2, 3, 4], 0), f32s(&[2, 1, 4], 256), f32s(&[2, 0, 4], 512)];
        let joined = f32s(&[2, 4, 4], 1024);
        let d = lower_ok("Concat", &attrs, &parts, std::slice::from_ref(&joined));
        assert_eq!(d.len(), 2, "the empty part has no dispatch");
        assert_eq!(d[1].bindings[0].slot, Slot::Input(1));
        assert_eq!(override_of(&d[1], "CONTIGUOUS"), Some(0.0));
        // In vec4s: two rows of one, read one apart, written four apart from the fourth.
        assert_eq!(d[1].label, "concat_2_v4");
        let p = &d[1].params;
        assert_eq!((p[2], p[5], p[13], p[21]), (3, 2, 1, 4));
        let d = lower_ok("Split", &attrs, std::slice::from_ref(&joined), &parts);
        assert_eq!(d.len(), 2);
        assert_eq!(d[1].bindings[1].slot, Slot::Output(1));
        assert_eq!(d[1].params[1], 3, "part 1 starts at row 3 of 4, vec4 3");
        // Parts that do not add up are refused.
        assert!(try_lower("Concat", &attrs, &parts[..2], &[f32s(&[2, 5, 4], 1024)]).is_err());
    }

    #[test]
    fn every_form_of_copy() {
        let mut out = String::new();
        let mut add = |name: &str, d: Vec<Dispatch>| {
            valid(&d);
            out += &format!("{name}:\n{}", summary(&d));
        };
        for mode in ["constant", "edge", "wrap", "reflect"] {
            let attrs = Attrs::new()
                .with("pads", ints(&[0, 1, -1, 2]))
                .with("mode", AttrValue::Text(mode.into()))
                .with("value", AttrValue::Float(1.5));
            add(mode, lower_ok("Pad", &attrs, &[f32s(&[3, 4], 0)], &[f32s(&[2, 7], 64)]));
        }
        let attrs = Attrs::new().with("repeats", ints(&[2, 3]));
        add("tile", lower_ok("Tile", &attrs, &[f32s(&[2, 4], 0)], &[f32s(&[4, 12], 64)]));
        let attrs = Attrs::new().with("shape", ints(&[2, 3, 4]));
        add("expand", lower_ok("Expand", &attrs, &[f32s(&[3, 1], 0)], &[f32s(&[2, 3, 4], 64)]));
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
                add(mode, lower_ok(op, &attrs, &[f32s(&i, 0)], &[f32s(&o, 256)]));
            }
        }
        let axis = |a| Attrs::new().with("axis", AttrValue::Int(a));
        for dt in [DType::I64, DType::I32] {
            let d = lower_ok(
                "Gather",
                &axis(1),
                &[f32s(&[2, 5, 8], 0), t(dt, &[3], 512)],
                &[f32s(&[2, 3, 8], 1024)],
            );
            add(&format!("gather by {dt}"), d);
        }
        let d = lower_ok(
            "Gather",
            &axis(0),
            &[t(DType::I64, &[5], 0), t(DType::I64, &[2, 2], 64)],
            &[t(DType::I64, &[2, 2], 128)],
        );
        add("gather int64 data", d);
        let window = Attrs::new().with("axes", ints(&[1])).with("sizes", ints(&[2]));
        for dt in [DType::I64, DType::I32] {
            let d = lower_ok(
                "DynamicSlice",
                &window,
                &[f32s(&[2, 5, 3], 0), t(dt, &[1], 512)],
                &[f32s(&[2, 2, 3], 1024)],
            );
            add(&format!("dynamic slice by {dt}"), d);
        }
        let d = lower_ok(
            "GatherElements",
            &axis(1),
            &[f32s(&[2, 5], 0), t(DType::I64, &[2, 3], 64)],
            &[f32s(&[2, 3], 128)],
        );
        add("gather elements", d);
        let d = lower_ok(
            "GatherElements",
            &axis(0),
            &[t(DType::I64, &[4, 2], 0), t(DType::I32, &[3, 2], 64)],
            &[t(DType::I64, &[3, 2], 128)],
        );
        add("gather elements int64 data", d);
        let attrs = Attrs::new().with("batch_dims", AttrValue::Int(1));
        let d = lower_ok(
            "GatherND",
            &attrs,
            &[f32s(&[2, 3, 4], 0), t(DType::I64, &[2, 5, 1], 128)],
            &[f32s(&[2, 5, 4], 256)],
        );
        add("gather nd, batch", d);
        let attrs = Attrs::new().with("batch_dims", AttrValue::Int(0));
        let d = lower_ok(
            "GatherND",
            &attrs,
            &[f32s(&[2, 3, 4], 0), t(DType::I32, &[5, 2], 128)],
            &[f32s(&[5, 4], 256)],
        );
        add("gather nd", d);
        // Tuples of no components are refused, not lowered.
        let refused = try_lower(
            "GatherND",
            &attrs,
            &[f32s(&[2, 3], 0), t(DType::I64, &[2, 0], 128)],
            &[f32s(&[2, 2, 3], 256)],
        );
        assert!(refused.is_err());
        for upper in [1, 0] {
            let attrs =
                Attrs::new().with("upper", AttrValue::Int(upper)).with("k", AttrValue::Int(-1));
            let d = lower_ok("Trilu", &attrs, &[f32s(&[2, 3, 4], 0)], &[f32s(&[2, 3, 4], 128)]);
            add(&format!("trilu upper={upper}"), d);
        }
        let attrs =
            Attrs::new().with("upper", AttrValue::Int(1)).with("k", AttrValue::Int(i64::MAX));
        let d =
            lower_ok("Trilu", &attrs, &[t(DType::I64, &[3, 3], 0)], &[t(DType::I64, &[3, 3], 128)]);
        add("trilu int64, k clamped", d);
        let d = lower_ok(
            "Dropout",
            &Attrs::new(),
            &[f32s(&[5], 0)],
            &[f32s(&[5], 64), t(DType::Bool, &[5], 128)],
        );
        add("dropout and its mask", d);
        insta::assert_snapshot!("every_form_of_copy", out);
    }

    #[test]
    fn bytes_that_do_not_group_are_packed_into_words() {
        // A bool transpose: four elements per invocation (the last word keeps its 3rd and 4th
        // bytes: 6 elements).
        let attrs = Attrs::new().with("perm", ints(&[1, 0]));
        let d = lower_ok(
            "Transpose",
            &attrs,
            &[t(DType::Bool, &[2, 3], 0)],
            &[t(DType::Bool, &[3, 2], 64)],
        );
        assert_eq!(d[0].label, "transpose_3x2_4per");
        assert_eq!((d[0].groups, d[0].params[0]), ([1, 1, 1], 6));
        assert_eq!(override_of(&d[0], "PACK"), Some(4.0));
        // f16 padding: two to a word, with the fill's bits in every half.
        let attrs = Attrs::new()
            .with("pads", ints(&[1, 0]))
            .with("mode", AttrValue::Text("constant".into()))
            .with("value", AttrValue::Float(1.0));
        let d = lower_ok("Pad", &attrs, &[t(DType::F16, &[3], 0)], &[t(DType::F16, &[4], 64)]);
        assert_eq!(override_of(&d[0], "PACK"), Some(2.0));
        assert_eq!(d[0].params[1], 0x3c00_3c00);
        // A bool concat whose slabs share words: one kernel writes each word from its parts.
        let attrs = Attrs::new().with("axis", AttrValue::Int(1));
        let parts = [t(DType::Bool, &[2, 3], 0), t(DType::Bool, &[2, 1], 16)];
        let d = lower_ok("Concat", &attrs, &parts, &[t(DType::Bool, &[2, 4], 32)]);
        assert_eq!((d.len(), d[0].label.as_str()), (1, "concat_8_4per"));
        assert_eq!(d[0].bindings.len(), 3);
        assert_eq!(d[0].params[..4], [8, 4, 3, 4], "elements, row, the parts' ends");
        // Whole words: one word copy per part.
        let parts = [t(DType::Bool, &[2, 4], 0), t(DType::Bool, &[2, 8], 16)];
        let d = lower_ok("Concat", &attrs, &parts, &[t(DType::Bool, &[2, 12], 32)]);
        assert_eq!(d.len(), 2);
        // Bytes not on a word boundary cannot be addressed.
        let odd = [t(DType::Bool, &[4], 2)];
        assert!(try_lower("Identity", &Attrs::new(), &odd, &[t(DType::Bool, &[4], 64)]).is_err());
        // int64 with a pad value whose words differ has no kernel; -1 does.
        let pad = |v: i64| {
            let attrs = Attrs::new()
                .with("pads", ints(&[1, 1]))
                .with("mode", AttrValue::Text("constant".into()))
                .with("value", AttrValue::Int(v));
            try_lower("Pad", &attrs, &[t(DType::I64, &[3], 0)], &[t(DType::I64, &[5], 64)])
        };
        assert!(pad(7).is_err());
        valid(&pad(-1).unwrap());
    }

    #[test]
    fn cum_sum_one_hot_and_scatters() {
        let mut out = String::new();
        let mut add = |name: &str, d: Vec<Dispatch>| {
            valid(&d);
            out += &format!("{name}:\n{}", summary(&d));
        };
        for (dt, ex, rev) in [(DType::F32, 0, 0), (DType::I64, 1, 1), (DType::I32, 1, 0)] {
            let attrs = Attrs::new()
                .with("axis", AttrValue::Int(1))
                .with("exclusive", AttrValue::Int(ex))
                .with("reverse", AttrValue::Int(rev));
            let d = lower_ok("CumSum", &attrs, &[t(dt, &[2, 5, 3], 0)], &[t(dt, &[2, 5, 3], 256)]);
            add(&format!("cumsum {dt}"), d);
            if dt != DType::I64 {
                let d =
                    lower_ok("CumProd", &attrs, &[t(dt, &[2, 5, 3], 0)], &[t(dt, &[2, 5, 3], 256)]);
                add(&format!("cumprod {dt}"), d);
            }
        }
        for (idx, vals) in
            [(DType::I64, DType::F32), (DType::F32, DType::I64), (DType::I32, DType::I32)]
        {
            let attrs =
                Attrs::new().with("axis", AttrValue::Int(1)).with("depth", AttrValue::Int(4));
            let d = lower_ok(
                "OneHot",
                &attrs,
                &[t(idx, &[2, 3], 0), t(vals, &[2], 64)],
                &[t(vals, &[2, 4, 3], 128)],
            );
            add(&format!("onehot {idx} {vals}"), d);
        }
        let reduction = |r: &str, axis| {
            Attrs::new()
                .with("reduction", AttrValue::Text(r.into()))
                .with("axis", AttrValue::Int(axis))
        };
        // TensorScatter: the write indices bound last, and only where the step has them.
        for (mode, dt) in [("linear", DType::F32), ("circular", DType::I64)] {
            let attrs = Attrs::new()
                .with("axis", AttrValue::Int(2))
                .with("mode", AttrValue::Text(mode.into()));
            let (cache, update) = (t(dt, &[2, 3, 8, 4], 0), t(dt, &[2, 3, 2, 4], 1536));
            let with = [cache.clone(), update.clone(), t(DType::I64, &[2], 2048)];
            let d = lower_ok("TensorScatter", &attrs, &with, &[t(dt, &[2, 3, 8, 4], 4096)]);
            assert_eq!(d[0].bindings.len(), 4);
            add(&format!("tensor scatter {mode} {dt}"), d);
            let d =
                lower_ok("TensorScatter", &attrs, &[cache, update], &[t(dt, &[2, 3, 8, 4], 4096)]);
            assert_eq!(d[0].bindings.len(), 3);
        }
        let nd = [f32s(&[4, 3], 0), t(DType::I64, &[2, 1], 64), f32s(&[2, 3], 128)];
        let d = lower_ok("ScatterND", &reduction("none", 0), &nd, &[f32s(&[4, 3], 256)]);
        assert_eq!(d.len(), 2, "copy, then scatter");
        add("scatternd", d);
        let d = lower_ok(
            "ScatterElements",
            &reduction("none", 1),
            &[t(DType::I64, &[4, 3], 0), t(DType::I32, &[4, 2], 128), t(DType::I64, &[4, 2], 192)],
            &[t(DType::I64, &[4, 3], 256)],
        );
        add("scatter elements int64", d);
        // Reductions keep the CPU's order: one invocation per slice element here, each taking
        // both tuples.
        let d = lower_ok("ScatterND", &reduction("add", 0), &nd, &[f32s(&[4, 3], 256)]);
        assert_eq!((d[1].params[0], d[1].params[1], d[1].groups), (3, 2, [1, 1, 1]));
        add("scatternd add", d);
        let d = lower_ok(
            "ScatterElements",
            &reduction("max", 0),
            &[t(DType::I32, &[4, 3], 0), t(DType::I64, &[2, 3], 64), t(DType::I32, &[2, 3], 128)],
            &[t(DType::I32, &[4, 3], 256)],
        );
        add("scatter elements max", d);
        insta::assert_snapshot!("cum_sum_one_hot_and_scatters", out);
    }

    #[test]
    fn a_specialised_copy() {
        // What a module is made of: the file, W aliased, the fast division hooked in.
        let attrs = Attrs::new().with("perm", ints(&[1, 0]));
        let d = lower_ok("Transpose", &attrs, &[f32s(&[8, 16], 0)], &[f32s(&[16, 8], 1024)]);
        insta::assert_snapshot!("transpose_copy", specialised(&d[0]));
    }

    #[test]
    fn large_copies_use_two_grid_dimensions() {
        let n = 65535 * 64 * 4 + 3;
        let attrs = Attrs::new().with("perm", ints(&[1, 0]));
        let d = lower_ok("Transpose", &attrs, &[f32s(&[n, 2], 0)], &[f32s(&[2, n], 0x1000_0000)]);
        assert!(d[0].groups[1] > 1);
        // Not in place.
        assert!(try_lower("Transpose", &attrs, &[f32s(&[n, 2], 0)], &[f32s(&[2, n], 0)]).is_err());
        // The fast division where every divisor is below 2^24; an inner dim of 2^24 (the
        // output's rows: the innermost dim read) divides exactly.
        let exact = "return vec2<u32>(n / d, n % d);";
        let d = lower_ok("Transpose", &attrs, &[f32s(&[2, 8], 0)], &[f32s(&[8, 2], 1024)]);
        assert!(!d[0].wgsl.contains(exact));
        let big = 1 << 24;
        let d = lower_ok("Transpose", &attrs, &[f32s(&[big, 2], 0)], &[f32s(&[2, big], 1 << 27)]);
        assert_eq!(d[0].params[5], big as u32);
        assert!(d[0].wgsl.contains(exact));
    }
}
