//! Packet captures: classic libpcap and pcapng files, read frame by frame down to the UDP
//! datagrams they carry.
//!
//! # Formats
//!
//! The format is chosen from the file's first four bytes:
//!
//! | first bytes | format | timestamps |
//! | --- | --- | --- |
//! | `a1 b2 c3 d4` / `d4 c3 b2 a1` | libpcap, big / little endian | seconds + microseconds |
//! | `a1 b2 3c 4d` / `4d 3c b2 a1` | libpcap, big / little endian | seconds + nanoseconds |
//! | `0a 0d 0d 0a` | pcapng (byte order from each section header) | per interface `if_tsresol` |
//!
//! libpcap is the format of tcpdump.org's `pcap-savefile(5)`: a 24-byte file header (magic,
//! version, thiszone, sigfigs, snaplen, link type) then per frame a 16-byte record header
//! (seconds, fraction, captured length, original length) and the captured bytes. pcapng is the
//! IETF draft "PCAP Next Generation (pcapng) Capture File Format": sections, each opened by a
//! section header block that sets its byte order, holding interface description blocks (link
//! type and the `if_tsresol` and `if_tsoffset` options) and packet blocks. Enhanced, simple
//! and the obsolete packet blocks are frames; every other block is skipped. The
//! [`pcap-file`](https://docs.rs/pcap-file/2) crate parses the records and blocks; this
//! module frames them, converts timestamps and reports problems with the file name, frame
//! number and byte offset.
//!
//! # Link layers
//!
//! Frames are decoded with [`etherparse`](https://docs.rs/etherparse/0.17): Ethernet
//! (link type 1) with one 802.1Q tag or two (QinQ: an outer 0x88a8 or 0x9100 tag), raw IP
//! (101, 228) and Linux cooked capture v1 (113). IPv4 checksums are not verified (NICs
//! offload them; captures often hold zeros). A frame that is not IPv4/UDP is a [`Record`]
//! with a [`NotUdp`] reason, not an error; a frame that claims more bytes than were captured
//! (cut by the snaplen) is a [`FrameError`].

use std::fmt;
use std::fs::File;
use std::io::{self, Read};
use std::net::SocketAddrV4;
use std::path::Path;

use etherparse::{
    ether_type, ip_number, EtherType, LaxNetSlice, LaxSlicedPacket, LinuxSllProtocolType,
    LinuxSllSlice, UdpHeaderSlice,
};
use pcap_file::pcap::{PcapHeader, PcapParser};
use pcap_file::pcapng::blocks::interface_description::InterfaceDescriptionOption;
use pcap_file::pcapng::{Block, PcapNgParser};
use pcap_file::{Endianness, PcapError, TsResolution};

/// The largest record or block accepted, in bytes (64 MiB). A length field above it is a
/// format error rather than an allocation.
pub const MAX_RECORD_LEN: usize = 64 << 20;

/// Bytes read from the source at a time.
const READ_CHUNK: u64 = 256 << 10;

/// pcapng block type of the section header block.
const SECTION_HEADER_BLOCK: u32 = 0x0A0D_0D0A;

