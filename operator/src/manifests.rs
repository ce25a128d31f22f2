//! Generated manifests: `coxswain crd`.

use crate::cli::CrdArgs;
use coxswain_api::crd;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error(transparent)]
    Render(#[from] crd::RenderError),
    #[error("writing {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Renders the CRDs: returns the multi-document stream, or writes one file per CRD into
/// `--out-dir` and returns nothing.
pub fn crds(args: &CrdArgs) -> Result<Option<String>, ManifestError> {
    let Some(dir) = &args.out_dir else {
        return Ok(Some(crd::render_stream()?));
    };
    std::fs::create_dir_all(dir).map_err(|source| ManifestError::Write {
        path: dir.clone(),
        source,
    })?;
    for rendered in crd::render()? {
        let path = dir.join(&rendered.file_name);
        std::fs::write(&path, rendered.yaml)
            .map_err(|source| ManifestError::Write { path, source })?;
    }
    Ok(None)
}
