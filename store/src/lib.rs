//! # seqstream-store
//!
//! The memory-mapped, append-only, segmented store that holds one sequenced stream. One
//! [`Appender`] per store (enforced across processes by an `flock` on the directory) writes
//! frames; any number of [`Tailer`]s, in any process, read them through read-only mappings
//! without a system call per frame.
//!
//! ```
//! use seqstream_store::{Appender, StoreConfig, Tailer};
//!
//! let dir = tempfile::tempdir()?;
//! let cfg = StoreConfig::new(7).segment_size(64 << 10);
//! let mut appender = Appender::open_or_create(dir.path(), cfg)?;
//! let (seq, position) = appender.append(b"hello")?;
//! assert_eq!((seq, position), (1, 0));
//!
//! let mut tailer = Tailer::open(dir.path())?;
//! let frame = tailer.poll()?.expect("committed");
//! assert_eq!((frame.seq(), frame.payload()), (1, &b"hello"[..]));
//! assert!(tailer.poll()?.is_none());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The byte layout is in `store/FORMAT.md` and in [`format`](mod@format). Module map:
//!
//! | module | owns |
//! |---|---|
//! | [`format`](mod@format) | byte layouts, frame encode/validate (pure) |
//! | [`crc`] | a frame's CRC32C in three lanes (the crate's value, sooner) |
//! | `mapped` (private) | mapped files and every `unsafe` access to mapped bytes |
//! | [`sigbus`] | the `SIGBUS` handler that lets a mapped file shrink without killing its reader |
//! | [`segment`] | one segment file: prepare, open, activate, seal, shared header words |
//! | [`index`] | the sparse seq/time index of a segment |
//! | [`appender`] | the single writer |
//! | [`tailer`] | readers, seeking |
//! | `recovery` (private; [`RecoveryReport`] is public) | validation, then crash recovery, when an appender opens a store |
//! | [`seal`] | a sealed segment's seal record: synced, then written, so that recovery need not scan it |
//! | `lock` (private) | the `flock` that makes an appender the store's single writer |
//! | [`verify`] | `storetool verify`: every check of a store's files, read-only |
//!
//! An application needs [`Appender`], [`Tailer`] and their types, all at the crate root, and a
//! replication client the appender's replica methods ([`Appender::open_replica`],
//! [`Appender::append_replicated`], …). `format`, `segment`, `index`, `seal`, `layout` and
//! `scan` stay public for `storetool info` and for the tests that craft damaged files; nothing else
//! outside the crate reaches into them.

pub mod appender;
pub mod composite;
pub mod config;
pub mod crc;
pub mod cut;
pub mod digest;
pub mod error;
pub mod format;
pub mod index;
pub mod layout;
mod lock;
mod mapped;
pub mod pattern;
mod prefault;
mod recovery;
pub mod scan;
pub mod seal;
pub mod segment;
pub mod sigbus;
pub mod tailer;
pub mod verify;

pub use appender::{
    check_first_replicated_segment, Appender, AppenderStats, CheckedFrames, Claim, ReceiveArea,
    ReplicatedHeader, SEGMENT_HEADER_PREFIX,
};
pub use config::{FlushPolicy, StoreConfig};
pub use error::{Result, StoreError};
pub use format::FrameFields;
pub use recovery::RecoveryReport;
pub use tailer::{Frame, FrameRange, Tailer, TailerOptions};
