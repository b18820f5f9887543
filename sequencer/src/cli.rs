//! The options of the sequencer and compositor roles ([`SequencerArgs`], [`CompositorArgs`]):
//! the flags of the `sequencer` and `compositor` daemons and the keys of `seqstreamd`'s
//! `[[sequencer]]` and `[[compositor]]` tables, and how each builds its agent. One parser
//! serves both, so a role is configured one way wherever it runs.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use seqstream_agent::daemon::{PlacementArgs, Role, RoleContext};
use seqstream_agent::host::Hosted;
use seqstream_auth::sources::SourceKeyArgs;
use seqstream_store::{FlushPolicy, StoreConfig};

use crate::compositor::{CompositorAgent, CompositorConfig, MergePolicy};
use crate::sequencer::{check_segment_size, Sequencer, SequencerConfig, SourceSpec};

/// The sequencer role: UDP datagrams of allow-listed sources into one gap-free stream.
#[derive(Debug, Clone, clap::Args)]
pub struct SequencerArgs {
    /// The stream's store directory (created if empty).
    #[arg(long)]
    pub store: PathBuf,
    /// Stream id: datagrams must name it.
    #[arg(long)]
    pub stream_id: u32,
    /// UDP address to receive on.
    #[arg(long)]
    pub listen: SocketAddr,
    /// An allowed source, ID@ADDRESS (repeat, or comma-separate).
    #[arg(long = "source", value_delimiter = ',', required = true)]
    pub sources: Vec<SourceSpec>,
    /// SO_RCVBUF, bytes.
    #[arg(long, default_value_t = 8 << 20)]
    pub recv_buffer: usize,
    /// Append a heartbeat frame after this many ms without appending a message (at least 1).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..))]
    pub heartbeat_ms: u64,
    /// Never append heartbeat frames.
    #[arg(long, conflicts_with = "heartbeat_ms")]
    pub no_heartbeat: bool,
    /// Segment size of the store, bytes: a multiple of 4096 from 69632 (68 KiB, whose frames
    /// carry any message a datagram can) to under 4 GiB.
    #[arg(long, default_value_t = 1 << 30, value_parser = parse_segment_size)]
    pub segment_size: u64,
    /// Flush policy: none, frames:N, ms:T.
    #[arg(long, default_value = "none")]
    pub flush: FlushPolicy,
    /// The keys of the sources that sign their datagrams.
    #[command(flatten)]
    pub keys: SourceKeyArgs,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub placement: PlacementArgs,
}

/// Parses a sequencer's segment size (bytes) and checks it ([`check_segment_size`]), so that
/// a command line or a host's file (`seqstreamd --check`) with one the sequencer would refuse
/// is refused as it is read.
pub fn parse_segment_size(s: &str) -> std::result::Result<u64, String> {
    let bytes = s.parse::<u64>().map_err(|e| e.to_string())?;
    check_segment_size(bytes).map_err(|e| e.to_string())?;
    Ok(bytes)
}

impl SequencerArgs {
    /// The sequencer's configuration (the sources' key files read now), checked
    /// ([`SequencerConfig::validate`]).
    pub fn config(&self) -> Result<SequencerConfig> {
        let cfg = SequencerConfig {
            store: self.store.clone(),
            store_config: StoreConfig::new(self.stream_id)
                .segment_size(self.segment_size)
                .flush(self.flush),
            listen: self.listen,
            sources: self.sources.clone(),
            recv_buffer: Some(self.recv_buffer),
            heartbeat: (!self.no_heartbeat).then(|| Duration::from_millis(self.heartbeat_ms)),
            nak_interval: Duration::from_millis(1),
            keys: self.keys.open().context("reading the sources' key files")?,
        };
        cfg.validate()?;
        Ok(cfg)
    }
}

impl Role for SequencerArgs {
    const KIND: &'static str = "sequencer";
    const PLACEMENT_KEYS: &'static [&'static str] = PlacementArgs::KEYS;

    fn build(&self, ctx: RoleContext) -> Result<Vec<Hosted>> {
        let sequencer = Sequencer::open(self.config()?, &ctx.counters).with_context(|| {
            format!(
                "opening the store {} and binding {}",
                self.store.display(),
                self.listen
            )
        })?;
        tracing::info!(stream_id = self.stream_id, listen = %sequencer.local_addr(), store = %self.store.display(), next_seq = sequencer.appender().next_seq(), "sequencing");
        Ok(vec![Hosted {
            agent: Box::new(sequencer),
            placement: self.placement.placement(),
        }])
    }
}

/// The compositor role: component streams (local stores) merged into one composite store.
#[derive(Debug, Clone, clap::Args)]
pub struct CompositorArgs {
    /// A component store directory (repeat, or comma-separate).
    #[arg(long = "component", value_delimiter = ',', required = true)]
    pub components: Vec<PathBuf>,
    /// The composite store directory (created if empty).
    #[arg(long)]
    pub output: PathBuf,
    /// Stream id of the composite stream.
    #[arg(long)]
    pub stream_id: u32,
    /// Merge policy: arrival (lowest latency) or timestamp (deterministic).
    #[arg(long, value_enum, default_value = "arrival")]
    pub policy: MergePolicy,
    /// Segment size of the composite store, bytes.
    #[arg(long, default_value_t = 1 << 30)]
    pub segment_size: u64,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub placement: PlacementArgs,
}

impl Role for CompositorArgs {
    const KIND: &'static str = "compositor";
    const PLACEMENT_KEYS: &'static [&'static str] = PlacementArgs::KEYS;

    fn build(&self, ctx: RoleContext) -> Result<Vec<Hosted>> {
        let cfg = CompositorConfig {
            components: self.components.clone(),
            output: self.output.clone(),
            store_config: StoreConfig::new(self.stream_id).segment_size(self.segment_size),
            policy: self.policy,
        };
        let compositor = CompositorAgent::new(cfg, &ctx.counters)
            .with_context(|| format!("opening the composite {}", self.output.display()))?;
        Ok(vec![Hosted {
            agent: Box::new(compositor),
            placement: self.placement.placement(),
        }])
    }
}
