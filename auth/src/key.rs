//! Keys: where they come from (a file only its owner may read), what they are (256 bits
//! derived from the file's bytes), and how one is replaced without a restart ([`Keyring`]).
//!
//! A key file holds the key material: its bytes, a trailing newline removed, from
//! [`MIN_KEY_BYTES`] to [`MAX_KEY_BYTES`] of them (`head -c 32 /dev/urandom > FILE`, or any
//! passphrase that long). The [`Key`] is BLAKE3's key derivation of that material under
//! [`KEY_CONTEXT`], so every use sees 256 uniformly distributed bits. A file that group or
//! others may read (or write) is refused: the permission is checked on the opened file, so a
//! file swapped in between the check and the read cannot slip through.

use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use zeroize::{Zeroize, Zeroizing};

use crate::trailer::{TrailerKeys, TrailerScope};

/// Fewest bytes of key material: 128 bits.
pub const MIN_KEY_BYTES: usize = 16;
/// Most bytes of key material read from a file.
pub const MAX_KEY_BYTES: usize = 4096;
/// BLAKE3 key-derivation context of every seqstream key (globally unique, as BLAKE3's
/// `derive_key` asks).
pub const KEY_CONTEXT: &str = "seqstream 2026-12-01 peer authentication key v1";
/// How often a [`Keyring`] looks at its file (by the caller's monotonic clock).
pub const RELOAD_CHECK_EVERY: Duration = Duration::from_secs(1);

/// Why a key file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// The file cannot be opened, examined or read.
    #[error("key file {}: {source}", path.display())]
    Io {
        /// The key file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Group or others may read or write it.
    #[error("key file {}: mode {mode:04o} lets group or others read or write it (chmod 600 it)", path.display())]
    Permissions {
        /// The key file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// Too few or too many bytes of key material.
    #[error("key file {}: {len} bytes of key material; a key needs {MIN_KEY_BYTES} to {MAX_KEY_BYTES} (make one with `head -c 32 /dev/urandom > FILE`)", path.display())]
    Length {
        /// The key file.
        path: PathBuf,
        /// Bytes it holds (a trailing newline removed).
        len: usize,
    },
}

/// A 256-bit key. Its `Debug` shows only its [fingerprint](Key::fingerprint); its bytes are
/// zeroed when it is dropped, and so are those of every key derived from it (and the AES key
/// schedules and GHASH keys made from them: `aes`' `zeroize` feature and the `gmac` module's
/// `Drop`).
#[derive(Clone, PartialEq, Eq)]
pub struct Key {
    bytes: [u8; 32],
}

impl Drop for Key {
    fn drop(&mut self) {
        self.bytes.zeroize();
    }
}

impl Key {
    /// The key derived from `material` (any length; a file's is checked by [`Key::read`]).
    pub fn from_material(material: &[u8]) -> Key {
        Key::from_bytes(blake3::derive_key(KEY_CONTEXT, material))
    }

    pub(crate) fn from_bytes(bytes: [u8; 32]) -> Key {
        Key { bytes }
    }

    pub(crate) fn bytes(&self) -> &[u8; 32] {
        &self.bytes
    }

    /// Reads the key in `path`: refused when group or others may read or write the file, or
    /// when it holds fewer than [`MIN_KEY_BYTES`] or more than [`MAX_KEY_BYTES`].
    pub fn read(path: &Path) -> Result<Key, KeyError> {
        Ok(Key::from_material(&read_material(path)?.0))
    }

    /// Eight hex digits naming the key in logs: BLAKE3 of the key, so it says nothing of it.
    pub fn fingerprint(&self) -> String {
        blake3::hash(&self.bytes).to_hex()[..8].to_string()
    }
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Key({})", self.fingerprint())
    }
}

/// What identifies a version of a file: a rewrite or a rename over it changes one of these.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    len: u64,
    mtime_ns: i128,
}

fn stamp(m: &std::fs::Metadata) -> Stamp {
    Stamp {
        dev: m.dev(),
        ino: m.ino(),
        len: m.len(),
        mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
    }
}

/// Reads a private file (a key, a TLS private key) of at most `limit` bytes: refused
/// (`Permissions`) when group or others may read or write it, as checked on the opened file.
/// The bytes are zeroed when the buffer is dropped; it is sized to the file first, so no
/// smaller copy is left behind by a reallocation.
pub fn read_private(path: &Path, limit: usize) -> Result<Zeroizing<Vec<u8>>, KeyError> {
    Ok(read_private_stamped(path, limit)?.0)
}

