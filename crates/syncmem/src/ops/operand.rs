//! Names of an operator's inputs and outputs for errors ([`Operand`]), and the checks every
//! operator's `run` starts with ([`check_context`]).

use std::fmt;

use super::OperatorDef;
use crate::context::Context;
use crate::device::Device;
use crate::error::{Error, Result};

/// An input or output of an operator, for error messages: `input 1 ("W") of operator FC
/// "fc1"`. Formatted only when an error is returned.
#[derive(Debug, Clone, Copy)]
pub struct Operand<'d> {
    def: &'d OperatorDef,
    index: usize,
    output: bool,
}

impl<'d> Operand<'d> {
    /// Input `i` of `def`.
    pub fn input(def: &'d OperatorDef, i: usize) -> Self {
        Self {
            def,
            index: i,
            output: false,
        }
    }

    /// Output `j` of `def`.
    pub fn output(def: &'d OperatorDef, j: usize) -> Self {
        Self {
            def,
            index: j,
            output: true,
        }
    }
}

impl fmt::Display for Operand<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (kind, names) = if self.output {
            ("output", &self.def.outputs)
        } else {
            ("input", &self.def.inputs)
        };
        let name = names.get(self.index).map_or("", String::as_str);
        write!(f, "{kind} {} ({name:?}) of operator ", self.index)?;
        match &self.def.name {
            Some(n) => write!(f, "{} {n:?}", self.def.op_type),
            None => f.write_str(&self.def.op_type),
        }
    }
}

/// Checks that `ctx` is on `op_device`, the device the operator `def` was built for.
///
/// # Errors
/// [`Error::DeviceMismatch`] naming the operator and both devices.
pub fn check_context(def: &OperatorDef, op_device: &Device, ctx: &Context) -> Result<()> {
    if ctx.device().same(op_device) {
        return Ok(());
    }
    Err(Error::DeviceMismatch {
        op: "Operator::run",
        expected: format!(
            "{} (operator {} was built for it)",
            op_device.label(),
            def.label()
        ),
        actual: format!("{} (the context's device)", ctx.device().label()),
    })
}