/// Why a capture could not be read, or one of its frames could not be decoded.
///
/// `path` is the file name (or the name given to [`Capture::from_reader`]), `frame` the
/// 0-based index of the frame being read (for a problem between frames, the index the next
/// frame would have), `offset` the byte offset in the file of the record or block at fault.
/// [`BadFrame`](Self::BadFrame) and [`LinkType`](Self::LinkType) concern one frame and the
/// reader goes on with the next; after any other error it yields nothing more.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    /// The file could not be opened.
    #[error("{path}: cannot open: {source}")]
    Open {
        /// The file.
        path: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// Reading the source failed (an I/O error, not a format problem).
    #[error("{path}: read error at byte {offset}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Byte offset of the failed read in the file.
        offset: u64,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The source holds fewer than the 4 bytes that name a format.
    #[error("{path}: {len} bytes: too short to be a pcap or pcapng file")]
    TooShort {
        /// The file.
        path: String,
        /// Its length, bytes.
        len: usize,
    },
    /// The first 4 bytes (read big-endian into `magic`) are no pcap or pcapng magic.
    #[error(
        "{path}: not a pcap or pcapng file: magic 0x{magic:08x} \
         (pcap starts a1b2c3d4 or a1b23c4d in either byte order, pcapng 0a0d0d0a)"
    )]
    UnknownFormat {
        /// The file.
        path: String,
        /// Its first 4 bytes, read big-endian.
        magic: u32,
    },
    /// The file ends inside a header or a record: `needed` bytes were announced or required
    /// from `offset` on, `remaining` were left.
    #[error(
        "{path}: frame {frame}: truncated file: {cut} {needed} bytes, {remaining} remain \
         (from byte {offset})"
    )]
    Truncated {
        /// The file.
        path: String,
        /// The frame being read, 0-based.
        frame: usize,
        /// Byte offset of the cut header or record in the file.
        offset: u64,
        /// What the cut went through.
        cut: Cut,
        /// Bytes announced or required from `offset` on.
        needed: u64,
        /// Bytes left in the file from `offset` on.
        remaining: usize,
    },
    /// A header, record or block is malformed (`reason` says which field).
    #[error("{path}: frame {frame}: malformed capture at byte {offset}: {reason}")]
    Format {
        /// The file.
        path: String,
        /// The frame being read, 0-based.
        frame: usize,
        /// Byte offset of the malformed header, record or block.
        offset: u64,
        /// Which field is wrong, and how.
        reason: String,
    },
    /// The frame's interface has a link type this module does not decode.
    #[error(
        "{path}: frame {frame}: link type {linktype} is not supported \
         (Ethernet 1, raw IP 101 or 228, Linux cooked 113 are)"
    )]
    LinkType {
        /// The file.
        path: String,
        /// The frame, 0-based.
        frame: usize,
        /// The interface's link type (a LINKTYPE_ value).
        linktype: u32,
    },
    /// The frame's link, IPv4 or UDP headers are malformed or cut short.
    #[error("{path}: frame {frame}: {reason}")]
    BadFrame {
        /// The file.
        path: String,
        /// The frame, 0-based.
        frame: usize,
        /// What is wrong with its headers.
        #[source]
        reason: FrameError,
    },
}

/// Which part of a file a [`CaptureError::Truncated`] cut through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cut {
    /// The libpcap file header (24 bytes) or the first pcapng block's header (12 bytes).
    FileHeader,
    /// A libpcap record header (16 bytes) or a pcapng block header (8 bytes, 12 for a
    /// section header).
    RecordHeader,
    /// The bytes a record or block header announced.
    Record,
}

impl fmt::Display for Cut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Cut::FileHeader => "the file header needs",
            Cut::RecordHeader => "a record header needs",
            Cut::Record => "the record header says",
        })
    }
}

/// Why a frame's headers could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// A link-layer, VLAN or IP header is malformed or cut short (`reason` is etherparse's
    /// message).
    #[error("bad {layer} header: {reason}")]
    Header {
        /// The layer (`link`, `VLAN`, `IPv4`, …).
        layer: &'static str,
        /// etherparse's message.
        reason: String,
    },
    /// The IPv4 total length (`total_len`) is smaller than the IPv4 header (`header_len`).
    #[error("IPv4 total length {total_len} is smaller than its {header_len}-byte header")]
    Ipv4TooShort {
        /// The IPv4 total length field, bytes.
        total_len: u16,
        /// The IPv4 header's length, bytes.
        header_len: usize,
    },
    /// The IPv4 total length says `total_len` bytes; only `captured` bytes from the IPv4
    /// header on are in the capture (the frame was cut, usually by the snaplen).
    #[error("frame cut short: the IPv4 total length is {total_len} bytes, {captured} captured")]
    Ipv4Cut {
        /// The IPv4 total length field, bytes.
        total_len: u16,
        /// Bytes captured from the IPv4 header on.
        captured: usize,
    },
    /// Fewer than the 8 bytes of a UDP header follow the IPv4 header.
    #[error("UDP header cut short: {available} bytes after the IPv4 header")]
    UdpHeaderCut {
        /// Bytes after the IPv4 header.
        available: usize,
    },
    /// The UDP length field is below the 8 bytes of its own header.
    #[error("UDP length {udp_len} is smaller than the 8-byte UDP header")]
    UdpTooShort {
        /// The UDP length field, bytes.
        udp_len: u16,
    },
    /// The UDP length says `udp_len` bytes; the IPv4 payload holds `available`.
    #[error(
        "frame cut short: the UDP length is {udp_len} bytes, the IPv4 payload has {available}"
    )]
    UdpCut {
        /// The UDP length field, bytes.
        udp_len: u16,
        /// Bytes of the IPv4 payload.
        available: usize,
    },
}

