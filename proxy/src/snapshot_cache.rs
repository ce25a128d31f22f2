//! The last applied snapshot on disk (`serve proxy --snapshot-cache-dir`), so a proxy container
//! restarted while the controller is unreachable serves at once instead of answering nothing.
//!
//! The file is the snapshot's protobuf encoding, the same bytes its content hash is taken over,
//! so a file is trusted only when it is sealed (`Sealed::decode`): a torn,
//! truncated or edited file is refused, never served. Writes go to a temporary file in the same
//! directory and are renamed over the old one, so a crash leaves the old file or the new one.

use coxswain_api::snapshot::{Scope, SealError, Sealed, scope};
use std::io::Write;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a snapshot: {source}")]
    Decode {
        path: PathBuf,
        #[source]
        source: prost::DecodeError,
    },
    #[error("{path} does not match its content hash: corrupt or edited ({source})")]
    Unsealed {
        path: PathBuf,
        #[source]
        source: SealError,
    },
    #[error("{path} holds a snapshot of another scope ({found:?})")]
    OtherScope { path: PathBuf, found: Option<Scope> },
    #[error("writing {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// One scope's cached snapshot in a directory.
#[derive(Debug, Clone)]
pub struct SnapshotCache {
    path: PathBuf,
    scope: Scope,
}

/// A snapshot read back from the cache, with how old the file is (for the log).
#[derive(Debug)]
pub struct Cached {
    pub snapshot: Sealed,
    pub age: Option<std::time::Duration>,
}

impl SnapshotCache {
    /// The file is named for the scope, so a directory reused by another scope's proxy is not
    /// mistaken for this one's.
    pub fn new(dir: &Path, scope: Scope) -> Self {
        let name = match &scope.kind {
            Some(scope::Kind::Gateway(g)) => {
                format!("gateway-{}-{}.snapshot", safe(&g.namespace), safe(&g.name))
            }
            Some(scope::Kind::SharedPool(_)) | None => "shared.snapshot".to_owned(),
        };
        Self {
            path: dir.join(name),
            scope,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The cached snapshot, `None` when there is no file yet. Any other failure means the file
    /// must not be served.
    pub fn load(&self) -> Result<Option<Cached>, CacheError> {
        let bytes = match std::fs::read(&self.path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => {
                return Err(CacheError::Read {
                    path: self.path.clone(),
                    source,
                });
            }
        };
        let snapshot = Sealed::decode(bytes.into()).map_err(|e| match e {
            SealError::Decode(source) => CacheError::Decode {
                path: self.path.clone(),
                source,
            },
            source => CacheError::Unsealed {
                path: self.path.clone(),
                source,
            },
        })?;
        if snapshot.scope.as_ref() != Some(&self.scope) {
            return Err(CacheError::OtherScope {
                path: self.path.clone(),
                found: snapshot.scope.clone(),
            });
        }
        let age = std::fs::metadata(&self.path)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok());
        Ok(Some(Cached { snapshot, age }))
    }

    /// Replaces the cached snapshot atomically with `encoded`, a sealed snapshot's bytes as
    /// they were checked ([`Sealed::encoded`], or bytes `Outline::verify` passed). The file
    /// holds the served certificates' private keys, so it is readable by this user only.
    pub fn store(&self, encoded: &[u8]) -> Result<(), CacheError> {
        let err = |source| CacheError::Write {
            path: self.path.clone(),
            source,
        };
        let dir = self.path.parent().unwrap_or(Path::new("."));
        let file_name = self
            .path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let tmp = dir.join(format!(".{file_name}.{}.tmp", std::process::id()));
        let write = || -> std::io::Result<()> {
            // A directory that is not a volume yet (a local run) is made, not an error each time.
            std::fs::create_dir_all(dir)?;
            let mut options = std::fs::OpenOptions::new();
            options.write(true).create(true).truncate(true);
            #[cfg(unix)]
            std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
            let mut file = options.open(&tmp)?;
            // The bytes the version was checked over, not an encoding made again.
            file.write_all(encoded)?;
            // Durable before the rename: otherwise a crash could leave the new name on an
            // empty file (refused on load, but the previous good one would be gone).
            file.sync_all()?;
            std::fs::rename(&tmp, &self.path)
        };
        write().map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            err(e)
        })
    }
}

/// Keeps a name to characters that are safe in a file name (Kubernetes names already are).
fn safe(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // a failed unwrap in a test is a failed assertion
    use super::*;
    use coxswain_api::snapshot::{ObjectRef, SharedPool, Snapshot};
    use prost::Message;

    fn shared() -> Scope {
        Scope {
            kind: Some(scope::Kind::SharedPool(SharedPool {})),
        }
    }

    fn snapshot(scope: Scope) -> Sealed {
        Snapshot {
            scope: Some(scope),
            requires: vec!["x".into()],
            ..Default::default()
        }
        .seal()
    }

    #[test]
    fn a_stored_snapshot_loads_back() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("cache");
        let cache = SnapshotCache::new(&sub, shared());
        assert!(cache.load().unwrap().is_none());
        let s = snapshot(shared());
        cache.store(s.encoded()).unwrap();
        assert_eq!(
            cache.load().unwrap().unwrap().snapshot.snapshot(),
            s.snapshot()
        );
        // Only the file itself remains: the temporary one was renamed.
        assert_eq!(std::fs::read_dir(&sub).unwrap().count(), 1);
    }

    #[test]
    fn an_edited_or_truncated_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let cache = SnapshotCache::new(dir.path(), shared());
        cache.store(snapshot(shared()).encoded()).unwrap();
        let mut bytes = std::fs::read(cache.path()).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0x01;
        std::fs::write(cache.path(), &bytes).unwrap();
        assert!(matches!(
            cache.load(),
            Err(CacheError::Unsealed { .. } | CacheError::Decode { .. })
        ));
        std::fs::write(cache.path(), &bytes[..bytes.len() / 2]).unwrap();
        assert!(cache.load().is_err());
        std::fs::write(cache.path(), b"").unwrap();
        assert!(matches!(cache.load(), Err(CacheError::Unsealed { .. })));
    }

    #[test]
    fn another_scopes_snapshot_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let gateway = Scope {
            kind: Some(scope::Kind::Gateway(ObjectRef {
                namespace: "ns".into(),
                name: "edge".into(),
            })),
        };
        let cache = SnapshotCache::new(dir.path(), gateway.clone());
        assert!(cache.path().ends_with("gateway-ns-edge.snapshot"));
        std::fs::write(cache.path(), snapshot(shared()).encode_to_vec()).unwrap();
        assert!(matches!(cache.load(), Err(CacheError::OtherScope { .. })));
    }
}