fn read_private_stamped(
    path: &Path,
    limit: usize,
) -> Result<(Zeroizing<Vec<u8>>, Stamp), KeyError> {
    let io = |source| KeyError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    let meta = file.metadata().map_err(io)?;
    let mode = meta.mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(KeyError::Permissions {
            path: path.to_path_buf(),
            mode,
        });
    }
    let len = usize::try_from(meta.len()).unwrap_or(usize::MAX).min(limit);
    let mut bytes = Zeroizing::new(Vec::with_capacity(len));
    file.take(limit as u64)
        .read_to_end(&mut bytes)
        .map_err(io)?;
    Ok((bytes, stamp(&meta)))
}

/// The material in `path` and its file's stamp, checked.
fn read_material(path: &Path) -> Result<(Zeroizing<Vec<u8>>, Stamp), KeyError> {
    let (mut material, stamp) = read_private_stamped(path, MAX_KEY_BYTES + 2)?;
    while material.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
        material.pop();
    }
    if !(MIN_KEY_BYTES..=MAX_KEY_BYTES).contains(&material.len()) {
        return Err(KeyError::Length {
            path: path.to_path_buf(),
            len: material.len(),
        });
    }
    Ok((material, stamp))
}

/// A key and, in a keyring scoped for trailers, the trailer keys derived from it when it was
/// read (an AES key schedule and a GHASH key each, which a datagram should not pay for).
#[derive(Debug, Clone)]
struct Held {
    key: Key,
    trailer: Option<TrailerKeys>,
}

impl Held {
    fn new(key: Key, scope: Option<TrailerScope>) -> Held {
        Held {
            trailer: scope.map(|scope| TrailerKeys::derive(&key, scope)),
            key,
        }
    }
}

/// A key replaced by a new one in its file ([`Keyring::poll`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rotation {
    /// Fingerprint of the key that signed until now and still verifies for `overlap`.
    pub previous: String,
    /// Fingerprint of the key that signs from now on.
    pub current: String,
    /// How long the previous key stays valid.
    pub overlap: Duration,
}

/// The keys of one peer relationship: the current key, which signs and verifies, and during a
/// stated overlap after a rotation the previous one, which still verifies.
///
/// Rotation without a restart: write the new key into the file (a rename over it, or a
/// rewrite) on both ends. Each end's keyring notices within [`RELOAD_CHECK_EVERY`] of its
/// [`poll`](Keyring::poll)s; from then on it signs with the new key and accepts both until the
/// overlap ends, so the two ends need not change at the same instant. A file that has become
/// unusable (unreadable, too open, too short) keeps the keys in force and is reported by
/// `poll`, every check until it is fixed.
#[derive(Debug, Clone)]
pub struct Keyring {
    path: Option<PathBuf>,
    current: Held,
    /// The key before the last rotation and the monotonic time (ns) until which it verifies.
    previous: Option<(Held, u64)>,
    /// Whose trailers it seals and opens, once [`for_trailers`](Keyring::for_trailers) said.
    scope: Option<TrailerScope>,
    overlap: Duration,
    stamp: Option<Stamp>,
    last_check_ns: Option<u64>,
}

impl Keyring {
    /// The keyring of the key file `path`, rotating with `overlap` (see [`Key::read`] for what
    /// is refused).
    pub fn open(path: &Path, overlap: Duration) -> Result<Keyring, KeyError> {
        let (material, stamp) = read_material(path)?;
        Ok(Keyring {
            path: Some(path.to_path_buf()),
            current: Held::new(Key::from_material(&material), None),
            previous: None,
            scope: None,
            overlap,
            stamp: Some(stamp),
            last_check_ns: None,
        })
    }

    /// A keyring of one fixed key, read from no file (it never rotates).
    pub fn fixed(key: Key) -> Keyring {
        Keyring {
            path: None,
            current: Held::new(key, None),
            previous: None,
            scope: None,
            overlap: Duration::ZERO,
            stamp: None,
            last_check_ns: None,
        }
    }

    /// The key file, if any.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The key that signs.
    pub fn signing(&self) -> &Key {
        &self.current.key
    }

