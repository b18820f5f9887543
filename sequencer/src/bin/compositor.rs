//! `compositor`: merges component streams (local stores) into one composite store. A one-role
//! shorthand of `seqstreamd`: its flags are the keys of a `[[compositor]]` table.

use anyhow::Result;
use clap::Parser;
use seqstream_agent::daemon::{self, DaemonArgs};
use seqstream_sequencer::cli::CompositorArgs;

#[derive(Parser)]
#[command(
    name = "compositor",
    version,
    about = "Merge sequenced streams (local stores) into one composite stream, by arrival or by timestamp"
)]
struct Cli {
    #[command(flatten)]
    role: CompositorArgs,
    #[command(flatten)]
    daemon: DaemonArgs,
}

fn main() -> Result<()> {
    let stop = daemon::stop_flag()?;
    daemon::init_logging();
    let cli = Cli::parse_from(daemon::args_with_config()?);
    daemon::run_one("compositor", &cli.role, &cli.daemon, 256, &stop)
}
