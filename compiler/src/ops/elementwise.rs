//! (family stub: to be filled in)

use super::OpDef;

pub const OPS: &[OpDef] = &[];
