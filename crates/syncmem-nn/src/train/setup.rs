//! What single-device and data-parallel training set up alike.

use std::sync::Arc;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;

use super::{PairMeter, TrainConfig, Trainer, Transfers};
use crate::mlp::{Dataset, Mlp, MlpNets};
use syncmem::net::{Net, NetOptions, PlanOptions};
use syncmem::Device;
use syncmem::Workspace;
use syncmem::{Error, Result};

/// What single-device and data-parallel training set up alike: the batch rows (shuffled from
/// the seed), the workspace with the parameters (the init net run on `device`), the seeded
/// generator.
pub(super) struct Setup {
    rng: StdRng,
    pub(super) rows: Vec<Vec<usize>>,
    pub(super) ws: Arc<Workspace>,
    seed: u64,
}

impl Setup {
    pub(super) fn new(
        device: &Device,
        data: &Dataset,
        cfg: &TrainConfig,
        nets: &MlpNets,
    ) -> Result<Setup> {
        if cfg.batch == 0 {
            return Err(Error::InvalidState {
                op: "Trainer::new",
                buffer: "training configuration".into(),
                reason: "the batch size must be at least 1".into(),
            });
        }
        let mut rng = StdRng::seed_from_u64(cfg.seed);
        let mut order: Vec<usize> = (0..data.len()).collect();
        order.shuffle(&mut rng);
        let rows = order.chunks(cfg.batch).map(<[usize]>::to_vec).collect();
        let ws = Arc::new(Workspace::new());
        ws.run_net_once(&nets.init, device, &NetOptions::new().seed(cfg.seed))?;
        Ok(Setup {
            rng,
            rows,
            ws,
            seed: cfg.seed,
        })
    }

    /// The nets' options: fusion as `cfg` says, planning (keeping `keep` apart) when it asks.
    pub(super) fn options(&self, cfg: &TrainConfig, mlp: &Mlp, keep: Vec<String>) -> NetOptions {
        let base = NetOptions::new()
            .seed(self.seed)
            .rewrite(crate::fuse::Fuse::when(cfg.fuse))
            // Offloaded values leave room that dead values must not keep taken.
            .drop_dead(cfg.offload_activations || cfg.offload_parameters);
        if cfg.plan {
            let mut plan = PlanOptions::default();
            plan.keep = keep;
            plan.sizes = mlp.blob_bytes(cfg.batch);
            base.with_plan(plan)
        } else {
            base
        }
    }

    pub(super) fn trainer(
        self,
        device: &Device,
        data: &Dataset,
        mlp: Mlp,
        nets: MlpNets,
        train: Arc<Net>,
        eval: Arc<Net>,
    ) -> Trainer {
        let sizes: Vec<usize> = self.rows.iter().map(Vec::len).collect();
        Trainer {
            device: device.clone(),
            ws: self.ws,
            mlp,
            nets,
            train,
            eval,
            batches: Vec::new(),
            order: (0..sizes.len()).collect(),
            sizes,
            parallel: None,
            pairs: PairMeter::default(),
            samples: data.len(),
            rng: self.rng,
            epoch: 0,
            transfers: Transfers::default(),
            held_out: None,
            offload: None,
            params: None,
            activations: None,
            residency: Default::default(),
        }
    }
}
