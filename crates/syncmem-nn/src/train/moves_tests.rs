//! Unit tests of the moves' plans.

use super::*;
use std::collections::BTreeSet;
use syncmem::ops::OperatorDef;

fn net(ops: &[(&[&str], &[&str])]) -> NetDef {
    let mut d = NetDef::new("t");
    for (i, (inp, out)) in ops.iter().enumerate() {
        d.ops.push(OperatorDef::new(&format!("Op{i}"), inp, out));
    }
    d
}

#[test]
fn moves_values_across_long_gaps_only() {
    // x: external (read first); a: written at 0, read at 1 and at 6 (gap 5);
    // b: written at 1, read at 4 (gap 3, too short); c: written at 2, written at 7 (no read).
    let d = net(&[
        (&["x", "w"], &["a"]),
        (&["a"], &["b"]),
        (&["b"], &["c"]),
        (&["c"], &["d"]),
        (&["b", "d"], &["e"]),
        (&["e"], &["f"]),
        (&["f", "a", "w"], &["g"]),
        (&["g"], &["c"]),
    ]);
    let p = plan(&d, &Pick::Produced);
    assert_eq!(p.names, vec!["a".to_string()]);
    let at =
        |v: &Vec<Vec<u32>>| -> Vec<usize> { (0..v.len()).filter(|&i| !v[i].is_empty()).collect() };
    assert_eq!(at(&p.down), vec![1]);
    // Freed once its copy is done, at the latest after operator 3 (DEFER operators later, and
    // two before the copy back).
    assert_eq!(at(&p.free), vec![3]);
    assert_eq!(at(&p.up), vec![4]);
    assert_eq!(at(&p.check), vec![5]);
}

#[test]
fn a_value_can_leave_twice_and_the_gap_bound_is_inclusive() {
    let d = net(&[
        (&["x"], &["a"]),
        (&[], &["p"]),
        (&[], &["q"]),
        (&[], &["r"]),
        (&["a"], &["s"]),
        (&[], &["t"]),
        (&[], &["u"]),
        (&[], &["v"]),
        (&["a"], &["y"]),
    ]);
    let p = plan(&d, &Pick::Produced);
    assert_eq!(p.names, vec!["a".to_string()]);
    assert_eq!(p.down[0], vec![0]);
    assert_eq!(p.down[4], vec![0]);
    assert_eq!(p.up[2], vec![0]);
    assert_eq!(p.up[6], vec![0]);
    // A gap of MIN_GAP - 1 stays on the device.
    let d = net(&[
        (&["x"], &["a"]),
        (&[], &["p"]),
        (&[], &["q"]),
        (&["a"], &["y"]),
    ]);
    assert!(plan(&d, &Pick::Produced).names.is_empty());
}

#[test]
fn an_in_place_output_counts_as_one_use() {
    // `a` read and written by operator 1 (in place): one use there.
    let d = net(&[
        (&["x"], &["a"]),
        (&["a"], &["a"]),
        (&[], &["p"]),
        (&[], &["q"]),
        (&[], &["r"]),
        (&["a"], &["y"]),
    ]);
    let p = plan(&d, &Pick::Produced);
    assert_eq!(p.down[1], vec![0]);
    assert!(p.down[0].is_empty());
}

#[test]
fn named_blobs_come_up_ahead_of_their_first_read_and_stay() {
    // w0 read at 0 (first op: before the run) and at 6; w1 read at 3 and at 5;
    // w2 read at 4 and written at 9; `a` is not named.
    let d = net(&[
        (&["x", "w0"], &["a"]),
        (&["a"], &["b"]),
        (&["b"], &["c"]),
        (&["c", "w1"], &["d"]),
        (&["d", "w2"], &["e"]),
        (&["e", "w1"], &["f"]),
        (&["f", "w0"], &["g"]),
        (&["g"], &["h"]),
        (&["h"], &["i"]),
        (&["i"], &["w2"]),
    ]);
    let names: BTreeSet<String> = ["w0", "w1", "w2", "zz"].map(String::from).into();
    let p = plan(&d, &Pick::Named(&names));
    assert_eq!(p.names, ["w0", "w1", "w2"].map(String::from));
    let (w0, w1, w2) = (0, 1, 2);
    assert_eq!(p.before, vec![w0]);
    // First reads: w1 at 3 (up after 1, checked after 2), w2 at 4 (up after 2, checked after 3).
    assert_eq!(p.up[1], vec![w1]);
    assert_eq!(p.check[2], vec![w1]);
    assert_eq!(p.up[2], vec![w2]);
    assert_eq!(p.check[3], vec![w2]);
    // Nothing leaves within the run, though w0's reads are 6 operators apart.
    let moves = |v: &Vec<Vec<u32>>| v.iter().map(Vec::len).sum::<usize>();
    assert_eq!((moves(&p.down), moves(&p.free), moves(&p.up)), (0, 0, 2));
}