/// The link-layer header types (tcpdump.org `LINKTYPE_*` values) this module decodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkType {
    /// `LINKTYPE_ETHERNET` (1): Ethernet II, optionally 802.1Q or QinQ tagged.
    Ethernet,
    /// `LINKTYPE_RAW` (101) and `LINKTYPE_IPV4` (228): the frame starts with the IP header.
    RawIp,
    /// `LINKTYPE_LINUX_SLL` (113): the 16-byte Linux cooked capture v1 header.
    LinuxSll,
}

impl LinkType {
    /// The link type of a `LINKTYPE_*` code, `None` for one not decoded here.
    pub fn from_code(code: u32) -> Option<LinkType> {
        match code {
            1 => Some(LinkType::Ethernet),
            101 | 228 => Some(LinkType::RawIp),
            113 => Some(LinkType::LinuxSll),
            _ => None,
        }
    }
}

/// Why a frame carries no IPv4/UDP datagram. Not an error: callers count these.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotUdp {
    /// An ARP packet.
    Arp,
    /// An IPv6 packet (not decoded further).
    Ipv6,
    /// An IPv4 TCP segment.
    Tcp,
    /// An IPv4 fragment (any part of a fragmented datagram; not reassembled).
    Fragment,
    /// An IPv4 packet of another protocol (the IP protocol number).
    OtherIpProtocol(u8),
    /// An Ethernet or Linux cooked frame of another EtherType (or an 802.3 length), or with
    /// more than two VLAN tags (the EtherType after the second tag).
    OtherEtherType(u16),
    /// A Linux cooked frame whose protocol field is not an EtherType (the ARPHRD-dependent
    /// protocol value).
    OtherSllProtocol(u16),
}

/// An IPv4/UDP datagram of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Datagram<'a> {
    /// IPv4 source address and UDP source port.
    pub src: SocketAddrV4,
    /// IPv4 destination address and UDP destination port.
    pub dst: SocketAddrV4,
    /// The UDP payload: exactly the UDP length minus the 8-byte header (Ethernet padding
    /// and trailers excluded).
    pub payload: &'a [u8],
}

/// What a frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Content<'a> {
    /// An IPv4/UDP datagram.
    Udp(Datagram<'a>),
    /// Something else, and what.
    NotUdp(NotUdp),
}

/// One frame of a capture. Borrows the reader's buffer until the next call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record<'a> {
    /// 0-based index of the frame among the file's frames (packet records or blocks).
    pub frame: usize,
    /// Capture time in nanoseconds since the Unix epoch (UTC). Exact for µs and ns
    /// resolutions; finer pcapng resolutions are truncated to the nanosecond. 0 for a
    /// pcapng simple packet block, which has no timestamp.
    pub timestamp_ns: u64,
    /// The frame's length on the wire; larger than `data.len()` when the capture cut it.
    pub wire_len: u32,
    /// The captured bytes, from the link-layer header on.
    pub data: &'a [u8],
    /// The frame's IPv4/UDP datagram, or why there is none.
    pub content: Content<'a>,
}

impl<'a> Record<'a> {
    /// The frame's datagram, if it carries one.
    pub fn datagram(&self) -> Option<&Datagram<'a>> {
        match &self.content {
            Content::Udp(d) => Some(d),
            Content::NotUdp(_) => None,
        }
    }
}

