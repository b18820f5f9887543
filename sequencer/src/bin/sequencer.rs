//! `sequencer`: gives every message from the allow-listed sources one global, gap-free
//! sequence number and a timestamp, and appends it to the stream's store. A one-role
//! shorthand of `seqstreamd`: its flags are the keys of a `[[sequencer]]` table.

use anyhow::Result;
use clap::Parser;
use seqstream_agent::daemon::{self, DaemonArgs};
use seqstream_sequencer::cli::SequencerArgs;

#[derive(Parser)]
#[command(
    name = "sequencer",
    version,
    about = "Sequence UDP datagrams from allow-listed sources into one gap-free stream"
)]
struct Cli {
    #[command(flatten)]
    role: SequencerArgs,
    #[command(flatten)]
    daemon: DaemonArgs,
}

fn main() -> Result<()> {
    let stop = daemon::stop_flag()?;
    daemon::init_logging();
    let cli = Cli::parse_from(daemon::args_with_config()?);
    daemon::run_one("sequencer", &cli.role, &cli.daemon, 64, &stop)
}
