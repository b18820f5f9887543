//! What the feed handler reads: captures of CME MDP 3.0 or of Nasdaq TotalView-ITCH 5.0
//! over MoldUDP64, loaded whole and checked before anything is published, and the dry-run
//! count of `feedhandler --count`.
//!
//! Captures are read with `seqstream_feeds::capture` (pcap or pcapng, Ethernet with or
//! without VLAN tags); frames that carry no UDP datagram are counted and skipped. Several
//! captures may be given, and a directory stands for its `*.pcap` and `*.pcapng` files in
//! name order.
//!
//! - **MDP3** ([`read_mdp3`]): every UDP payload is an MDP3 packet; the packets of all the
//!   captures are replayed in the order given, through one [`Arbiter`].
//! - **ITCH** ([`read_itch`]): every UDP payload is a MoldUDP64 downstream packet whose
//!   messages each decode as ITCH 5.0. The packets of all the captures are merged by capture
//!   time (ties keep the order given), since the captures of one feed may overlap or arrive
//!   out of order, and one [`SessionTracker`] follows their sequence numbers.

use std::collections::BTreeMap;
use std::path::PathBuf;

use seqstream_feeds::capture::{Capture, CaptureError};
use seqstream_feeds::itch::{self, ItchError};
use seqstream_feeds::mdp3::{self, Arbiter, Arbitration, Mdp3Content};
use seqstream_feeds::moldudp64::{self, MoldError, SessionTracker};