/// The file format of a capture, from its magic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Classic libpcap.
    Pcap {
        /// Nanosecond (magic a1b23c4d) rather than microsecond timestamps.
        nanos: bool,
        /// Big-endian headers.
        big_endian: bool,
        /// The file header's link type.
        linktype: u32,
    },
    /// pcapng (byte order and link types vary per section and interface).
    PcapNg,
}

/// How to turn a pcapng interface's timestamps into nanoseconds since the epoch.
#[derive(Debug, Clone, Copy)]
struct Interface {
    linktype: u32,
    /// Timestamp units per second: `10^n` or `2^n` from `if_tsresol` (default 10^6).
    units_per_s: u128,
    /// `if_tsoffset`: seconds added to every timestamp.
    offset_s: i64,
}

enum Parser {
    Pcap(PcapParser),
    PcapNg {
        parser: PcapNgParser,
        interfaces: Vec<Interface>,
    },
}

/// The bytes of a capture: a buffer over the source, and where reading stands in the file.
struct Source<R> {
    name: String,
    reader: R,
    /// Bytes read and not yet consumed start at `buf[start]`.
    buf: Vec<u8>,
    start: usize,
    /// File offset of `buf[start]`.
    offset: u64,
    eof: bool,
    /// Index of the next frame.
    frame: usize,
}

/// A capture being read, frame by frame, from any [`Read`] source.
///
/// Records borrow the reader's buffer, so frames are read with [`Capture::next_record`]
/// (a lending iterator) without a copy or an allocation per frame.
///
/// ```no_run
/// # fn main() -> Result<(), seqstream_feeds::capture::CaptureError> {
/// let mut capture = seqstream_feeds::capture::Capture::open("feed.pcap")?;
/// while let Some(record) = capture.next_record() {
///     let record = record?;
///     if let Some(datagram) = record.datagram() {
///         println!("{} {} -> {}", record.timestamp_ns, datagram.src, datagram.dst);
///     }
/// }
/// # Ok(()) }
/// ```
pub struct Capture<R> {
    src: Source<R>,
    parser: Parser,
    format: Format,
    done: bool,
}

impl Capture<File> {
    /// Opens the capture at `path` and reads its file header.
    pub fn open(path: impl AsRef<Path>) -> Result<Capture<File>, CaptureError> {
        let path = path.as_ref();
        let name = path.display().to_string();
        match File::open(path) {
            Ok(file) => Capture::from_reader(file, &name),
            Err(source) => Err(CaptureError::Open { path: name, source }),
        }
    }
}

impl<R: Read> Capture<R> {
    /// Reads the file header of the capture in `reader`; `name` names it in errors.
    pub fn from_reader(reader: R, name: &str) -> Result<Capture<R>, CaptureError> {
        let mut src = Source {
            name: name.to_owned(),
            reader,
            buf: Vec::new(),
            start: 0,
            offset: 0,
            eof: false,
            frame: 0,
        };
        let (parser, format) = src.file_header()?;
        Ok(Capture {
            src,
            parser,
            format,
            done: false,
        })
    }

    /// The file's format.
    pub fn format(&self) -> Format {
        self.format
    }

    /// The name errors give the capture.
    pub fn name(&self) -> &str {
        &self.src.name
    }

