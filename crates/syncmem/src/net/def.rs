//! [`NetDef`]: the serialisable description of a net (Caffe2's `NetDef` protobuf, as JSON).

use std::collections::BTreeSet;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::ops::OperatorDef;

/// A net: a name and operators run in order (Caffe2's `NetDef`).
///
/// ```
/// use syncmem::net::NetDef;
///
/// # fn main() -> syncmem::Result<()> {
/// let def = NetDef::from_json(r#"{
///     "name": "fwd",
///     "ops": [{"type": "Relu", "inputs": ["x"], "outputs": ["y"]}],
///     "external_inputs": ["x"]
/// }"#)?;
/// assert_eq!(def.ops[0].op_type, "Relu");
/// assert_eq!(def.inputs(), vec!["x".to_string()]);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct NetDef {
    /// The net's name; required to register it in a workspace.
    #[serde(default)]
    pub name: String,
    /// Operators, run in this order.
    #[serde(default)]
    pub ops: Vec<OperatorDef>,
    /// Blobs the net reads that something outside it provides (data, labels, parameters).
    /// When absent, the blobs read before any operator of the net writes them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external_inputs: Option<Vec<String>>,
    /// Blobs read after the net ran (loss, accuracy, ...). When absent, the blobs that no later
    /// operator of the net reads. Memory planning never renames these.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external_outputs: Option<Vec<String>>,
}

impl NetDef {
    /// An empty net named `name`.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            ..Self::default()
        }
    }

    /// Appends an operator.
    pub fn op(mut self, op: OperatorDef) -> Self {
        self.ops.push(op);
        self
    }

    /// Declares the external inputs.
    pub fn with_inputs<S: AsRef<str>>(mut self, names: &[S]) -> Self {
        self.external_inputs = Some(names.iter().map(|s| s.as_ref().to_string()).collect());
        self
    }

    /// Declares the external outputs.
    pub fn with_outputs<S: AsRef<str>>(mut self, names: &[S]) -> Self {
        self.external_outputs = Some(names.iter().map(|s| s.as_ref().to_string()).collect());
        self
    }

    /// Parses a net from JSON.
    ///
    /// # Errors
    /// [`Error::InvalidState`] naming the line and column of a JSON or schema error.
    pub fn from_json(text: &str) -> Result<Self> {
        serde_json::from_str(text).map_err(|e| Error::InvalidState {
            op: "NetDef::from_json",
            buffer: "net definition".into(),
            reason: e.to_string(),
        })
    }

    /// Reads a net from a JSON file.
    ///
    /// # Errors
    /// [`Error::NotFound`] when the file cannot be read, [`Error::InvalidState`] for bad JSON.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| Error::NotFound {
            kind: "net definition file",
            name: path.display().to_string(),
            detail: format!(" ({e})"),
        })?;
        Self::from_json(&text).map_err(|e| match e {
            Error::InvalidState { op, reason, .. } => Error::InvalidState {
                op,
                buffer: format!("net definition file {}", path.display()),
                reason,
            },
            other => other,
        })
    }

    /// The net as pretty-printed JSON.
    pub fn to_json(&self) -> String {
        // Serialising plain strings, vectors and JSON maps cannot fail.
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// The external inputs: the declared ones, else the blobs read before the net writes them,
    /// in order of first use.
    pub fn inputs(&self) -> Vec<String> {
        if let Some(v) = &self.external_inputs {
            return v.clone();
        }
        let mut written = BTreeSet::new();
        let mut seen = BTreeSet::new();
        let mut out = Vec::new();
        for op in &self.ops {
            for i in &op.inputs {
                if !written.contains(i) && seen.insert(i.clone()) {
                    out.push(i.clone());
                }
            }
            written.extend(op.outputs.iter().cloned());
        }
        out
    }

    /// The external outputs: the declared ones, else the blobs written by the net that no later
    /// operator reads, in order of last write.
    pub fn outputs(&self) -> Vec<String> {
        if let Some(v) = &self.external_outputs {
            return v.clone();
        }
        let mut out: Vec<String> = Vec::new();
        for (k, op) in self.ops.iter().enumerate() {
            for o in &op.outputs {
                let read_later = self.ops[k + 1..].iter().any(|l| l.inputs.contains(o));
                if !read_later {
                    out.retain(|x| x != o);
                    out.push(o.clone());
                }
            }
        }
        out
    }

    /// Every blob name the net reads or writes, sorted.
    pub fn blob_names(&self) -> BTreeSet<String> {
        self.ops
            .iter()
            .flat_map(|op| op.inputs.iter().chain(op.outputs.iter()))
            .cloned()
            .collect()
    }
}
