//! Held-out sets: `Dataset::split_held_out` and `Trainer::set_held_out` /
//! `Trainer::evaluate_held_out` on `cpu`.

use syncmem::{Device, Error};
use syncmem_nn::mlp::Dataset;
use syncmem_nn::train::{TrainConfig, Trainer};

#[test]
fn a_split_is_the_seeds_and_keeps_the_classes() {
    let data = Dataset::spirals(10, 3, 0.2, 0);
    let (train, held) = data.split_held_out(0.2, 7).unwrap();
    assert_eq!((train.len(), held.len()), (24, 6));
    assert_eq!((train.classes, held.classes), (3, 3));
    assert_eq!((train.features, held.features), (2, 2));
    assert_eq!(
        data.split_held_out(0.2, 7).unwrap(),
        (train.clone(), held.clone())
    );
    assert_ne!(data.split_held_out(0.2, 8).unwrap().1, held);
    // Every sample is in one part or the other.
    let mut all: Vec<i32> = train.y.iter().chain(&held.y).copied().collect();
    let mut want = data.y.clone();
    all.sort_unstable();
    want.sort_unstable();
    assert_eq!(all, want);
    for bad in [0.0, 1.0, -0.5, f64::NAN, 0.01, 0.99] {
        let e = data.split_held_out(bad, 0).unwrap_err();
        assert!(matches!(e, Error::InvalidShape { .. }), "{bad}: {e}");
    }
}

#[test]
fn held_out_evaluation_leaves_training_unchanged() {
    let cpu = Device::cpu();
    let data = Dataset::spirals(50, 3, 0.2, 0);
    let (train, held) = data.split_held_out(0.25, 0).unwrap();
    let cfg = TrainConfig::default()
        .with_epochs(2)
        .with_hidden(vec![16, 16]);
    let mut plain = Trainer::new(&cpu, &train, &cfg).unwrap();
    let mut with = Trainer::new(&cpu, &train, &cfg).unwrap();
    assert_eq!(plain.evaluate_held_out().unwrap(), None);
    with.set_held_out(&held).unwrap();
    assert_eq!(with.held_out_len(), held.len());
    for _ in 0..cfg.epochs {
        let (a, b) = (plain.run_epoch().unwrap(), with.run_epoch().unwrap());
        assert_eq!((a.loss, a.accuracy), (b.loss, b.accuracy));
        let (loss, acc) = with.evaluate_held_out().unwrap().unwrap();
        assert!(loss.is_finite() && loss > 0.0 && (0.0..=1.0).contains(&acc));
    }
    assert_eq!(plain.evaluate().unwrap(), with.evaluate().unwrap());

    // Data the model cannot take: another width, a label past its classes.
    let wide = Dataset::new(vec![0.0; 9], vec![0, 1, 2], 3).unwrap();
    let many = Dataset::new(vec![0.0; 8], vec![0, 1, 2, 5], 2).unwrap();
    for bad in [wide, many] {
        let e = with.set_held_out(&bad).unwrap_err();
        assert!(matches!(e, Error::InvalidShape { .. }), "{e}");
    }
}