    /// The keys that verify at monotonic time `now_ns`: the current one, then the previous
    /// one while its overlap lasts.
    pub fn verifying(&self, now_ns: u64) -> impl Iterator<Item = &Key> {
        self.held(now_ns).map(|h| &h.key)
    }

    /// This keyring for the trailers of the datagrams and NAKs of `scope`, one source on one
    /// stream: their GMAC keys are derived from each key it holds, now and at every rotation
    /// (PROTOCOL.md, "Authenticated sources"). Each keyring that seals or opens trailers
    /// ([`crate::trailer`]) is scoped so, once.
    pub fn for_trailers(mut self, scope: TrailerScope) -> Keyring {
        self.scope = Some(scope);
        self.current.trailer = Some(TrailerKeys::derive(&self.current.key, scope));
        if let Some((previous, _)) = &mut self.previous {
            previous.trailer = Some(TrailerKeys::derive(&previous.key, scope));
        }
        self
    }

    /// The trailer keys of the signing key; `None` if the keyring was not scoped.
    pub(crate) fn trailer_signing(&self) -> Option<&TrailerKeys> {
        self.current.trailer.as_ref()
    }

    /// The trailer keys of [`verifying`](Self::verifying)'s keys, in its order; none if the
    /// keyring was not scoped.
    pub(crate) fn trailer_verifying(&self, now_ns: u64) -> impl Iterator<Item = &TrailerKeys> {
        self.held(now_ns).filter_map(|h| h.trailer.as_ref())
    }

    fn held(&self, now_ns: u64) -> impl Iterator<Item = &Held> {
        let previous = self
            .previous
            .as_ref()
            .filter(|(_, until)| now_ns < *until)
            .map(|(h, _)| h);
        std::iter::once(&self.current).chain(previous)
    }

    /// The first key valid at `now_ns` under which `tag` is the tag of `parts` for `label`.
    pub fn verify(
        &self,
        now_ns: u64,
        label: crate::Label,
        parts: &[&[u8]],
        tag: &[u8],
    ) -> Option<&Key> {
        self.verifying(now_ns).find(|k| k.verify(label, parts, tag))
    }

