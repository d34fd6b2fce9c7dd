//! Net management on [`Workspace`] (Caffe2's `CreateNet`, `GetNet`, `RunNet`, `DeleteNet`,
//! `Nets`, `RunNetOnce`), with the departures listed in the [module docs](super).

use std::sync::Arc;

use super::{Net, NetDef, NetOptions};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::workspace::Workspace;

impl Workspace {
    /// Builds `def` for `device` and registers it under its name (Caffe2's `CreateNet`).
    ///
    /// Every operator is built before anything changes: on error the workspace is exactly as it
    /// was, including the net that `opts.overwrite` would have replaced (Caffe2 erases it
    /// first). On success the blobs the net writes are created (empty) when not visible yet, as
    /// Caffe2's operators do when they are constructed.
    ///
    /// # Errors
    /// [`Error::InvalidState`] when `def` has no name ("a net definition needs a name");
    /// [`Error::AlreadyExists`] when a net of that name exists and `opts.overwrite` is off;
    /// the build errors of [`Net::build`] ([`Error::OperatorFailed`] naming the net and the
    /// operator).
    pub fn create_net(&self, def: &NetDef, device: &Device, opts: &NetOptions) -> Result<Arc<Net>> {
        if def.name.is_empty() {
            return Err(Error::InvalidState {
                op: "create_net",
                buffer: "workspace".into(),
                reason: "a net definition needs a name (NetDef::name is empty)".into(),
            });
        }
        if !opts.overwrite && self.has_net(&def.name) {
            return Err(net_exists(&def.name));
        }
        let net = Arc::new(Net::build(def, device, opts)?);
        let mut nets = self.nets.write();
        // Checked again under the write lock: another thread may have created it meanwhile.
        if !opts.overwrite && nets.contains_key(&def.name) {
            return Err(net_exists(&def.name));
        }
        self.create_output_blobs(&net)?;
        nets.insert(def.name.clone(), net.clone());
        Ok(net)
    }

    /// Creates (empty) every blob `net` writes that is not visible yet. The blobs created before
    /// an error are removed again.
    fn create_output_blobs(&self, net: &Net) -> Result<()> {
        let mut created: Vec<String> = Vec::new();
        for op in &net.run_def().ops {
            for name in &op.outputs {
                if self.has_blob(name) {
                    continue;
                }
                if let Err(e) = self.create_blob(name) {
                    for c in &created {
                        self.remove_blob(c);
                    }
                    return Err(e);
                }
                created.push(name.clone());
            }
        }
        Ok(())
    }

    /// True when a net of that name is registered.
    pub fn has_net(&self, name: &str) -> bool {
        self.nets.read().contains_key(name)
    }

    /// The net registered as `name`, or `None` (Caffe2's `GetNet` returning null).
    pub fn try_get_net(&self, name: &str) -> Option<Arc<Net>> {
        let net = self.nets.read().get(name).cloned()?;
        net.downcast::<Net>().ok()
    }

    /// The net registered as `name`.
    ///
    /// # Errors
    /// [`Error::NotFound`] naming the net and listing the registered ones.
    pub fn get_net(&self, name: &str) -> Result<Arc<Net>> {
        self.try_get_net(name)
            .ok_or_else(|| self.net_not_found(name))
    }

    /// Runs the net registered as `name` with its own context (Caffe2's `RunNet`). No lock of
    /// the workspace is held while it runs.
    ///
    /// # Errors
    /// [`Error::NotFound`] naming the net when none is registered under that name (Caffe2 logs
    /// and returns false); the run errors of [`Net::run`].
    pub fn run_net(&self, name: &str) -> Result<()> {
        self.get_net(name)?.run(self)
    }

    /// Unregisters the net `name`; returns whether there was one. Runs in progress finish.
    pub fn delete_net(&self, name: &str) -> bool {
        self.nets.write().remove(name).is_some()
    }

    /// Names of the registered nets, sorted.
    pub fn nets(&self) -> Vec<String> {
        self.nets.read().keys().cloned().collect()
    }

    /// Builds `def` for `device`, runs it once and discards it (Caffe2's `RunNetOnce`). No name
    /// is needed and no net is registered; `opts.overwrite` is ignored.
    ///
    /// # Errors
    /// The build errors of [`Net::build`] (Caffe2: "Could not create net") and the run errors of
    /// [`Net::run`].
    pub fn run_net_once(&self, def: &NetDef, device: &Device, opts: &NetOptions) -> Result<()> {
        Net::build(def, device, opts)?.run(self)
    }

    fn net_not_found(&self, name: &str) -> Error {
        let known = self.nets();
        Error::NotFound {
            kind: "net",
            name: name.to_string(),
            detail: if known.is_empty() {
                " in the workspace (no nets are registered)".into()
            } else {
                format!(" in the workspace (registered nets: {})", known.join(", "))
            },
        }
    }
}

fn net_exists(name: &str) -> Error {
    Error::AlreadyExists {
        kind: "net",
        name: name.to_string(),
        detail: " in the workspace: refusing to overwrite it (set NetOptions::overwrite)".into(),
    }
}