/// Why captures could not be loaded for a replay.
#[derive(Debug, thiserror::Error)]
pub enum FeedError {
    /// A directory named as a capture could not be listed.
    #[error("{path}: cannot list the directory: {source}")]
    Dir {
        /// The directory.
        path: String,
        /// Why it could not be listed.
        #[source]
        source: std::io::Error,
    },
    /// A directory holds no `*.pcap` or `*.pcapng` file.
    #[error("{path}: no .pcap or .pcapng file in the directory")]
    EmptyDir {
        /// The directory.
        path: String,
    },
    /// The capture could not be read, or a frame's headers are malformed.
    #[error(transparent)]
    Capture(#[from] CaptureError),
    /// An MDP3 capture's datagram is no MDP3 packet.
    #[error(transparent)]
    Mdp3(#[from] mdp3::ReadError),
    /// An ITCH capture's datagram is no MoldUDP64 packet.
    #[error("{path}: frame {frame}: {reason}")]
    Mold {
        /// The file.
        path: String,
        /// The frame, 0-based, in the file.
        frame: usize,
        /// Why it is no MoldUDP64 packet.
        #[source]
        reason: MoldError,
    },
    /// Message `index` (0-based, in its MoldUDP64 packet) is no ITCH 5.0 message.
    #[error("{path}: frame {frame}: message {index}: {reason}")]
    Itch {
        /// The file.
        path: String,
        /// The frame, 0-based, in the file.
        frame: usize,
        /// The message, 0-based, in its packet.
        index: usize,
        /// Why it is no ITCH 5.0 message.
        #[source]
        reason: ItchError,
    },
}

/// The capture files `paths` stand for: each file as given, each directory's `*.pcap` and
/// `*.pcapng` files sorted by name.
///
/// Errors: a directory that cannot be listed or holds no capture.
pub fn capture_files(paths: &[PathBuf]) -> Result<Vec<PathBuf>, FeedError> {
    let mut files = Vec::new();
    for path in paths {
        if !path.is_dir() {
            files.push(path.clone());
            continue;
        }
        let dir_error = |source| FeedError::Dir {
            path: path.display().to_string(),
            source,
        };
        let mut found = Vec::new();
        for entry in std::fs::read_dir(path).map_err(dir_error)? {
            let p = entry.map_err(dir_error)?.path();
            if p.is_file()
                && matches!(
                    p.extension().and_then(|e| e.to_str()),
                    Some("pcap" | "pcapng")
                )
            {
                found.push(p);
            }
        }
        if found.is_empty() {
            return Err(FeedError::EmptyDir {
                path: path.display().to_string(),
            });
        }
        found.sort();
        files.extend(found);
    }
    Ok(files)
}

/// The MDP3 packets of `files`, in order, from at most their first `max_frames` frames in
/// all, with the frames read and the frames without UDP skipped.
///
/// Errors: the first capture or packet error.
pub fn read_mdp3(
    files: &[PathBuf],
    max_frames: Option<usize>,
) -> Result<(Vec<mdp3::OwnedPacket>, mdp3::ReadStats), FeedError> {
    let mut packets = Vec::new();
    let mut total = mdp3::ReadStats::default();
    for file in files {
        let left = max_frames.map(|m| m.saturating_sub(total.frames as usize));
        if left == Some(0) {
            break;
        }
        let read = mdp3::read(file, left)?;
        packets.extend(read.packets);
        total.frames += read.stats.frames;
        total.packets += read.stats.packets;
        total.not_udp += read.stats.not_udp;
    }
    Ok((packets, total))
}

/// One MoldUDP64 packet of an ITCH capture, copied out of it.
#[derive(Debug, Clone)]
pub struct ItchPacket {
    /// Capture time, ns since the Unix epoch.
    pub timestamp_ns: u64,
    /// The UDP payload: a MoldUDP64 packet whose messages all decode as ITCH 5.0.
    pub payload: Vec<u8>,
}

impl ItchPacket {
    /// The MoldUDP64 packet. Checked when it was read, so this does not fail.
    pub fn packet(&self) -> Result<moldudp64::Packet<'_>, MoldError> {
        moldudp64::Packet::parse(&self.payload)
    }
}

/// The MoldUDP64 packets of `files`, merged by capture time (ties in the order given), from
/// at most their first `max_frames` frames in all, with the frames read and the frames
/// without UDP skipped.
///
/// Errors: the first capture error, datagram that is no MoldUDP64 packet, or message that
/// is no ITCH 5.0 message.
pub fn read_itch(
    files: &[PathBuf],
    max_frames: Option<usize>,
) -> Result<(Vec<ItchPacket>, u64, u64), FeedError> {
    let (mut packets, mut frames, mut not_udp) = (Vec::new(), 0u64, 0u64);
    'files: for file in files {
        let mut capture = Capture::open(file)?;
        while let Some(record) = capture.next_record() {
            if max_frames.is_some_and(|m| frames >= m as u64) {
                break 'files;
            }
            let record = record?;
            frames += 1;
            let Some(d) = record.datagram() else {
                not_udp += 1;
                continue;
            };
            let path = || file.display().to_string();
            let p = moldudp64::Packet::parse(d.payload).map_err(|reason| FeedError::Mold {
                path: path(),
                frame: record.frame,
                reason,
            })?;
            for (index, (_, m)) in p.messages().enumerate() {
                itch::decode(m).map_err(|reason| FeedError::Itch {
                    path: path(),
                    frame: record.frame,
                    index,
                    reason,
                })?;
            }
            packets.push(ItchPacket {
                timestamp_ns: record.timestamp_ns,
                payload: d.payload.to_vec(),
            });
        }
    }
    packets.sort_by_key(|p| p.timestamp_ns);
    Ok((packets, frames, not_udp))
}

/// What `feedhandler --count` prints: every message of every packet, by type, without
/// arbitration; the sequence checks of the arbitration the replay would do.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Count {
    /// Packets read: MDP3 packets, or MoldUDP64 packets (heartbeats included).
    pub packets: u64,
    /// Messages of those packets: for MDP3 every SBE message, for ITCH every message that
    /// decodes as ITCH 5.0.
    pub messages: u64,
    /// Messages by SBE template id (MDP3) or by ITCH message type letter.
    pub by_type: BTreeMap<String, u64>,
    /// Sequence numbers never seen: MDP3 packets lost on both feeds (`MsgSeqNum`), or
    /// MoldUDP64 messages missing (open gaps and gaps given up at a session change).
    pub gaps: u64,
    /// Copies dropped by arbitration: MDP3 packets, or MoldUDP64 messages.
    pub duplicates: u64,
    /// Capture errors (unreadable files, malformed frames), datagrams that are no MDP3 or
    /// MoldUDP64 packet, and ITCH messages that do not decode.
    pub errors: u64,
    /// What the replay would keep: packets and messages after arbitration.
    pub kept_packets: u64,
    /// Messages after arbitration (ITCH: counted per message).
    pub kept_messages: u64,
    /// Frames without a UDP datagram, skipped.
    pub not_udp: u64,
}

