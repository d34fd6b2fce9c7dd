//! The data of `syncmem train`: the training set (the spirals, or `--data FILE`) and the
//! held-out set (`--test-data FILE`, or `--validation-split F` of the training set).

use std::path::Path;

use anyhow::{bail, ensure, Context as _};
use syncmem::dtype::DType;
use syncmem::workspace::io::inspect;
use syncmem::Workspace;
use syncmem_nn::mlp::Dataset;

use super::Args;

/// Points per class of the built-in spirals.
const POINTS_PER_CLASS: usize = 1000;
/// Classes of the built-in spirals.
const CLASSES: usize = 3;
/// Angle noise of the built-in spirals.
const NOISE: f32 = 0.2;

/// A held-out set and where it came from.
pub(super) struct HeldOutData {
    pub data: Dataset,
    /// The file of `--test-data`, or `validation split`.
    pub source: String,
    /// The fraction of `--validation-split`.
    pub fraction: Option<f64>,
}

/// The training set, its source (`spirals` or the file), and the held-out set if one is asked
/// for: `--validation-split F` holds out the last fraction `F` of the training set shuffled by
/// the seed (not trained on); `--test-data FILE` reads one, whose features must be the
/// training set's and whose labels must be classes of the model.
pub(super) fn datasets(args: &Args) -> anyhow::Result<(Dataset, String, Option<HeldOutData>)> {
    let (data, source) = match &args.data {
        Some(path) => (load_dataset(path)?, path.display().to_string()),
        None => (
            Dataset::spirals(POINTS_PER_CLASS, CLASSES, NOISE, args.seed),
            "spirals".to_string(),
        ),
    };
    if let Some(f) = args.validation_split {
        let (train, held) = data.split_held_out(f, args.seed).with_context(|| {
            format!(
                "--validation-split {f} of the {} samples of {source}",
                data.len()
            )
        })?;
        let held = HeldOutData {
            data: held,
            source: "validation split".into(),
            fraction: Some(f),
        };
        return Ok((train, source, Some(held)));
    }
    let Some(path) = &args.test_data else {
        return Ok((data, source, None));
    };
    let test = load_dataset(path)?;
    let file = path.display();
    ensure!(
        test.features == data.features,
        "--test-data {file}: x is [{}, {}], {} features per sample; the training data \
         ({source}) has {} features per sample",
        test.len(),
        test.features,
        test.features,
        data.features
    );
    ensure!(
        test.classes <= data.classes,
        "--test-data {file}: y has labels up to {} ({} classes); the model trained on \
         {source} has {} classes (labels 0 to {})",
        test.classes - 1,
        test.classes,
        data.classes,
        data.classes - 1
    );
    let held = HeldOutData {
        data: test,
        source: file.to_string(),
        fraction: None,
    };
    Ok((data, source, Some(held)))
}

/// Reads `x` (`f32 [N, D]`) and `y` (`i32` or `i64 [N]`) from a safetensors file with the library's
/// loader ([`Workspace::load`]), after checking names, element types and shapes in the file's
/// header so that each mistake gets its own message.
fn load_dataset(path: &Path) -> anyhow::Result<Dataset> {
    let file = path.display();
    let info = inspect(path)?;
    let find = |name: &str| {
        info.tensors.iter().find(|t| t.name == name).ok_or_else(|| {
            let names: Vec<&str> = info.tensors.iter().map(|t| t.name.as_str()).collect();
            anyhow::anyhow!(
                "{file}: tensor {name:?} missing; the file has: {}",
                if names.is_empty() {
                    "no tensors".to_string()
                } else {
                    names.join(", ")
                }
            )
        })
    };
    let (x, y) = (find("x")?, find("y")?);
    if x.element != Some(DType::F32) || x.shape.len() != 2 {
        bail!(
            "{file}: x must be f32 [N, D], it is {} {:?}",
            x.dtype,
            x.shape
        );
    }
    let n = x.shape[0];
    if !matches!(y.element, Some(DType::I32 | DType::I64)) {
        bail!("{file}: y must be i32 or i64, it is {}", y.dtype);
    }
    if y.shape != [n] {
        bail!(
            "{file}: y must be [N] with N = {n} (rows of x), it is {:?}",
            y.shape
        );
    }
    let ws = Workspace::new();
    ws.load(path, None, Some(&["x", "y"]))?;
    let xv = ws.fetch::<f32>("x")?;
    let yv: Vec<i32> = if y.element == Some(DType::I32) {
        ws.fetch::<i32>("y")?
    } else {
        ws.fetch::<i64>("y")?
            .into_iter()
            .map(|v| {
                i32::try_from(v)
                    .map_err(|_| anyhow::anyhow!("{file}: y: label {v} does not fit in i32"))
            })
            .collect::<anyhow::Result<_>>()?
    };
    Dataset::new(xv, yv, x.shape[1]).with_context(|| format!("dataset in {file}"))
}
