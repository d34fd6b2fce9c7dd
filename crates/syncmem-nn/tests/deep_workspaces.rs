//! Chains of thousands of nested workspaces (each the child of the last, or forwarding a name
//! to the last): lookups, listings, a net run and the drop of the chain never recurse, so they
//! run on a thread with a small stack.

use std::sync::Arc;

use syncmem::net::{NetDef, NetOptions};
use syncmem::ops::OperatorDef;
use syncmem::{Device, Tensor, Workspace};

const DEPTH: usize = 50_000;
/// Each forwarded level checks that its target is visible when it is made, which walks the
/// chain below it: a shorter chain (still far deeper than a small stack holds) keeps the
/// quadratic set-up quick.
const FORWARD_DEPTH: usize = 8_000;

/// Runs `f` on a thread whose stack (256 KiB) a recursive walk of the chain would overflow.
fn on_a_small_stack(f: impl FnOnce() + Send + 'static) {
    std::thread::Builder::new()
        .stack_size(256 << 10)
        .spawn(f)
        .unwrap()
        .join()
        .unwrap();
}

fn root() -> Arc<Workspace> {
    let root = Arc::new(Workspace::new());
    root.feed(
        "x",
        Tensor::from_slice(&[3], &[-1.0_f32, 0.5, 2.0], Some(&Device::cpu())).unwrap(),
    )
    .unwrap();
    root
}

/// Lookups, the listing, a fetch and a net run from the bottom of `leaf`'s chain.
fn use_the_chain(leaf: &Workspace) {
    syncmem_nn::register_operators().unwrap();
    assert!(leaf.has_blob("x"));
    assert_eq!(leaf.blobs(), ["x"]);
    assert_eq!(leaf.fetch::<f32>("x").unwrap(), [-1.0, 0.5, 2.0]);
    let net = NetDef::new("relu").op(OperatorDef::new("Relu", &["x"], &["y"]));
    leaf.create_net(&net, &Device::cpu(), &NetOptions::new())
        .unwrap();
    leaf.run_net("relu").unwrap();
    assert_eq!(leaf.fetch::<f32>("y").unwrap(), [0.0, 0.5, 2.0]);
    assert_eq!(leaf.blobs(), ["x", "y"]);
}

#[test]
fn a_deep_chain_of_parents_never_recurses() {
    on_a_small_stack(|| {
        let root = root();
        let weak = Arc::downgrade(&root);
        let mut ws = root;
        for _ in 0..DEPTH {
            ws = Arc::new(Workspace::with_parent(ws));
        }
        let leaf = Workspace::with_parent(ws);
        use_the_chain(&leaf);
        drop(leaf);
        assert!(weak.upgrade().is_none(), "the whole chain was dropped");
    });
}

#[test]
fn a_deep_chain_of_forwarded_names_never_recurses() {
    on_a_small_stack(|| {
        let root = root();
        let weak = Arc::downgrade(&root);
        let mut ws = root;
        for _ in 0..FORWARD_DEPTH {
            ws = Arc::new(Workspace::with_forwarded(ws, [("x", "x")]).unwrap());
        }
        let leaf = Workspace::with_forwarded(ws, [("x", "x")]).unwrap();
        use_the_chain(&leaf);
        drop(leaf);
        assert!(weak.upgrade().is_none(), "the whole chain was dropped");
    });
}
