//! Kernels as WGSL files: a family's `*.wgsl` files are valid modules on their own, and a
//! dispatch runs one of them specialised in three ways only, each a WGSL declaration the file
//! already has, so the file stays valid and reviewable as it is:
//!
//! - **aliases** (`alias T = f32;`) name the element types: [`Spec::alias`] retypes one;
//! - **overrides** (`override BLOCK: u32 = 4u;`) fix the few numbers that decide the code's shape
//!   (vector widths, unrolled window sizes, flags): [`Spec::set`]; naga substitutes them, so
//!   each set of values is a module of its own, and a family keeps such sets few;
//! - **hooks**: a function the file defines with a default body (`fn post_op(v: f32, i: u32) ->
//!   f32 { return v; }`), which [`Spec::hook`] replaces by a generated one of the same signature
//!   (an op's expression, the fused post-ops). A hook may call library functions
//!   ([`Spec::library`]: further WGSL files of helper functions, appended).
//!
//! Everything else (shapes, strides, counts) comes from push-constant params at run time, so
//! one module serves every step of the same op, types and variant.
//!
//! Conventions the splicing relies on (checked by each family's unit tests, which validate every
//! file alone and every specialisation they make): an alias is one line starting `alias NAME =`;
//! a hook starts at a line `fn NAME(` and ends at the first line that is exactly `}`.

use super::{Binding, Dispatch, Grid, NoKernel};
use crate::no_kernel;

/// A WGSL file of the crate, embedded at build time.
#[derive(Debug, PartialEq, Eq)]
pub struct Wgsl {
    /// Its path under `ops/src/`, for messages and snapshots.
    pub path: &'static str,
    pub source: &'static str,
}

/// Embeds `ops/src/<path>`: `wgsl!("conv/direct.wgsl")`.
#[macro_export]
macro_rules! wgsl {
    ($path:literal) => {
        $crate::vulkan::Wgsl {
            path: $path,
            source: include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/src/", $path)),
        }
    };
}

/// The quotient and remainder for [`Spec::divmod`].
pub(crate) static DIVMOD: Wgsl = crate::wgsl!("vulkan/divmod.wgsl");

