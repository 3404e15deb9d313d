// Pad in its four modes (MODE: 0 constant, 1 edge, 2 wrap, 3 reflect), and Dropout's all-true
// mask (a constant pad of nothing). Invocation g writes destination word g, which is unit g of
// the iteration space; with PACK 2 or 4, destination word g of PACK elements of 2 or 1 bytes,
// the last word keeping the bytes past the tensor's end.
//
// The iteration space has DIMS dims (1 to 7), innermost first. Dim k has n[k] coordinates;
// coordinate c is source coordinate c - before[k] of a source dim of m[k], mapped by the mode
// into [0, m[k]), where it moves the source by s[k] units. In constant mode a coordinate
// outside the source reads the fill value (`fill`: one word, or one element's bits repeated).

override WG: u32 = 64u;
override DIMS: u32 = 1u;
override MODE: u32 = 0u;
override PACK: u32 = 1u;

@group(0) @binding(0) var<storage, read> x: array<u32>;
@group(0) @binding(1) var<storage, read_write> y: array<u32>;

struct Params {
    x: u32,
    y: u32,
    // Units to write; elements when packed.
    count: u32,
    fill: u32,
    n: array<u32, 7>,
    m: array<u32, 7>,
    before: array<i32, 7>,
    s: array<u32, 7>,
}
var<immediate> p: Params;

fn divmod(n: u32, d: u32) -> vec2<u32> {
    return vec2<u32>(n / d, n % d);
}

// q modulo m, in [0, m).
fn modulo(q: i32, m: i32) -> i32 {
    let r = q % m;
    return select(r, r + m, r < 0i);
}

// Where unit g reads the source, or -1 for the fill value.
fn source(g: u32) -> i32 {
    var rest = g;
    var at = 0u;
    for (var k = 0u; k < DIMS; k++) {
        var c = rest;
        if (k + 1u < DIMS) {
            let qr = divmod(rest, p.n[k]);
            c = qr.y;
            rest = qr.x;
        }
        let m = i32(p.m[k]);
        var q = i32(c) - p.before[k];
        if (MODE == 0u) {
            if (q < 0i || q >= m) {
                return -1i;
            }
        } else if (MODE == 1u) {
            q = clamp(q, 0i, m - 1i);
        } else if (MODE == 2u) {
            q = modulo(q, m);
        } else if (m == 1i) {
            q = 0i;
        } else {
            let period = 2i * (m - 1i);
            let r = modulo(q, period);
            q = select(r, period - r, r >= m);
        }
        at += u32(q) * p.s[k];
    }
    return i32(at);
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let g = gid.x + gid.y * groups.x * WG;
    if (PACK == 1u) {
        if (g < p.count) {
            let s = source(g);
            var v = p.fill;
            if (s >= 0i) {
                v = x[p.x + u32(s)];
            }
            y[p.y + g] = v;
        }
        return;
    }
    let first = g * PACK;
    if (first >= p.count) {
        return;
    }
    let bits = 32u / PACK;
    let mask = 0xffffffffu >> (32u - bits);
    var w = 0u;
    for (var l = 0u; l < PACK; l++) {
        if (first + l == p.count) {
            w |= y[p.y + g] & (0xffffffffu << (l * bits));
            break;
        }
        let s = source(first + l);
        var e = p.fill & mask;
        if (s >= 0i) {
            e = (x[p.x + u32(s) / PACK] >> ((u32(s) % PACK) * bits)) & mask;
        }
        w |= e << (l * bits);
    }
    y[p.y + g] = w;
}
