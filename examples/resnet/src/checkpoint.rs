//! Checkpoints: model variables (parameters and batch-norm statistics), momentum buffers, and
//! where training stands, in one libtorch tensor archive written by rank 0. A checkpoint does not
//! depend on the number of ranks that wrote it: any number can resume from it.

use std::collections::HashMap;
use std::path::Path;

use anyhow::{bail, Context, Result};
use tch::Tensor;

/// Where training stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// The next epoch to run (epochs count from 0).
    pub epoch: usize,
    /// Optimizer steps taken so far.
    pub step: usize,
}

/// Writes `vars` (name, tensor) and `momentum` (name of the parameter, buffer) with `progress` to
/// `path`, through a temporary file renamed into place so a crash never leaves half a file.
pub fn save(
    path: &Path,
    vars: &[(String, Tensor)],
    momentum: &[(String, Tensor)],
    progress: Progress,
) -> Result<()> {
    let mut entries: Vec<(String, Tensor)> = Vec::with_capacity(vars.len() + momentum.len() + 2);
    for (name, t) in vars {
        entries.push((format!("model.{name}"), t.detach()));
    }
    for (name, t) in momentum {
        entries.push((format!("momentum.{name}"), t.detach()));
    }
    entries.push((
        "meta.epoch".into(),
        Tensor::from_slice(&[progress.epoch as i64]),
    ));
    entries.push((
        "meta.step".into(),
        Tensor::from_slice(&[progress.step as i64]),
    ));
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("checkpoint: cannot create {}", dir.display()))?;
    }
    let tmp = path.with_extension("tmp");
    Tensor::save_multi(&entries, &tmp)
        .with_context(|| format!("checkpoint: cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, path)
        .with_context(|| format!("checkpoint: cannot rename to {}", path.display()))?;
    Ok(())
}

/// Reads `path` into `vars` and `momentum` (matched by name; every one must be there with the
/// same shape) and returns the progress it records.
pub fn load(
    path: &Path,
    vars: &[(String, Tensor)],
    momentum: &[(String, Tensor)],
) -> Result<Progress> {
    let entries = Tensor::load_multi(path)
        .with_context(|| format!("checkpoint: cannot read {}", path.display()))?;
    let mut by_name: HashMap<String, Tensor> = entries.into_iter().collect();
    let mut take = |key: String, dst: &Tensor| -> Result<()> {
        let src = by_name.remove(&key).with_context(|| {
            format!(
                "checkpoint {}: no entry {key} (was it written for another model?)",
                path.display()
            )
        })?;
        if src.size() != dst.size() {
            bail!(
                "checkpoint {}: {key} has shape {:?}, the model has {:?}",
                path.display(),
                src.size(),
                dst.size()
            );
        }
        tch::no_grad(|| dst.shallow_clone().copy_(&src));
        Ok(())
    };
    for (name, t) in vars {
        take(format!("model.{name}"), t)?;
    }
    for (name, t) in momentum {
        take(format!("momentum.{name}"), t)?;
    }
    let meta = |key: &str| -> Result<usize> {
        let t = by_name
            .get(key)
            .with_context(|| format!("checkpoint {}: no entry {key}", path.display()))?;
        Ok(t.int64_value(&[0]).max(0) as usize)
    };
    Ok(Progress {
        epoch: meta("meta.epoch")?,
        step: meta("meta.step")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Device, Kind};

    #[test]
    fn round_trip_and_mismatch_is_named() {
        let dir = std::env::temp_dir().join(format!("ferroccl-resnet-ckpt-{}", std::process::id()));
        let path = dir.join("a.ot");
        let w = Tensor::arange(6, (Kind::Float, Device::Cpu)).view([2, 3]);
        let m = Tensor::ones([2, 3], (Kind::Float, Device::Cpu));
        save(
            &path,
            &[("w".into(), w.shallow_clone())],
            &[("w".into(), m)],
            Progress { epoch: 3, step: 17 },
        )
        .unwrap();

        let w2 = Tensor::zeros([2, 3], (Kind::Float, Device::Cpu));
        let m2 = Tensor::zeros([2, 3], (Kind::Float, Device::Cpu));
        let p = load(
            &path,
            &[("w".into(), w2.shallow_clone())],
            &[("w".into(), m2.shallow_clone())],
        )
        .unwrap();
        assert_eq!(p, Progress { epoch: 3, step: 17 });
        assert!(w2.equal(&w));
        assert_eq!(m2.sum(Kind::Float).double_value(&[]), 6.0);

        let bad = Tensor::zeros([3, 2], (Kind::Float, Device::Cpu));
        let err = load(&path, &[("w".into(), bad)], &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("model.w") && err.contains("[2, 3]"), "{err}");
        let err = load(&path, &[("v".into(), w2)], &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("no entry model.v"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