    /// The next frame, `None` at the end of the file or after an error that stops reading.
    pub fn next_record(&mut self) -> Option<Result<Record<'_>, CaptureError>> {
        if self.done {
            return None;
        }
        let raw = match self.next_frame() {
            Ok(Some(raw)) => raw,
            Ok(None) => {
                self.done = true;
                return None;
            }
            Err(e) => {
                self.done = true;
                return Some(Err(e));
            }
        };
        let frame = self.src.frame;
        self.src.frame += 1;
        let Some(link) = LinkType::from_code(raw.linktype) else {
            return Some(Err(CaptureError::LinkType {
                path: self.src.name.clone(),
                frame,
                linktype: raw.linktype,
            }));
        };
        let data = &self.src.buf[raw.data.0..raw.data.1];
        Some(match decode_frame(link, data) {
            Ok(content) => Ok(Record {
                frame,
                timestamp_ns: raw.timestamp_ns,
                wire_len: raw.wire_len,
                data,
                content,
            }),
            Err(reason) => Err(CaptureError::BadFrame {
                path: self.src.name.clone(),
                frame,
                reason,
            }),
        })
    }

    /// Reads up to the next frame, skipping pcapng blocks that are not packets.
    fn next_frame(&mut self) -> Result<Option<RawFrame>, CaptureError> {
        loop {
            self.src.fill(1)?;
            if self.src.available() == 0 {
                return Ok(None);
            }
            let frame = match &mut self.parser {
                Parser::Pcap(parser) => Some(self.src.pcap_record(parser)?),
                Parser::PcapNg { parser, interfaces } => {
                    self.src.pcapng_block(parser, interfaces)?
                }
            };
            if frame.is_some() {
                return Ok(frame);
            }
        }
    }
}

impl<R: Read> Source<R> {
    fn file_header(&mut self) -> Result<(Parser, Format), CaptureError> {
        self.fill(4)?;
        let avail = self.available();
        if avail < 4 {
            return Err(CaptureError::TooShort {
                path: self.name.clone(),
                len: avail,
            });
        }
        let magic = be32(&self.buf[self.start..]);
        match magic {
            0xA1B2_C3D4 | 0xD4C3_B2A1 | 0xA1B2_3C4D | 0x4D3C_B2A1 => {
                self.require(24, Cut::FileHeader)?;
                let slice = &self.buf[self.start..self.start + 24];
                let (_, parser) = PcapParser::new(slice).map_err(|e| self.format_error(e))?;
                let header: PcapHeader = parser.header();
                let format = Format::Pcap {
                    nanos: header.ts_resolution == TsResolution::NanoSecond,
                    big_endian: header.endianness == Endianness::Big,
                    linktype: header.datalink.into(),
                };
                self.consume(24);
                Ok((Parser::Pcap(parser), format))
            }
            SECTION_HEADER_BLOCK => {
                let len = self.block_len(None, Cut::FileHeader)?;
                let slice = &self.buf[self.start..self.start + len];
                let (_, parser) = PcapNgParser::new(slice).map_err(|e| self.format_error(e))?;
                self.consume(len);
                let parser = Parser::PcapNg {
                    parser,
                    interfaces: Vec::new(),
                };
                Ok((parser, Format::PcapNg))
            }
            _ => Err(CaptureError::UnknownFormat {
                path: self.name.clone(),
                magic,
            }),
        }
    }

    fn pcap_record(&mut self, parser: &PcapParser) -> Result<RawFrame, CaptureError> {
        let header = parser.header();
        self.require(16, Cut::RecordHeader)?;
        let field = &self.buf[self.start + 8..];
        let incl_len = match header.endianness {
            Endianness::Big => be32(field),
            Endianness::Little => le32(field),
        };
        let len = self.check_len(16 + u64::from(incl_len))?;
        self.require(len, Cut::Record)?;
        let slice = &self.buf[self.start..self.start + len];
        let raw = match parser.next_raw_packet(slice) {
            Ok((_, raw)) => raw,
            Err(e) => return Err(self.format_error(e)),
        };
        let (frac_per_s, ns_per_frac) = match header.ts_resolution {
            TsResolution::MicroSecond => (1_000_000, 1_000),
            TsResolution::NanoSecond => (1_000_000_000, 1),
        };
        if raw.ts_frac >= frac_per_s {
            return Err(self.format_error(format!(
                "timestamp fraction {} is not below {frac_per_s}",
                raw.ts_frac
            )));
        }
        let frame = RawFrame {
            linktype: header.datalink.into(),
            timestamp_ns: u64::from(raw.ts_sec) * 1_000_000_000
                + u64::from(raw.ts_frac) * ns_per_frac,
            wire_len: raw.orig_len,
            data: (self.start + 16, self.start + len),
        };
        self.consume(len);
        Ok(frame)
    }