/// One kernel file specialised for a dispatch.
#[derive(Clone, Debug)]
pub struct Spec {
    file: &'static Wgsl,
    aliases: Vec<(&'static str, String)>,
    hooks: Vec<(&'static str, String)>,
    libraries: Vec<&'static Wgsl>,
    overrides: Vec<(&'static str, f64)>,
}

impl Spec {
    pub fn new(file: &'static Wgsl) -> Spec {
        Spec {
            file,
            aliases: Vec::new(),
            hooks: Vec::new(),
            libraries: Vec::new(),
            overrides: Vec::new(),
        }
    }

    /// `alias name = ty;`
    pub fn alias(mut self, name: &'static str, ty: impl Into<String>) -> Spec {
        self.aliases.push((name, ty.into()));
        self
    }

    /// Replaces hook `name` by `function`, the complete WGSL function (same name and
    /// signature).
    pub fn hook(mut self, name: &'static str, function: impl Into<String>) -> Spec {
        self.hooks.push((name, function.into()));
        self
    }

    /// Appends the helper functions of `library` (once, however often it is asked for).
    pub fn library(mut self, library: &'static Wgsl) -> Spec {
        if !self.libraries.contains(&library) {
            self.libraries.push(library);
        }
        self
    }

    /// Replaces the kernel's exact `divmod(n, d)` by `vulkan/divmod.wgsl`'s, a few vector
    /// instructions where CPU-type devices divide lane by lane: for n < 2^31 and 0 < d < 2^24
    /// only, which the caller checks.
    pub fn divmod(self) -> Spec {
        self.hook("divmod", DIVMOD.source)
    }

    /// Sets override `name`.
    pub fn set(mut self, name: &'static str, value: impl Into<f64>) -> Spec {
        self.overrides.push((name, value.into()));
        self
    }

    /// The module's source: the file with its aliases and hooks replaced, then the libraries.
    pub fn source(&self) -> Result<String, NoKernel> {
        let mut lines: Vec<String> = self.file.source.lines().map(str::to_string).collect();
        for (name, ty) in &self.aliases {
            let head = format!("alias {name} =");
            let line = lines
                .iter_mut()
                .find(|l| l.starts_with(&head))
                .ok_or_else(|| no_kernel!("{} has no alias {name}", self.file.path))?;
            *line = format!("alias {name} = {ty};");
        }
        for (name, function) in &self.hooks {
            let head = format!("fn {name}(");
            let start = lines
                .iter()
                .position(|l| l.starts_with(&head))
                .ok_or_else(|| no_kernel!("{} has no hook {name}", self.file.path))?;
            let end = lines[start..]
                .iter()
                .position(|l| l == "}")
                .map(|k| start + k)
                .ok_or_else(|| no_kernel!("{}: hook {name} does not end", self.file.path))?;
            lines.splice(start..=end, [function.trim_end().to_string()]);
        }
        let mut out = lines.join("\n");
        out.push('\n');
        for library in &self.libraries {
            out.push('\n');
            out.push_str(library.source);
        }
        Ok(out)
    }

    /// The dispatch of this module: `groups` workgroups, `bindings` in slot order, `params` the
    /// push-constant words after the binding offsets.
    pub fn dispatch(
        &self,
        label: impl Into<String>,
        groups: [u32; 3],
        bindings: Vec<Binding>,
        params: Vec<u32>,
    ) -> Result<Dispatch, NoKernel> {
        Ok(Dispatch {
            label: label.into(),
            wgsl: self.source()?,
            overrides: self.overrides.clone(),
            groups,
            bindings,
            params,
        })
    }

    /// The dispatch of this module with one invocation per element of a flat range of
    /// `invocations`, in workgroups of 64 (its `WG` override): the form of kernels that need
    /// no tiling.
    pub fn flat(
        self,
        label: impl Into<String>,
        invocations: u64,
        bindings: Vec<Binding>,
        params: Vec<u32>,
    ) -> Result<Dispatch, NoKernel> {
        let grid = Grid::new(invocations, 64)?;
        self.set("WG", 64).dispatch(label, grid.groups, bindings, params)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static FILE: Wgsl = Wgsl {
        path: "test.wgsl",
        source: "alias T = f32;\noverride N: u32 = 1u;\nfn op(x: T) -> T {\n    return x;\n}\n\
                 fn main() {}\n",
    };
    static LIB: Wgsl =
        Wgsl { path: "lib.wgsl", source: "fn twice(x: f32) -> f32 { return 2.0 * x; }\n" };

    #[test]
    fn aliases_and_hooks_are_replaced_and_libraries_appended_once() {
        let spec = Spec::new(&FILE)
            .alias("T", "i32")
            .hook("op", "fn op(x: T) -> T { return twice(x); }")
            .library(&LIB)
            .library(&LIB)
            .set("N", 4);
        assert_eq!(
            spec.source().unwrap(),
            "alias T = i32;\noverride N: u32 = 1u;\nfn op(x: T) -> T { return twice(x); }\n\
             fn main() {}\n\nfn twice(x: f32) -> f32 { return 2.0 * x; }\n"
        );
        let d = spec.dispatch("t", [1, 1, 1], Vec::new(), vec![7]).unwrap();
        assert_eq!((d.overrides, d.params), (vec![("N", 4.0)], vec![7]));
    }

    #[test]
    fn a_missing_alias_or_hook_is_an_error() {
        assert!(Spec::new(&FILE).alias("U", "u32").source().is_err());
        assert!(Spec::new(&FILE).hook("other", "fn other() {}").source().is_err());
    }

    #[test]
    fn divmod_is_exact() {
        // vulkan/divmod.wgsl, step by step in f32 as the shader runs it; `skew` moves the
        // reciprocal by a few ulps, as GPUs' division may.
        fn divmod(n: u32, d: u32, skew: i32) -> (u32, u32) {
            let inv = f32::from_bits((1.0 / d as f32).to_bits().wrapping_add_signed(skew));
            let q = (n as f32 * inv) as u32;
            let r = n.wrapping_sub(q.wrapping_mul(d)) as i32;
            let c = (r as f32 * inv).floor() as i32;
            let (mut qi, mut ri) = (q as i32 + c, r - c * d as i32);
            if ri < 0 {
                qi -= 1;
                ri += d as i32;
            } else if ri >= d as i32 {
                qi += 1;
                ri -= d as i32;
            }
            (qi as u32, ri as u32)
        }
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for k in 0..200_000u32 {
            // Quotients near whole numbers are where an estimate goes wrong.
            let d = match k % 3 {
                0 => (next() % 64) as u32 + 1,
                1 => (next() % 5000) as u32 + 1,
                _ => (next() % ((1 << 24) - 1)) as u32 + 1,
            };
            let n = match k % 4 {
                0 => (next() % (1 << 31)) as u32,
                1 => ((next() % (1 << 31)) as u32 / d) * d,
                2 => (((next() % (1 << 31)) as u32 / d) * d).saturating_sub(1),
                _ => (next() % 100_000) as u32,
            };
            for skew in [-3, 0, 3] {
                assert_eq!(divmod(n, d, skew), (n / d, n % d), "{n} / {d}, skew {skew}");
            }
        }
    }
}