impl Count {
    /// The JSON line: `packets`, `messages`, `by_type`, `gaps`, `duplicates`, `errors`, and
    /// `arbitration` (`packets` and `messages` kept, `not_udp` frames skipped).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "packets": self.packets,
            "messages": self.messages,
            "by_type": self.by_type,
            "gaps": self.gaps,
            "duplicates": self.duplicates,
            "errors": self.errors,
            "arbitration": {
                "packets": self.kept_packets,
                "messages": self.kept_messages,
                "not_udp": self.not_udp,
            },
        })
    }
}

/// Counts the MDP3 captures `files` (in order, through one [`Arbiter`]); bad frames and
/// packets are counted and skipped, an unreadable file counted once.
pub fn count_mdp3(files: &[PathBuf]) -> Count {
    let mut c = Count::default();
    let mut arbiter = Arbiter::default();
    for file in files {
        let mut reader = match mdp3::Reader::open(file) {
            Ok(r) => r,
            Err(_) => {
                c.errors += 1;
                continue;
            }
        };
        while let Some(frame) = reader.next_frame() {
            let Ok(frame) = frame else { continue };
            let Mdp3Content::Packet(p) = frame.content else {
                continue;
            };
            let keep = arbiter.accept(p.msg_seq_num) != Arbitration::Duplicate;
            c.kept_packets += u64::from(keep);
            for m in p.messages() {
                let template = mdp3::template_id(m).map_or(0, u32::from);
                *c.by_type.entry(template.to_string()).or_default() += 1;
                c.messages += 1;
                c.kept_messages += u64::from(keep);
            }
        }
        let s = reader.stats();
        c.packets += s.packets;
        c.errors += s.errors;
        c.not_udp += s.not_udp;
    }
    c.gaps = arbiter.missed;
    c.duplicates = arbiter.duplicates;
    c
}

/// Counts the ITCH captures `files`: their packets merged by capture time as [`read_itch`]
/// does, through one [`SessionTracker`]; bad frames, packets and messages are counted and
/// skipped, an unreadable file counted once.
pub fn count_itch(files: &[PathBuf]) -> Count {
    let mut c = Count::default();
    let mut packets = Vec::new();
    for file in files {
        let mut capture = match Capture::open(file) {
            Ok(r) => r,
            Err(_) => {
                c.errors += 1;
                continue;
            }
        };
        while let Some(record) = capture.next_record() {
            let Ok(record) = record else {
                c.errors += 1;
                continue;
            };
            let Some(d) = record.datagram() else {
                c.not_udp += 1;
                continue;
            };
            packets.push((record.timestamp_ns, d.payload.to_vec()));
        }
    }
    packets.sort_by_key(|(t, _)| *t);
    let mut tracker = SessionTracker::new();
    for (_, bytes) in &packets {
        let Ok(p) = moldudp64::Packet::parse(bytes) else {
            c.errors += 1;
            continue;
        };
        c.packets += 1;
        for (_, m) in p.messages() {
            match itch::decode(m) {
                Ok(msg) => {
                    let t = char::from(msg.msg_type()).to_string();
                    *c.by_type.entry(t).or_default() += 1;
                    c.messages += 1;
                }
                Err(_) => c.errors += 1,
            }
        }
        let v = tracker.accept(&p, |_, _| {});
        c.kept_packets += u64::from(v.new > 0);
        c.kept_messages += u64::from(v.new);
    }
    c.gaps = tracker.missing();
    c.duplicates = tracker.stats().duplicates;
    c
}

/// The ITCH messages a replay of `files` publishes, in order: the packets of [`read_itch`]
/// through one [`SessionTracker`], each message seen for the first time as on the wire (from
/// its message type byte on). What the demo's audit compares the ITCH stream with.
///
/// Errors: those of [`read_itch`].
pub fn itch_messages(
    files: &[PathBuf],
    max_frames: Option<usize>,
) -> Result<Vec<Vec<u8>>, FeedError> {
    let (packets, _, _) = read_itch(files, max_frames)?;
    let mut tracker = SessionTracker::new();
    let mut messages = Vec::new();
    for p in &packets {
        let packet = p.packet().expect("checked by read_itch");
        tracker.accept(&packet, |_, m| messages.push(m.to_vec()));
    }
    Ok(messages)
}