    fn pcapng_block(
        &mut self,
        parser: &mut PcapNgParser,
        interfaces: &mut Vec<Interface>,
    ) -> Result<Option<RawFrame>, CaptureError> {
        let len = self.block_len(Some(parser), Cut::RecordHeader)?;
        let slice = &self.buf[self.start..self.start + len];
        let block = match parser.next_block(slice) {
            Ok((_, block)) => block,
            Err(e) => return Err(self.format_error(e)),
        };
        let at = |data: &[u8]| {
            let from = self.start + (data.as_ptr() as usize - slice.as_ptr() as usize);
            (from, from + data.len())
        };
        let (interface_id, units, wire_len, data) = match block {
            Block::SectionHeader(_) => {
                interfaces.clear();
                self.consume(len);
                return Ok(None);
            }
            Block::InterfaceDescription(idb) => {
                let iface = interface(idb.linktype.into(), &idb.options)
                    .map_err(|reason| self.format_error(reason))?;
                interfaces.push(iface);
                self.consume(len);
                return Ok(None);
            }
            Block::EnhancedPacket(epb) => {
                // pcap-file reads the 64-bit timestamp as nanoseconds whatever the
                // interface's if_tsresol; as_nanos gives back the raw units, exactly.
                let units = u64::try_from(epb.timestamp.as_nanos()).unwrap_or(u64::MAX);
                (
                    epb.interface_id,
                    Some(units),
                    epb.original_len,
                    at(&epb.data),
                )
            }
            Block::Packet(pb) => (
                u32::from(pb.interface_id),
                Some(pb.timestamp),
                pb.original_len,
                at(&pb.data),
            ),
            Block::SimplePacket(spb) => {
                let captured = spb.data.len().min(spb.original_len as usize);
                (0, None, spb.original_len, at(&spb.data[..captured]))
            }
            _ => {
                self.consume(len);
                return Ok(None);
            }
        };
        let Some(iface) = interfaces.get(interface_id as usize).copied() else {
            let known = interfaces.len();
            return Err(self.format_error(format!(
                "packet of interface {interface_id}, the section describes {known}"
            )));
        };
        let timestamp_ns = match units {
            None => 0,
            Some(units) => iface.to_ns(units).ok_or_else(|| {
                self.format_error(format!(
                    "timestamp of {units} units ({} per second, offset {} s) is not \
                     between the Unix epoch and the year 2554",
                    iface.units_per_s, iface.offset_s
                ))
            })?,
        };
        self.consume(len);
        Ok(Some(RawFrame {
            linktype: iface.linktype,
            timestamp_ns,
            wire_len,
            data,
        }))
    }

    /// The total length of the pcapng block at `start`, read into the buffer whole.
    /// `parser` gives the section's byte order (`None` before the first section).
    fn block_len(
        &mut self,
        parser: Option<&PcapNgParser>,
        cut: Cut,
    ) -> Result<usize, CaptureError> {
        self.require(8, cut)?;
        let big_endian = if be32(&self.buf[self.start..]) == SECTION_HEADER_BLOCK {
            self.require(12, cut)?;
            match be32(&self.buf[self.start + 8..]) {
                0x1A2B_3C4D => true,
                0x4D3C_2B1A => false,
                magic => {
                    return Err(self.format_error(format!(
                        "section header byte-order magic 0x{magic:08x} is neither 1a2b3c4d \
                         nor 4d3c2b1a"
                    )))
                }
            }
        } else {
            parser.is_some_and(|p| p.section().endianness == Endianness::Big)
        };
        let field = &self.buf[self.start + 4..];
        let len = if big_endian { be32(field) } else { le32(field) };
        if len < 12 || len % 4 != 0 {
            return Err(self.format_error(format!(
                "block total length {len} is not a multiple of 4 of at least 12"
            )));
        }
        let len = self.check_len(u64::from(len))?;
        self.require(len, Cut::Record)?;
        Ok(len)
    }

    fn check_len(&self, len: u64) -> Result<usize, CaptureError> {
        match usize::try_from(len) {
            Ok(len) if len <= MAX_RECORD_LEN => Ok(len),
            _ => Err(self.format_error(format!(
                "a record of {len} bytes is over the {MAX_RECORD_LEN}-byte limit"
            ))),
        }
    }

