// The four bool bytes of a word, and back. A library.

fn bytes4(w: u32) -> vec4<bool> {
    return vec4<bool>((w & 0xffu) != 0u, (w & 0xff00u) != 0u, (w & 0xff0000u) != 0u, (w & 0xff000000u) != 0u);
}

fn pack4(b: vec4<bool>) -> u32 {
    let v = select(vec4<u32>(0u), vec4<u32>(1u), b);
    return v.x | (v.y << 8u) | (v.z << 16u) | (v.w << 24u);
}