    /// Looks at the key file if [`RELOAD_CHECK_EVERY`] has passed since the last look, and
    /// rotates to the key it holds now if that changed. `Ok(Some(_))` on a rotation; an error
    /// (the keys in force are kept) when the file changed and cannot be used.
    ///
    /// Called in the housekeeping of the daemon's agent that holds the keyring (busy or idle,
    /// every millisecond or so): a poll before the next look is due, and a look that finds
    /// the file unchanged, allocate nothing.
    pub fn poll(&mut self, now_ns: u64) -> Result<Option<Rotation>, KeyError> {
        let Some(path) = self.path.as_deref() else {
            return Ok(None);
        };
        let every = RELOAD_CHECK_EVERY.as_nanos() as u64;
        if self
            .last_check_ns
            .is_some_and(|last| now_ns.saturating_sub(last) < every)
        {
            return Ok(None);
        }
        self.last_check_ns = Some(now_ns);
        let meta = std::fs::metadata(path).map_err(|source| KeyError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        if self.stamp == Some(stamp(&meta)) {
            return Ok(None);
        }
        let (material, stamp) = read_material(path)?;
        self.stamp = Some(stamp);
        let key = Key::from_material(&material);
        if key == self.current.key {
            return Ok(None);
        }
        let previous = std::mem::replace(&mut self.current, Held::new(key, self.scope));
        let rotation = Rotation {
            previous: previous.key.fingerprint(),
            current: self.current.key.fingerprint(),
            overlap: self.overlap,
        };
        let overlap_ns = u64::try_from(self.overlap.as_nanos()).unwrap_or(u64::MAX);
        self.previous = Some((previous, now_ns.saturating_add(overlap_ns)));
        Ok(Some(rotation))
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;
    use crate::trailer::{self, Kind, Sealer, TrailerScope, TRAILER_LEN};
    use crate::Label;

    fn write_key(path: &Path, material: &[u8], mode: u32) {
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, material).unwrap();
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode)).unwrap();
        std::fs::rename(&tmp, path).unwrap();
    }

    #[test]
    fn a_key_file_others_may_read_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("k");
        for mode in [0o644, 0o640, 0o604, 0o620, 0o602] {
            write_key(&p, b"0123456789abcdef\n", mode);
            let e = Key::read(&p).unwrap_err();
            assert!(
                matches!(e, KeyError::Permissions { mode: m, .. } if m == mode),
                "{e}"
            );
            assert!(e.to_string().contains("chmod 600"), "{e}");
        }
        write_key(&p, b"0123456789abcdef\n", 0o600);
        assert_eq!(
            Key::read(&p).unwrap(),
            Key::from_material(b"0123456789abcdef"),
            "a trailing newline is not material"
        );
        write_key(&p, b"0123456789abcdef", 0o400);
        Key::read(&p).unwrap();
    }

    #[test]
    fn short_long_and_missing_key_files_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("k");
        write_key(&p, b"s3cret\n", 0o600);
        assert!(matches!(
            Key::read(&p),
            Err(KeyError::Length { len: 6, .. })
        ));
        write_key(&p, &vec![b'x'; MAX_KEY_BYTES + 1], 0o600);
        assert!(matches!(Key::read(&p), Err(KeyError::Length { .. })));
        assert!(matches!(
            Key::read(&d.path().join("none")),
            Err(KeyError::Io { .. })
        ));
    }

    #[test]
    fn debug_shows_a_fingerprint_never_the_key() {
        let k = Key::from_material(b"0123456789abcdef");
        let shown = format!("{k:?}");
        assert_eq!(shown, format!("Key({})", k.fingerprint()));
        assert!(!shown.contains("0123"));
    }

    #[test]
    fn a_rotation_keeps_the_previous_key_valid_for_the_overlap_only() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("k");
        write_key(&p, b"old key material 1234", 0o600);
        let overlap = Duration::from_secs(10);
        let scope = TrailerScope {
            stream_id: 1,
            source_id: 7,
        };
        let mut ring = Keyring::open(&p, overlap).unwrap().for_trailers(scope);
        let old = ring.signing().clone();
        let sec = 1_000_000_000u64;
        assert_eq!(ring.poll(0).unwrap(), None);
        write_key(&p, b"new key material 5678", 0o600);
        assert_eq!(
            ring.poll(sec / 2).unwrap(),
            None,
            "looked less than 1 s ago"
        );
        let r = ring.poll(sec).unwrap().expect("rotated");
        let new = Key::from_material(b"new key material 5678");
        assert_eq!(r.previous, old.fingerprint());
        assert_eq!(r.current, new.fingerprint());
        assert_eq!(ring.signing(), &new);
        let t_old = old.tag(Label::ClientProof, &[b"m"]);
        assert!(ring
            .verify(sec + 9 * sec, Label::ClientProof, &[b"m"], &t_old)
            .is_some());
        assert!(ring
            .verify(sec + 10 * sec, Label::ClientProof, &[b"m"], &t_old)
            .is_none());
        // The trailer keys rotate with the key (the keyring was scoped before it rotated).
        let mut sealer = Sealer::new(0).unwrap();
        let mut d_old = [0u8; 1 + TRAILER_LEN];
        sealer.seal(
            &Keyring::fixed(old).for_trailers(scope),
            Kind::Datagram,
            &mut d_old,
            1,
        );
        assert!(trailer::open(&ring, sec + 9 * sec, Kind::Datagram, &d_old).is_ok());
        assert!(trailer::open(&ring, sec + 10 * sec, Kind::Datagram, &d_old).is_err());
        let mut d_new = [0u8; 1 + TRAILER_LEN];
        sealer.seal(&ring, Kind::Datagram, &mut d_new, 1);
        let fixed_new = Keyring::fixed(new.clone()).for_trailers(scope);
        assert!(trailer::open(&fixed_new, 0, Kind::Datagram, &d_new).is_ok());
        // A broken replacement is reported and changes nothing.
        write_key(&p, b"new key but world-readable", 0o644);
        assert!(matches!(
            ring.poll(3 * sec),
            Err(KeyError::Permissions { .. })
        ));
        assert_eq!(ring.signing(), &new);
        assert!(
            matches!(ring.poll(4 * sec), Err(KeyError::Permissions { .. })),
            "every check until fixed"
        );
        // Rewritten with the same key: no rotation.
        write_key(&p, b"new key material 5678\n", 0o600);
        assert_eq!(ring.poll(5 * sec).unwrap(), None);
    }
}