    /// Fills the buffer until `n` bytes are available, or an error names the cut.
    fn require(&mut self, n: usize, cut: Cut) -> Result<(), CaptureError> {
        self.fill(n)?;
        let remaining = self.available();
        if remaining < n {
            return Err(CaptureError::Truncated {
                path: self.name.clone(),
                frame: self.frame,
                offset: self.offset,
                cut,
                needed: n as u64,
                remaining,
            });
        }
        Ok(())
    }

    /// Reads until `n` bytes are available or the source ends.
    fn fill(&mut self, n: usize) -> Result<(), CaptureError> {
        while self.available() < n && !self.eof {
            if self.start > 0 {
                self.buf.drain(..self.start);
                self.start = 0;
            }
            let want = ((n - self.buf.len()) as u64).max(READ_CHUNK);
            match (&mut self.reader).take(want).read_to_end(&mut self.buf) {
                Ok(0) => self.eof = true,
                Ok(_) => {}
                Err(source) => {
                    return Err(CaptureError::Read {
                        path: self.name.clone(),
                        offset: self.offset + self.buf.len() as u64,
                        source,
                    })
                }
            }
        }
        Ok(())
    }

    fn available(&self) -> usize {
        self.buf.len() - self.start
    }

    fn consume(&mut self, n: usize) {
        self.start += n;
        self.offset += n as u64;
    }

    fn format_error(&self, reason: impl Into<Reason>) -> CaptureError {
        CaptureError::Format {
            path: self.name.clone(),
            frame: self.frame,
            offset: self.offset,
            reason: reason.into().0,
        }
    }
}

/// A format error's reason, from `pcap-file` or from this module.
struct Reason(String);

impl From<PcapError> for Reason {
    fn from(e: PcapError) -> Reason {
        Reason(pcap_reason(e))
    }
}

impl From<String> for Reason {
    fn from(s: String) -> Reason {
        Reason(s)
    }
}

fn pcap_reason(e: PcapError) -> String {
    match e {
        PcapError::InvalidField(field) => field.to_owned(),
        PcapError::IncompleteBuffer => "a length field points past its record".to_owned(),
        other => other.to_string(),
    }
}

/// A frame located in the buffer, before link-layer decoding.
struct RawFrame {
    linktype: u32,
    timestamp_ns: u64,
    wire_len: u32,
    /// `buf` range of the captured bytes.
    data: (usize, usize),
}

impl Interface {
    fn to_ns(self, units: u64) -> Option<u64> {
        let ns = u128::from(units) * 1_000_000_000 / self.units_per_s;
        let ns = i128::try_from(ns).ok()? + i128::from(self.offset_s) * 1_000_000_000;
        u64::try_from(ns).ok()
    }
}

/// The interface of an interface description block, or why its options are unusable.
fn interface(
    linktype: u32,
    options: &[InterfaceDescriptionOption<'_>],
) -> Result<Interface, String> {
    let mut iface = Interface {
        linktype,
        units_per_s: 1_000_000,
        offset_s: 0,
    };
    for option in options {
        match option {
            InterfaceDescriptionOption::IfTsResol(resol) => {
                let exp = u32::from(resol & 0x7f);
                let units = if resol & 0x80 == 0 {
                    10u128.checked_pow(exp)
                } else {
                    1u128.checked_shl(exp)
                };
                iface.units_per_s = units.ok_or_else(|| {
                    format!("if_tsresol 0x{resol:02x} is finer than this reader supports")
                })?;
            }
            InterfaceDescriptionOption::IfTsOffset(offset) => {
                iface.offset_s = i64::from_ne_bytes(offset.to_ne_bytes());
            }
            _ => {}
        }
    }
    Ok(iface)
}

/// Decodes a captured frame of link type `link` down to its IPv4/UDP datagram.
pub fn decode_frame(link: LinkType, frame: &[u8]) -> Result<Content<'_>, FrameError> {
    let packet = match link {
        LinkType::Ethernet => {
            LaxSlicedPacket::from_ethernet(frame).map_err(|e| header_error("Ethernet", e))?
        }
        LinkType::RawIp => LaxSlicedPacket::from_ip(frame).map_err(|e| header_error("IP", e))?,
        LinkType::LinuxSll => {
            let sll = LinuxSllSlice::from_slice(frame)
                .map_err(|e| header_error("Linux cooked capture", e))?;
            match sll.protocol_type() {
                LinuxSllProtocolType::EtherType(et) => {
                    LaxSlicedPacket::from_ether_type(et, sll.payload_slice())
                }
                _ => {
                    let head = sll.header_slice();
                    let protocol = u16::from_be_bytes([head[14], head[15]]);
                    return Ok(Content::NotUdp(NotUdp::OtherSllProtocol(protocol)));
                }
            }
        }
    };
    classify(&packet)
}

