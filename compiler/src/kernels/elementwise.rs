//! Elementwise kernels: unary maps, broadcasting binary and variadic ops, Where, Clip.

use super::{Binding, Dispatch, Grid, KernelCx, NoKernel, header};

pub const OPS: &[&str] = &["Relu"];

/// The WGSL expression of unary float op `op` applied to the f32 expression `x`.
pub fn unary_expr(op: &str, x: &str) -> Option<String> {
    Some(match op {
        "Relu" => format!("max({x}, 0.0)"),
        _ => return None,
    })
}

pub fn lower(cx: &KernelCx) -> Result<Vec<Dispatch>, NoKernel> {
    cx.require_f32()?;
    let n = cx.outputs[0].desc.elements() as u64;
    let grid = Grid::new(n, 64)?;
    let bindings = vec![
        Binding::input("x", 0, "f32"),
        Binding::output("y", 0, "f32"),
    ];
    let expr = unary_expr(cx.op, "x[offsets.x + i]")
        .ok_or_else(|| crate::no_kernel!("no Vulkan kernel for {}", cx.op))?;
    let wgsl = format!(
        "{}\n{} {{\n    let i = {};\n    if (i >= {n}u) {{ return; }}\n    y[offsets.y + i] = {expr};\n}}\n",
        header(&bindings),
        grid.entry(),
        grid.index()
    );
    Ok(vec![Dispatch {
        label: format!("{}_{n}", cx.op.to_lowercase()),
        wgsl,
        groups: grid.groups,
        bindings,
    }])
}
