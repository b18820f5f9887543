//! The keys of a role's sources: the `--source-key ID=PATH` and `--key-overlap-ms` options of
//! the sequencer and the forwarder (and the `source_key`, `key_overlap_ms` keys of their
//! `seqstreamd` tables), read into one [`Keyring`] per source.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use crate::{KeyError, Keyring};

/// One source's key file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceKey {
    /// The source.
    pub source_id: u32,
    /// Its key file.
    pub path: PathBuf,
}

impl std::str::FromStr for SourceKey {
    type Err = String;

    /// Parses `ID=PATH`, e.g. `7=/etc/seqstream/keys/source-7.key`.
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("source key {s:?}: use SOURCE_ID=KEY_FILE");
        let (id, path) = s.split_once('=').ok_or_else(bad)?;
        if path.is_empty() {
            return Err(bad());
        }
        Ok(SourceKey {
            source_id: id.parse().map_err(|_| bad())?,
            path: PathBuf::from(path),
        })
    }
}

/// The sources' keys of a sequencer or a forwarder.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct SourceKeyArgs {
    /// A source's key file, SOURCE_ID=KEY_FILE (repeat, or comma-separate). That source's
    /// datagrams, and the NAKs sent to it, then carry a MAC under the key and a counter that
    /// never repeats; any other datagram claiming that source is dropped and counted. The
    /// file holds 16 to 4096 bytes of key material and must be readable by its owner only.
    #[arg(long = "source-key", value_delimiter = ',')]
    pub source_keys: Vec<SourceKey>,
    /// After a key file changes (checked once a second), the previous key stays valid this
    /// many ms, so the two ends of a source need not change keys at the same instant.
    #[arg(long, default_value_t = 60_000)]
    pub key_overlap_ms: u64,
}

impl SourceKeyArgs {
    /// Each source's keyring. Errors: a key file that cannot be used, or a source given two
    /// key files (`KeyError::Io` of kind `InvalidInput`).
    pub fn open(&self) -> Result<HashMap<u32, Keyring>, KeyError> {
        let overlap = Duration::from_millis(self.key_overlap_ms);
        let mut keys = HashMap::new();
        for k in &self.source_keys {
            let ring = Keyring::open(&k.path, overlap)?;
            if keys.insert(k.source_id, ring).is_some() {
                return Err(KeyError::Io {
                    path: k.path.clone(),
                    source: std::io::Error::new(
                        std::io::ErrorKind::InvalidInput,
                        format!("source {} has two key files", k.source_id),
                    ),
                });
            }
        }
        Ok(keys)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_id_equals_path() {
        assert_eq!(
            "7=/k/seven".parse::<SourceKey>().unwrap(),
            SourceKey {
                source_id: 7,
                path: "/k/seven".into()
            }
        );
        for bad in ["7", "x=/k", "7=", "=/k"] {
            assert!(bad.parse::<SourceKey>().is_err(), "{bad}");
        }
    }
}