fn classify<'a>(packet: &LaxSlicedPacket<'a>) -> Result<Content<'a>, FrameError> {
    match &packet.net {
        Some(LaxNetSlice::Ipv4(ip)) => {
            let header = ip.header();
            let header_len = header.slice().len();
            if usize::from(header.total_len()) < header_len {
                return Err(FrameError::Ipv4TooShort {
                    total_len: header.total_len(),
                    header_len,
                });
            }
            let payload = ip.payload();
            if payload.incomplete {
                let exts = ip.extensions().auth.map_or(0, |a| a.slice().len());
                return Err(FrameError::Ipv4Cut {
                    total_len: header.total_len(),
                    captured: header_len + exts + payload.payload.len(),
                });
            }
            if payload.fragmented {
                return Ok(Content::NotUdp(NotUdp::Fragment));
            }
            match payload.ip_number {
                ip_number::UDP => {}
                ip_number::TCP => return Ok(Content::NotUdp(NotUdp::Tcp)),
                other => return Ok(Content::NotUdp(NotUdp::OtherIpProtocol(other.0))),
            }
            let bytes = payload.payload;
            let udp = UdpHeaderSlice::from_slice(bytes).map_err(|_| FrameError::UdpHeaderCut {
                available: bytes.len(),
            })?;
            let udp_len = udp.length();
            if udp_len < 8 {
                return Err(FrameError::UdpTooShort { udp_len });
            }
            let Some(payload) = bytes.get(8..usize::from(udp_len)) else {
                return Err(FrameError::UdpCut {
                    udp_len,
                    available: bytes.len(),
                });
            };
            Ok(Content::Udp(Datagram {
                src: SocketAddrV4::new(header.source_addr(), udp.source_port()),
                dst: SocketAddrV4::new(header.destination_addr(), udp.destination_port()),
                payload,
            }))
        }
        Some(LaxNetSlice::Ipv6(_)) => Ok(Content::NotUdp(NotUdp::Ipv6)),
        Some(LaxNetSlice::Arp(_)) => Ok(Content::NotUdp(NotUdp::Arp)),
        None => {
            let ether_type = packet.ether_payload().map(|p| p.ether_type);
            if let Some((err, layer)) = &packet.stop_err {
                if ether_type != Some(ether_type::ARP) {
                    return Err(FrameError::Header {
                        layer: layer_name(*layer),
                        reason: err.to_string(),
                    });
                }
            }
            Ok(Content::NotUdp(match ether_type {
                Some(ether_type::ARP) => NotUdp::Arp,
                Some(ether_type::IPV6) => NotUdp::Ipv6,
                Some(EtherType(other)) => NotUdp::OtherEtherType(other),
                None => NotUdp::OtherEtherType(0),
            }))
        }
    }
}

fn header_error(layer: &'static str, e: impl fmt::Display) -> FrameError {
    FrameError::Header {
        layer,
        reason: e.to_string(),
    }
}

fn layer_name(layer: etherparse::err::Layer) -> &'static str {
    use etherparse::err::Layer;
    match layer {
        Layer::VlanHeader => "VLAN",
        Layer::Ipv4Header | Layer::IpHeader => "IPv4",
        Layer::Arp => "ARP",
        _ => "IP",
    }
}

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

fn le32(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}
