// RoiAlign (pool/vulkan.rs; the rules are pool/roi_align.rs's): one invocation per output
// element [roi, channel, bin row, bin column], its samples computed as the CPU computes them.
// A batch index outside X gives zeros (the CPU refuses it). The batch indices are int64,
// read as word pairs.

override WG: u32 = 64u;
override HALF_PIXEL: bool = true;
override MAX: bool = false;

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> rois: array<f32>;
@group(0) @binding(2) var<storage, read> batch: array<u32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

struct Params {
    x: u32,
    rois: u32,
    batch: u32,
    y: u32,
    count: u32,
    images: u32,
    channels: u32,
    h: u32,
    w: u32,
    out_h: u32,
    out_w: u32,
    ratio: u32,
    // spatial_scale's f32 bits.
    scale: u32,
}
var<immediate> p: Params;

// A sample's two neighbours along one axis of n pixels and its coordinate, clamped to the
// last pixel past it.
struct Corner {
    low: u32,
    high: u32,
    at: f32,
}

fn corner(v: f32, n: u32) -> Corner {
    let low = u32(max(v, 0.0));
    if (low >= n - 1u) {
        return Corner(n - 1u, n - 1u, f32(n - 1u));
    }
    return Corner(low, low + 1u, max(v, 0.0));
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let g = gid.x + gid.y * groups.x * WG;
    if (g >= p.count) {
        return;
    }
    let pw = g % p.out_w;
    let ph = (g / p.out_w) % p.out_h;
    let c = (g / (p.out_w * p.out_h)) % p.channels;
    let r = g / (p.out_w * p.out_h * p.channels);
    let image = batch[p.batch + 2u * r];
    if (batch[p.batch + 2u * r + 1u] != 0u || image >= p.images) {
        y[p.y + g] = 0.0;
        return;
    }
    let scale = bitcast<f32>(p.scale);
    let offset = select(0.0, 0.5, HALF_PIXEL);
    let roi = p.rois + 4u * r;
    let x1 = rois[roi] * scale - offset;
    let y1 = rois[roi + 1u] * scale - offset;
    var roi_w = rois[roi + 2u] * scale - offset - x1;
    var roi_h = rois[roi + 3u] * scale - offset - y1;
    if (!HALF_PIXEL) {
        roi_w = max(roi_w, 1.0);
        roi_h = max(roi_h, 1.0);
    }
    let bin_h = roi_h / f32(p.out_h);
    let bin_w = roi_w / f32(p.out_w);
    var grid_h = p.ratio;
    var grid_w = p.ratio;
    if (p.ratio == 0u) {
        grid_h = u32(max(ceil(bin_h), 0.0));
        grid_w = u32(max(ceil(bin_w), 0.0));
    }
    let map = p.x + (image * p.channels + c) * p.h * p.w;
    var acc = 0.0;
    var first = true;
    for (var iy = 0u; iy < grid_h; iy++) {
        let sy = y1 + f32(ph) * bin_h + (f32(iy) + 0.5) * bin_h / f32(grid_h);
        for (var ix = 0u; ix < grid_w; ix++) {
            let sx = x1 + f32(pw) * bin_w + (f32(ix) + 0.5) * bin_w / f32(grid_w);
            // The four weighted corners; none outside the map.
            var v = vec4<f32>(0.0);
            if (!(sy < -1.0 || sy > f32(p.h) || sx < -1.0 || sx > f32(p.w))) {
                let cy = corner(sy, p.h);
                let cx = corner(sx, p.w);
                let ly = cy.at - f32(cy.low);
                let lx = cx.at - f32(cx.low);
                let hy = 1.0 - ly;
                let hx = 1.0 - lx;
                v = vec4<f32>(
                    hy * hx * x[map + cy.low * p.w + cx.low],
                    hy * lx * x[map + cy.low * p.w + cx.high],
                    ly * hx * x[map + cy.high * p.w + cx.low],
                    ly * lx * x[map + cy.high * p.w + cx.high],
                );
            }
            if (MAX) {
                let m = max(max(max(v.x, v.y), v.z), v.w);
                acc = select(max(acc, m), m, first);
                first = false;
            } else {
                acc = acc + (((v.x + v.y) + v.z) + v.w);
            }
        }
    }
    if (!MAX) {
        acc = acc / f32(max(grid_h * grid_w, 1u));
    }
    y[p.y + g] = acc;
}
